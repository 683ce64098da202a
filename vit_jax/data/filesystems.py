"""File access by path for the input sources: local paths (and ``file://``) through `os`,
`glob` and `open`; a URL (gs://...) through fsspec (`vit_jax.storage`: gcsfs for
buckets), so reading a folder, a captions file, tar shards, records or images needs no
TensorFlow wherever they are. A remote file that does not exist is a FileNotFoundError,
as a local one is; any other failure of the storage, once the client's own retries are
spent, is one `errors.StorageError` naming the path."""

from __future__ import annotations

import contextlib
import glob as glob_lib
import os
from typing import BinaryIO, Iterator

from vit_jax import errors, input_files, storage


@contextlib.contextmanager
def _remote_errors(path: str) -> Iterator[None]:
  """A failure other than a missing file, as one StorageError naming ``path``."""
  try:
    yield
  except (FileNotFoundError, errors.UserError):
    raise
  except Exception as e:  # pylint: disable=broad-except  (the client's: aiohttp, HTTP codes)
    raise errors.StorageError(
      f"Reading {path} failed after the storage client's retries "
      f"({type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}): "
      "check the bucket and its credentials, then run the same command again."
    ) from e


def _local(path: str) -> str:
  return path.removeprefix("file://")


def isdir(path: str) -> bool:
  if input_files.is_local(path):
    return os.path.isdir(_local(path))
  with _remote_errors(path):
    return storage.filesystem(path).isdir(path)


def exists(path: str) -> bool:
  if input_files.is_local(path):
    return os.path.exists(_local(path))
  with _remote_errors(path):
    return storage.filesystem(path).exists(path)


def listdir(path: str) -> list[str]:
  """The names in folder ``path``, unsorted."""
  if input_files.is_local(path):
    return os.listdir(_local(path))
  folder = path.split("://", 1)[1].rstrip("/")
  with _remote_errors(path):
    found = [p.rstrip("/") for p in storage.filesystem(path).ls(path, detail=False)]
  return [p.rsplit("/", 1)[-1] for p in found if p != folder]  # without a folder marker


def glob(pattern: str) -> list[str]:
  """The paths ``pattern`` matches, sorted; in the pattern's own form (a ``file://``
  pattern gives ``file://`` paths)."""
  if not input_files.is_local(pattern):
    protocol = pattern.split("://")[0]
    with _remote_errors(pattern):
      return sorted(f"{protocol}://{p}" for p in storage.filesystem(pattern).glob(pattern))
  prefix = pattern[: len(pattern) - len(_local(pattern))]
  return sorted(prefix + p for p in glob_lib.glob(_local(pattern)))


def open_binary(path: str, exact: bool = False) -> BinaryIO:
  """``path`` opened for binary reading, seekable. ``exact``: a local file unbuffered, so
  each read reads what it asks and no more (random reads of records); else buffered (lines,
  tar members)."""
  if not input_files.is_local(path):
    with _remote_errors(path):
      # `exact`: no read-ahead, each read one ranged request of its own bytes.
      return storage.filesystem(path).open(path, "rb", cache_type="none" if exact else "readahead")
  return open(_local(path), "rb", buffering=0 if exact else -1)  # noqa: SIM115  (the caller's)


def read_head(path: str, size: int) -> bytes:
  """Up to ``size`` bytes from the start of file ``path``. A file that does not exist
  raises FileNotFoundError wherever it is, so the input stage leaves that image out."""
  if not input_files.is_local(path):
    with _remote_errors(path):
      return storage.filesystem(path).cat_file(path, start=0, end=size)
  with open(_local(path), "rb") as f:
    # A read of `size` allocates `size` bytes first (256 MiB for an image's bound: an mmap
    # and munmap per image, which threads reading at once serialise on); a regular file's
    # own size, plus one to see it has not grown past it, is enough.
    known = os.fstat(f.fileno()).st_size
    return f.read(min(size, known + 1) if known else size)
