"""File access by path for the input sources: local paths (and ``file://``) through `os`,
`glob` and `open`; a URL (gs://...) through fsspec (`vit_jax.infra.storage`: gcsfs for
buckets), so reading a folder, a captions file, tar shards, records or images needs no
TensorFlow wherever they are. A remote file that does not exist is a FileNotFoundError,
as a local one is; any other failure of the storage, once the client's own retries are
spent, is one `errors.StorageError` naming the path.

A request to a bucket takes tens of milliseconds, so remote images are read many at a
time (`RemoteReads`: concurrent requests on fsspec's event loop), not one after another.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import glob as glob_lib
import os
from typing import Any, BinaryIO, Sequence

from vit_jax.infra import input_files, storage


def _local(path: str) -> str:
  return path.removeprefix("file://")


def isdir(path: str) -> bool:
  if input_files.is_local(path):
    return os.path.isdir(_local(path))
  with storage.errors_as_one_line(path):
    return storage.filesystem(path).isdir(path)


def exists(path: str) -> bool:
  if input_files.is_local(path):
    return os.path.exists(_local(path))
  with storage.errors_as_one_line(path):
    return storage.filesystem(path).exists(path)


def listdir(path: str) -> list[str]:
  """The names in folder ``path``, unsorted."""
  if input_files.is_local(path):
    return os.listdir(_local(path))
  folder = path.split("://", 1)[1].rstrip("/")
  with storage.errors_as_one_line(path):
    found = [p.rstrip("/") for p in storage.filesystem(path).ls(path, detail=False)]
  return [p.rsplit("/", 1)[-1] for p in found if p != folder]  # without a folder marker


def glob(pattern: str) -> list[str]:
  """The paths ``pattern`` matches, sorted; in the pattern's own form (a ``file://``
  pattern gives ``file://`` paths)."""
  if not input_files.is_local(pattern):
    protocol = pattern.split("://")[0]
    with storage.errors_as_one_line(pattern):
      return sorted(f"{protocol}://{p}" for p in storage.filesystem(pattern).glob(pattern))
  prefix = pattern[: len(pattern) - len(_local(pattern))]
  return sorted(prefix + p for p in glob_lib.glob(_local(pattern)))


def open_binary(path: str, exact: bool = False) -> BinaryIO:
  """``path`` opened for binary reading, seekable. ``exact``: a local file unbuffered, so
  each read reads what it asks and no more (random reads of records); else buffered (lines,
  tar members)."""
  if not input_files.is_local(path):
    with storage.errors_as_one_line(path):
      # `exact`: no read-ahead, each read one ranged request of its own bytes.
      return storage.filesystem(path).open(path, "rb", cache_type="none" if exact else "readahead")
  return open(_local(path), "rb", buffering=0 if exact else -1)  # noqa: SIM115  (the caller's)


def read_head(path: str, size: int) -> bytes:
  """Up to ``size`` bytes from the start of file ``path``. A file that does not exist
  raises FileNotFoundError wherever it is, so the input stage leaves that image out."""
  if not input_files.is_local(path):
    with storage.errors_as_one_line(path):
      return storage.filesystem(path).cat_file(path, start=0, end=size)
  with open(_local(path), "rb") as f:
    # A read of `size` allocates `size` bytes first (256 MiB for an image's bound: an mmap
    # and munmap per image, which threads reading at once serialise on); a regular file's
    # own size, plus one to see it has not grown past it, is enough.
    known = os.fstat(f.fileno()).st_size
    return f.read(min(size, known + 1) if known else size)


# The first request for a remote file asks for this many bytes: all of nearly every image
# (photos are tens to hundreds of KiB). A larger file's size is asked next, and the rest
# read only if it is within the caller's limit, one such rest at a time per process, so
# the bytes in flight stay about (files read at once) x this.
FIRST_READ = 2**20
_larger: dict[int, asyncio.Semaphore] = {}  # per event loop: rests of larger files


async def _read_whole(fs: Any, path: str, limit: int) -> bytes | None | BaseException:
  """File ``path`` whole; None when it holds more than ``limit`` bytes (not read past the
  first request); the exception of a read that failed (returned: the others go on)."""
  try:
    head = await fs._cat_file(path, start=0, end=FIRST_READ)  # pylint: disable=protected-access
    if len(head) < FIRST_READ:
      return head if len(head) <= limit else None
    size = int((await fs._info(path))["size"])  # pylint: disable=protected-access
    if size > limit:
      return None
    loop = id(asyncio.get_running_loop())
    if loop not in _larger:
      _larger[loop] = asyncio.Semaphore(1)
    async with _larger[loop]:
      rest = await fs._cat_file(path, start=FIRST_READ, end=size)  # pylint: disable=protected-access
    return head + rest
  except Exception as e:  # noqa: BLE001  # per file: FileNotFoundError, or a storage failure
    return e


class RemoteReads:
  """Remote files read at once (started when made): on fsspec's event loop for an
  asynchronous filesystem (gcsfs), all requests in flight together; else one after
  another when asked. `get(k)` gives file k's bytes, None where it holds more than
  ``limit`` bytes; a missing file raises FileNotFoundError (as a local one), any other
  failure a StorageError naming it."""

  def __init__(self, paths: Sequence[str], limit: int):
    self.paths, self._limit = list(paths), limit
    self._results: list[bytes | None | BaseException] | None = None
    self._future: concurrent.futures.Future | None = None
    try:
      fs = storage.filesystem(self.paths[0]) if self.paths else None
    except Exception as e:  # noqa: BLE001  # the client cannot start (credentials): each read's
      self._results = [e] * len(self.paths)
      return
    if fs is not None and getattr(fs, "async_impl", False):

      async def read_all() -> list[bytes | None | BaseException]:
        return list(await asyncio.gather(*(_read_whole(fs, p, limit) for p in self.paths)))

      self._future = asyncio.run_coroutine_threadsafe(read_all(), fs.loop)

  def get(self, k: int) -> bytes | None:
    if self._results is None:
      if self._future is not None:
        self._results = self._future.result()
      else:
        self._results = [self._read_one(p) for p in self.paths]
    result = self._results[k]
    if isinstance(result, FileNotFoundError):
      raise result  # the image is left out, as a missing local file's
    if isinstance(result, BaseException):
      raise storage.error(self.paths[k], result) from result
    return result

  def _read_one(self, path: str) -> bytes | None | BaseException:
    try:
      data = read_head(path, self._limit + 1)
    except FileNotFoundError as e:
      return e
    return data if len(data) <= self._limit else None
