"""The floor every other package stands on, importing nothing of the package above it: user
errors (`errors`), run folders and remote storage (`paths`, `storage`, `input_files`), the
device mesh and multi-process start-up (`sharding`, `distributed`), the backends and
accelerators (`platforms`, `hardware`, `compat`), and small shared definitions (`aliases`,
`image_constants`, `printable`)."""
