"""Files a command reads, checked before they are opened: regular files within a bound.

Anything a user names (an image, a labels file, a config file, a run's config.json) could
be a FIFO (opening it waits for a writer forever), a device such as /dev/zero (reading it
never ends), a socket, a link to one of those, or a multi-gigabyte file. `os.stat` tells
them apart without opening anything, so every reader here stats first: only a regular file
within its stated size bound is opened; a folder walk skips the others (`is_regular`).
Each refusal is one `errors.InputFileError` (or the caller's error type) naming the file,
what it is and the bound.
"""

from __future__ import annotations

import os
import stat
from typing import Optional

from vit_jax.infra import errors

MAX_TEXT_BYTES = 16 * 2**20  # labels files, config files, a run's config.json: kilobytes
MAX_IMAGE_BYTES = 256 * 2**20  # an image file (a 100-megapixel JPEG is about 30 MiB)
# Pixels of one image, read from its header before any decoding: PIL's decompression-bomb
# threshold (Image.MAX_IMAGE_PIXELS), about 0.25 GiB as uint8 RGB.
MAX_IMAGE_PIXELS = 89_478_485

_KINDS = (
  (stat.S_ISDIR, "a folder"),
  (stat.S_ISFIFO, "a FIFO (named pipe)"),
  (stat.S_ISCHR, "a character device"),
  (stat.S_ISBLK, "a block device"),
  (stat.S_ISSOCK, "a socket"),
)


def is_local(path: str) -> bool:
  """Whether ``path`` is on this machine (not a URL such as gs://), so `os.stat` applies."""
  return "://" not in path or path.startswith("file://")


def kind(mode: int) -> str:
  """What a file of ``mode`` is, in words."""
  return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def not_regular(path: str) -> Optional[str]:
  """Why ``path`` (links followed) is no regular file, or None when it is one."""
  try:
    mode = os.stat(path).st_mode
  except OSError as e:
    return e.strerror or type(e).__name__
  return None if stat.S_ISREG(mode) else kind(mode)


def regular_file(
  path: str,
  max_bytes: Optional[int],
  *,
  what: str = "file",
  error: type[errors.UserError] = errors.InputFileError,
) -> int:
  """The size of ``path`` when it is a regular file (links followed) of at most
  ``max_bytes``; else an ``error`` naming it (``what``: e.g. "--labels file")."""
  try:
    info = os.stat(path)
  except OSError as e:
    raise error(f"The {what} {path!r} cannot be read ({e.strerror}).") from e
  if not stat.S_ISREG(info.st_mode):
    raise error(
      f"The {what} {path!r} is {kind(info.st_mode)}, not a regular file: name a regular file."
    )
  if max_bytes is not None and info.st_size > max_bytes:
    raise error(
      f"The {what} {path!r} has {info.st_size:,} bytes, more than the {max_bytes:,} such a "
      "file may have: name the right file."
    )
  return info.st_size


def read_text(
  path: str,
  *,
  what: str,
  max_bytes: int = MAX_TEXT_BYTES,
  error: type[errors.UserError] = errors.InputFileError,
) -> str:
  """The UTF-8 text of ``path``, after `regular_file`; other encodings are an ``error``."""
  regular_file(path, max_bytes, what=what, error=error)
  with open(path, "rb") as f:
    data = f.read(max_bytes + 1)
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise error(
      f"The {what} {path!r} is not UTF-8 text ({e.reason} at byte {e.start}): save it as UTF-8."
    ) from e
