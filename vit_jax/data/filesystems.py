"""File access by path for the input sources: local paths (and ``file://``) through `os`,
`glob` and `open`, so reading a folder, a captions file, tar shards or records needs no
TensorFlow; any other scheme (gs://...) through `tf.io.gfile`, imported only then, and
without TensorFlow one error line naming the path and the two ways out (the ``[tf]``
extra, or a copy on a local disk)."""

from __future__ import annotations

import glob as glob_lib
import os
from types import ModuleType
from typing import BinaryIO

from vit_jax import errors, input_files


def _gfile(path: str) -> ModuleType | None:
  """`tf.io.gfile` for a remote path, None for a local one (os reads it)."""
  if input_files.is_local(path):
    return None
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  (remote paths only)
  except ImportError:
    raise errors.ConfigError(
      f'Reading {path!r} needs TensorFlow\'s filesystems: pip install -e ".[tf]", or copy '
      "it to a local disk."
    ) from None
  return tf.io.gfile


def _local(path: str) -> str:
  return path.removeprefix("file://")


def isdir(path: str) -> bool:
  gfile = _gfile(path)
  return gfile.isdir(path) if gfile else os.path.isdir(_local(path))


def exists(path: str) -> bool:
  gfile = _gfile(path)
  return gfile.exists(path) if gfile else os.path.exists(_local(path))


def listdir(path: str) -> list[str]:
  """The names in folder ``path`` (without gfile's trailing '/' on sub-folders), unsorted."""
  gfile = _gfile(path)
  return [n.rstrip("/") for n in gfile.listdir(path)] if gfile else os.listdir(_local(path))


def glob(pattern: str) -> list[str]:
  """The paths ``pattern`` matches, sorted; in the pattern's own form (a ``file://``
  pattern gives ``file://`` paths)."""
  gfile = _gfile(pattern)
  if gfile:
    return sorted(gfile.glob(pattern))
  prefix = pattern[: len(pattern) - len(_local(pattern))]
  return sorted(prefix + p for p in glob_lib.glob(_local(pattern)))


def open_binary(path: str, exact: bool = False) -> BinaryIO:
  """``path`` opened for binary reading, seekable. ``exact``: a local file unbuffered, so
  each read reads what it asks and no more (random reads of records); else buffered (lines,
  tar members)."""
  gfile = _gfile(path)
  if gfile:
    return gfile.GFile(path, "rb")
  return open(_local(path), "rb", buffering=0 if exact else -1)  # noqa: SIM115  (the caller's)


def read_head(path: str, size: int) -> bytes:
  """Up to ``size`` bytes from the start of file ``path``. A remote read that fails raises
  OSError, as a local one does, so the input stage leaves that image out either way."""
  gfile = _gfile(path)
  if not gfile:
    with open(_local(path), "rb") as f:
      # A read of `size` allocates `size` bytes first (256 MiB for an image's bound: an mmap
      # and munmap per image, which threads reading at once serialise on); a regular file's
      # own size, plus one to see it has not grown past it, is enough.
      known = os.fstat(f.fileno()).st_size
      return f.read(min(size, known + 1) if known else size)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (imported by _gfile)

  try:
    with gfile.GFile(path, "rb") as f:
      return f.read(size)
  except tf.errors.OpError as e:
    raise OSError(f"{path}: {e.message}") from None
