r"""Writes a trained model in another framework's or a serving format.

    python -m vit_jax.export --checkpoint=PATH --format=FMT --out=DIR [--model=NAME]
        [--labels=imagenet2012|FILE] [--resolution=R]

PATH: anything `vit_jax.predict` reads (official `.npz`, a training run, a Hugging Face
or timm checkpoint, `hf-hub:<org>/<name>`, an official name). FMT:
  hf           `ViTForImageClassification` directory (config.json with id2label,
               model.safetensors, preprocessor_config.json): `from_pretrained(DIR)`.
  timm         timm's own folder (model.safetensors, config.json with the pretrained_cfg
               of the real input size, crop and interpolation): create_model('local-dir:DIR');
               timm_model.json (create_model's name and arguments) beside it.
  saved_model  TensorFlow SavedModel through jax2tf, batch dimension polymorphic.
  stablehlo    `jax.export` artifact model.jax_exported (parameters inside).
  npz          official-layout model.npz: e.g. a Hugging Face checkpoint in, then usable
               as `config.pretrained` for fine-tuning.
  big_vision   big_vision's layout, model.npz (``params/img/...``, ``params/txt/...``,
               ``params/t``, ``params/b``, per layer) and an image-text model's
               SentencePiece model.model: big_vision's two_towers.load (or vit.load).
Every format but hf also gets labels.txt (one class name per line). The files are
written into a new folder beside DIR (`.DIR.tmp-*`) that is renamed to DIR at the end: a
failure, Ctrl-C or SIGTERM leaves nothing in DIR and removes that folder; one left by a
killed export (older than an hour) is removed by the next export to the same DIR. DIR must
not exist or be empty. The files get the modes of any file the user writes (umask). PATH
and DIR may be on a bucket (gs://, no TensorFlow needed but for saved_model): the files are
written locally, then uploaded one object each, the weights last; a failure deletes what
was uploaded. On success the command prints the files written and how to load them. No
torch is needed (safetensors' numpy API).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional, Sequence

from absl import flags

from vit_jax import cli
from vit_jax.data import folder_tokenizer
from vit_jax.infra import storage
from vit_jax.weights import exports, formats, npz, remote, sources, writers

FORMATS, LABELS_FILE, NPZ_FILE = exports.NAMES, formats.LABELS_FILE, npz.EXPORT_FILE
STALE_SECONDS = writers.STALE_SECONDS  # a temporary folder this old was left by a killed export


def export(
  checkpoint_path: str,
  fmt: str,
  out: str,
  *,
  model_name: Optional[str] = None,
  labels: Optional[str] = None,
  resolution: Optional[int] = None,
) -> str:
  """Writes the model at ``checkpoint_path`` as ``fmt`` into the new folder ``out``;
  returns the summary (`export_model`)."""
  writers.check_out(out)
  return export_model(
    sources.load(checkpoint_path, model_name), fmt, out, labels=labels, resolution=resolution
  )


def _files(out: str) -> list[tuple[str, int]]:
  """(path relative to ``out``, size) of each file written, sorted."""
  if storage.is_remote(out):
    return remote.files(out)
  return sorted(
    (os.path.relpath(os.path.join(root, name), out), os.path.getsize(os.path.join(root, name)))
    for root, _, names in os.walk(out)
    for name in names
  )


def _summary(fmt: str, source: str, out: str) -> str:
  """What was written, and how to load it."""
  lines = [f"Wrote the {fmt} export of {source} to {out}:"]
  written = _files(out)
  lines.extend(f"  {name}  ({size:,} bytes)" for name, size in written)
  record = exports.by_name(fmt)
  hint = record.hint
  if record.two_tower_hint and any(name == folder_tokenizer.CONFIG for name, _ in written):
    hint = record.two_tower_hint  # an image-text model written whole (SigLIP, CLIP)
  lines.append("Load it with: " + hint.format(out=out))
  if storage.is_remote(out) and record.local_files:
    lines.append(f"(these read local files: copy it first, gcloud storage cp -r {out} .)")
  return "\n".join(lines)


def export_model(
  model: sources.LoadedModel,
  fmt: str,
  out: str,
  *,
  labels: Optional[str] = None,
  resolution: Optional[int] = None,
) -> str:
  """Writes a loaded model as ``fmt`` into the new folder ``out`` (`writers.save`: all or
  nothing); returns the summary (the files written, how to load them)."""
  writers.check_out(out)
  names = model.class_names_for(labels, argument="--labels")
  size = model.image_size_for(resolution, argument="--resolution")
  out = writers.save(model, fmt, out, class_names=names, image_size=size)
  return _summary(fmt, model.source, out)


def _parse(argv: Sequence[str]) -> dict[str, Any]:
  """The flag values; a `CommandLineError` for a bad command line."""
  flag_values = cli.new_flag_values()
  holders = dict(
    **cli.define_model_flags(flag_values),
    format=flags.DEFINE_enum("format", None, FORMATS, "What to write.", flag_values=flag_values),
    out=flags.DEFINE_string(
      "out", None, "A new (or empty) folder for the files.", flag_values=flag_values
    ),
  )
  return cli.parse_command_flags(
    flag_values, argv, holders, ("checkpoint", "format", "out"), __doc__
  )


def _export(values: dict[str, Any]) -> None:
  """Exports for the parsed command line and prints the summary."""
  summary = export(
    values["checkpoint"],
    values["format"],
    values["out"],
    model_name=values["model"],
    labels=values["labels"],
    resolution=values["resolution"],
  )
  print(summary)


def main(argv: Sequence[str]) -> int:
  """The command, callable in-process (`vit_jax.cli`): parses ``argv`` (argv[0]: the
  program), exports; the exit status."""
  return cli.run_command(argv, _parse, _export, context=lambda values: (values["out"], None))


if __name__ == "__main__":
  cli.exit_with(main(sys.argv))
