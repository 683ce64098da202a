"""Local copies of a prepared dataset's files on a bucket, made on first read and kept.

ArrayRecord's reader (C++, in tfds' data source) opens local paths only, and a TFRecord
shard's records are found by hopping over their headers, a request each on a bucket. So a
tfds data_dir on a bucket is read from local copies of the files a process reads (its
share of each split: the lanes and evaluation shards are contiguous ranges of it), each
copied on its first read:

  * where: ``$XDG_CACHE_HOME/vit_jax/data/<protocol>/<bucket>/<path>`` (default
    ``~/.cache/vit_jax/data/...``), the file's name followed by its generation on the
    bucket (a file written again there is copied again; the older copy is removed);
  * how: ranged GETs of `BLOCK` bytes, `CONCURRENT` in flight (128 MiB), each written at
    its offset into a temporary file beside the copy, which is renamed into place once its
    size is the bucket's: a copy is whole or absent, whatever stops a run;
  * shared: the processes of a machine copy a folder's files one process at a time (an
    exclusive lock on ``.lock`` in the folder) and read the copies the others made, this
    run and later ones.

The disk it takes is the size of the files read; nothing removes them but a newer
generation of the same file (delete the folder to free the space).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import fcntl
import os
import re
import shutil
import socket
import time
from typing import Any, Awaitable, Callable, Iterator, NamedTuple, Sequence

import fsspec.asyn
from absl import logging

from vit_jax.infra import errors, storage

BLOCK = 8 * 2**20  # Bytes per ranged GET.
CONCURRENT = 16  # Ranged GETs in flight.


class Copy(NamedTuple):
  """A remote file and its local copy: ``path``, complete when it holds ``size`` bytes."""

  url: str
  path: str
  size: int


def cache_root() -> str:
  """The folder of the copies: ``$XDG_CACHE_HOME/vit_jax/data`` (``~/.cache`` by default)."""
  home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(home, "vit_jax", "data")


def _run(fs: Any, function: Callable[[], Awaitable[Any]]) -> Any:
  """``await function()`` on ``fs``'s event loop (fsspec's thread), from this thread."""
  return fsspec.asyn.sync(fs.loop, function)


def copies(urls: Sequence[str]) -> list[Copy]:
  """Where each remote file is copied (one request per file, all at once); a missing file
  raises FileNotFoundError, any other failure a StorageError naming it."""
  if not urls:
    return []
  fs = storage.filesystem(urls[0])
  if getattr(fs, "async_impl", False):

    async def all_infos() -> list[Any]:
      infos = (fs._info(u) for u in urls)  # pylint: disable=protected-access
      return list(await asyncio.gather(*infos, return_exceptions=True))

    infos = _run(fs, all_infos)
  else:
    infos = []
    for url in urls:
      try:
        infos.append(fs.info(url))
      except Exception as e:  # noqa: BLE001  # raised below, naming the file
        infos.append(e)
  out = []
  for url, info in zip(urls, infos):
    if isinstance(info, FileNotFoundError):
      raise FileNotFoundError(errno.ENOENT, "No such file", url)
    if isinstance(info, BaseException):
      raise storage.error(url, info) from info
    out.append(Copy(url, _local_path(url, info), int(info["size"])))
  return out


def _local_path(url: str, info: dict[str, Any]) -> str:
  """``cache_root()/<protocol>/<bucket and path>.<version>``: the version (GCS's
  generation; an ETag or modification time elsewhere) makes a rewritten file a new copy."""
  protocol, rest = url.split("://", 1)
  version = info.get("generation") or info.get("ETag") or info.get("etag") or info.get("mtime")
  tag = re.sub(r"[^A-Za-z0-9_-]", "", str(version or "")) or f"size{info['size']}"
  return os.path.join(cache_root(), protocol, *rest.strip("/").split("/")) + f".{tag}"


def local_copy(url: str) -> str:
  """The local copy of remote file ``url``, made now if there is none of its version."""
  copy = copies([url])[0]
  fetch([copy])
  return copy.path


def complete(copy: Copy) -> bool:
  try:
    return os.path.getsize(copy.path) == copy.size
  except OSError:
    return False


def fetch(wanted: Sequence[Copy]) -> None:
  """Makes the local copies of ``wanted`` that are not complete yet: folder by folder,
  under that folder's lock, the blocks of all its files in flight together."""
  by_folder: dict[str, list[Copy]] = collections.defaultdict(list)
  for copy in wanted:
    if not complete(copy):
      by_folder[os.path.dirname(copy.path)].append(copy)
  for folder, files in sorted(by_folder.items()):
    _make_folder(folder)
    with _locked(os.path.join(folder, ".lock")):
      missing = [c for c in files if not complete(c)]  # another process may have copied some
      if missing:
        _copy(folder, missing)


def _make_folder(folder: str) -> None:
  try:
    os.makedirs(folder, exist_ok=True)
  except OSError as e:
    raise errors.UnusableFolderError(
      f"Cannot make the local copies' folder {folder} ({e.strerror}): set XDG_CACHE_HOME to "
      "a folder that can be written (the copies go under $XDG_CACHE_HOME/vit_jax/data)."
    ) from None


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
  """An exclusive lock on file ``path`` between the processes of this machine."""
  with open(path, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _no_room(folder: str, needed: int) -> errors.OutOfDiskError:
  free = shutil.disk_usage(folder).free
  return errors.OutOfDiskError(
    f"No room for the local copies of a dataset's files on a bucket in {folder} (they need "
    f"{needed:,} bytes, {free:,} are free): free space there, or set XDG_CACHE_HOME to a "
    "folder on a larger disk, then run the same command again."
  )


def _copy(folder: str, files: list[Copy]) -> None:
  """Copies ``files`` (all in ``folder``): temporary files written block by block, each
  renamed into place once whole; what is left of a failed copy is removed."""
  needed = sum(c.size for c in files)
  if shutil.disk_usage(folder).free < needed:
    raise _no_room(folder, needed)
  logging.info(
    "Copying %d files (%.1f MiB) from %s into %s: read from there from now on.",
    len(files),
    needed / 2**20,
    os.path.dirname(files[0].url),
    folder,
  )
  started = time.perf_counter()
  # This process's own: a cache folder on a shared file system may serve several machines.
  temporary = [f"{c.path}.part-{socket.gethostname()}-{os.getpid()}" for c in files]
  try:
    _write_blocks(files, temporary)
    for copy, part in zip(files, temporary):
      if os.path.getsize(part) != copy.size:  # the bucket's file changed meanwhile
        raise errors.InputFileError(
          f"{copy.url} changed while it was copied ({os.path.getsize(part)} of {copy.size} "
          "bytes): run the same command again once it is written."
        )
      os.replace(part, copy.path)
      _remove_older(copy)
  except OSError as e:
    if errors.is_out_of_disk(e):
      raise _no_room(folder, needed) from None
    raise
  finally:
    for part in temporary:
      with contextlib.suppress(FileNotFoundError):
        os.remove(part)
  seconds = time.perf_counter() - started
  logging.info("Copied in %.2f s (%.0f MiB/s).", seconds, needed / 2**20 / max(seconds, 1e-9))


def _write_blocks(files: list[Copy], temporary: list[str]) -> None:
  """Every `BLOCK` of ``files`` read with `CONCURRENT` ranged GETs in flight, written at
  its offset into its temporary file (fsynced)."""
  fs = storage.filesystem(files[0].url)
  handles = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for p in temporary]
  try:
    blocks = [
      (k, start, min(start + BLOCK, copy.size))
      for k, copy in enumerate(files)
      for start in range(0, copy.size, BLOCK)
    ]
    if getattr(fs, "async_impl", False):
      _run(fs, lambda: _read_blocks(fs, files, handles, blocks))
    else:
      for k, start, end in blocks:
        data = _read_block(files[k].url, lambda: fs.cat_file(files[k].url, start, end))
        _write_at(handles[k], files[k], start, end, data)
    for handle in handles:
      os.fsync(handle)
  finally:
    for handle in handles:
      os.close(handle)


async def _read_blocks(
  fs: Any, files: list[Copy], handles: list[int], blocks: list[tuple[int, int, int]]
) -> None:
  limit = asyncio.Semaphore(CONCURRENT)

  async def one(k: int, start: int, end: int) -> None:
    async with limit:
      try:
        data = await fs._cat_file(files[k].url, start=start, end=end)  # pylint: disable=protected-access
      except Exception as e:  # noqa: BLE001
        raise _read_error(files[k].url, e) from e
    _write_at(handles[k], files[k], start, end, data)

  tasks = [asyncio.ensure_future(one(*block)) for block in blocks]
  try:
    await asyncio.gather(*tasks)
  finally:
    for task in tasks:
      task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _read_error(url: str, e: Exception) -> Exception:
  """The error for a failed ranged GET of ``url``: FileNotFoundError naming it (deleted
  since its size was read), else a StorageError (the client's retries are spent)."""
  if isinstance(e, FileNotFoundError):
    return FileNotFoundError(errno.ENOENT, "No such file", url)
  return storage.error(url, e)


def _read_block(url: str, read: Callable[[], bytes]) -> bytes:
  try:
    return read()
  except Exception as e:  # noqa: BLE001
    raise _read_error(url, e) from e


def _write_at(handle: int, copy: Copy, start: int, end: int, data: bytes) -> None:
  if len(data) != end - start:  # cut short on the bucket since its size was read
    raise errors.InputFileError(
      f"{copy.url} changed while it was copied (bytes {start}..{end} of {copy.size} gave "
      f"{len(data)}): run the same command again once it is written."
    )
  os.pwrite(handle, data, start)


def _remove_older(copy: Copy) -> None:
  """Removes copies of other versions of ``copy``'s file (``<name>.<version>``)."""
  folder, name = os.path.split(copy.path)
  stem = name.rsplit(".", 1)[0]
  for other in os.listdir(folder):
    if other != name and other.rsplit(".", 1)[0] == stem and ".part-" not in other:
      with contextlib.suppress(OSError):
        os.remove(os.path.join(folder, other))
