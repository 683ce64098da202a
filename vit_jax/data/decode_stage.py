"""The input pipeline's decoding stage: a reader's chunks -> preprocessed numpy batches,
without TensorFlow.

The reader's stream (`readers.py`: positions, uids, values, labels, texts in stream
order) is cut into groups of `_GROUP` examples; each example's file is read (a 'path'
source), its image checked, decoded and preprocessed (`example_images`), and written
straight into its row of the batch arrays (`_Buffers`), so the main thread copies an image
only to close the gap a failed one leaves. A failed image is left out, so
`pipeline._realign` finds its position and `Stage.reason` names the error. Files on a
bucket are read a group at a time, all at once (`example_images.ReadAhead`): a worker
process reads the files of every group it holds while it decodes.

Who does the work: worker processes by default (`decode_workers`: one per core, each
group sent to the least busy, the batch's images in shared memory), or with
``processes=0`` (`config.decode_processes=0`) Grain's threads in this process, a
`grain.MapDataset` per reader chunk read in order over `workers` threads (`ReadOptions`),
which drain at each chunk's end (`readers.CHUNK` examples: a few images' idle time per
thousand).
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import threading
import weakref
from typing import Any, Callable, Iterator

import grain
import numpy as np

from vit_jax.data import decode_workers, example_images, readers
from vit_jax.data.settings import Settings
from vit_jax.infra import errors

Example = tuple[int, int, Any, int, bytes]  # position, uid, value, label, text
# (index in the stream, position, label [K], text, uid), or None: the image failed.
_Row = tuple[int, int, np.ndarray, bytes, int] | None
_GROUP = 8  # Examples per task (a worker process's, or a Grain element of the threads).


def usable_cores(cgroup_root: str = "/sys/fs/cgroup") -> int:
  """Cores this process may use: its CPU affinity, bounded by its container's CPU quota
  rounded up (in a pod limited to 4 CPUs of a 64-core node the affinity still lists 64, and
  64 workers would share 4 CPUs' time)."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  quota = cpu_quota(cgroup_root)
  return max(1, min(cores or 1, math.ceil(quota))) if quota else cores or 1


def cpu_quota(cgroup_root: str = "/sys/fs/cgroup") -> float | None:
  """CPUs' worth of time the cgroup may use (cgroup v2 ``cpu.max``, or v1
  ``cpu/cpu.cfs_quota_us`` over ``cpu.cfs_period_us``); None where unlimited or unknown."""
  try:
    with open(os.path.join(cgroup_root, "cpu.max")) as f:
      quota, period = f.read().split()[:2]
    return None if quota == "max" else int(quota) / int(period)
  except (OSError, ValueError, ZeroDivisionError):
    pass
  try:
    with open(os.path.join(cgroup_root, "cpu", "cpu.cfs_quota_us")) as f:
      quota_us = int(f.read())
    with open(os.path.join(cgroup_root, "cpu", "cpu.cfs_period_us")) as f:
      period_us = int(f.read())
  except (OSError, ValueError):
    return None
  return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def default_processes() -> int:
  """Worker processes that decode, where `config.decode_processes` is None: one per core
  on Linux (on 2 cores, 1.35-1.4x the images/s of two threads per core at 0.8x their CPU
  per image: docs/input_pipelines.md); elsewhere none (threads)."""
  return usable_cores() if hasattr(os, "memfd_create") else 0


def default_workers() -> int:
  """Threads that decode in the main process: two per core, so that a core stays busy
  while a thread waits on a file read or the GIL (and, on a shared machine, the stage
  gets the scheduler's share tf.data's thread pools get: 2 cores at load 8, 1.0x tf.data's
  images/s with two per core, 0.75x with one)."""
  return 2 * usable_cores()


class _Buffers:
  """The batches being written, keyed by batch number: the stream's n-th example is
  written into row n % size of batch n // size (its place if no image before it fails),
  by whichever worker decodes it; each batch's images may be in shared memory
  (`decode_workers.SharedImages`), where worker processes write them."""

  def __init__(self, empty: Callable[[int], tuple[tuple[np.ndarray, ...], str | None]], size: int):
    self._empty, self.size = empty, size
    self._batches: dict[int, tuple[np.ndarray, ...]] = {}
    self._paths: dict[int, str] = {}  # of the shared batches' images
    self._lock = threading.Lock()

  def batch(self, b: int) -> tuple[np.ndarray, ...]:
    """Batch ``b``'s arrays (positions, images, labels, texts, uids), made on first use."""
    with self._lock:
      if b not in self._batches:
        self._batches[b], path = self._empty(self.size)
        if path is not None:
          self._paths[b] = path
      return self._batches[b]

  def image(self, n: int) -> np.ndarray:
    """The image row (float32 [crop, crop, 3]) the stream's n-th example is written into."""
    b, r = divmod(n, self.size)
    return self.batch(b)[1][r]

  def place(self, n: int) -> tuple[str, int]:
    """(path, row) of the stream's n-th example's image, for a worker process."""
    b, r = divmod(n, self.size)
    self.batch(b)
    return self._paths[b], r

  def pop(self, b: int) -> tuple[np.ndarray, ...]:
    """Batch ``b``, finished."""
    with self._lock:
      self._paths.pop(b, None)
      return self._batches.pop(b)


class Stage:
  """Preprocessing of one split's examples on the host (train: crop, flip; or eval), in
  worker processes (``processes``; None: `Settings.decode_processes`) or, with 0, in this
  process's threads (``workers``; None: two per core)."""

  def __init__(
    self,
    settings: Settings,
    kind: str,
    num_classes: int,
    train: bool,
    workers: int | None = None,
    processes: int | None = None,
  ):
    self._preprocessing = example_images.Preprocessing(settings, kind, train)
    self._eye = np.eye(num_classes, dtype=np.float32)
    self._workers = workers or default_workers()
    if processes is None:
      processes = settings.decode_processes
    self._processes = default_processes() if processes is None else processes
    if self._processes and not hasattr(os, "memfd_create"):
      raise errors.ConfigError(
        f"config.decode_processes={self._processes}: worker processes need Linux (their "
        "shared memory is os.memfd_create's); set it to 0 to decode in this process."
      )
    self._idle_pools: list[decode_workers.Pool] = []  # started, serving no stream now
    self._lock = threading.Lock()
    weakref.finalize(self, _close_pools, self._idle_pools)

  def image(
    self, value: Any, uid: int, out: np.ndarray | None = None, data: bytes | None = None
  ) -> np.ndarray:
    """One example's batch row (`example_images.Preprocessing.image`), in this process."""
    return self._preprocessing.image(value, uid, out, data)

  def reason(self, value: Any, uid: int) -> str:
    """Why the example's image fails; "" when it does not (any more)."""
    return self._preprocessing.reason(value, uid)

  def _group(self, group: tuple[int, list[Example]], buffers: _Buffers) -> list[_Row]:
    """The rows of a few consecutive examples, the first of them the stream's ``start``-th:
    each image written by this worker thread straight into its slot in `buffers` (no
    copy in the main thread); None where the image fails. One Grain element per `_GROUP`
    examples, so that Grain's per-element cost (futures, statistics) is paid per group."""
    start, examples = group
    rows: list[_Row] = []
    ahead = self._preprocessing.read_ahead([e[2] for e in examples])  # remote files, at once
    for k, (n, (position, uid, value, label, text)) in enumerate(enumerate(examples, start)):
      try:
        data = ahead.data(k) if ahead is not None else None
        self.image(value, uid, buffers.image(n), data)
      except (ValueError, OSError):
        rows.append(None)
        continue
      rows.append((n, position, self._eye[label], text, uid))
    return rows

  def _chunks(self, reader: readers.Reader) -> Iterator[list[tuple[int, list[Example]]]]:
    """The reader's stream, chunk by chunk, in groups of `_GROUP` examples: (stream index
    of the first, its examples)."""
    start = 0
    for positions, uids, values, labels, texts in reader():
      examples = list(
        zip(positions.tolist(), uids.tolist(), values.tolist(), labels.tolist(), texts.tolist())
      )
      yield [(start + i, examples[i : i + _GROUP]) for i in range(0, len(examples), _GROUP)]
      start += len(examples)

  def _thread_rows(self, reader: readers.Reader, buffers: _Buffers) -> Iterator[_Row]:
    """Every example of the reader's stream, preprocessed by Grain's threads, in order;
    the threads drain at the end of each reader chunk."""
    options = grain.ReadOptions(num_threads=self._workers, prefetch_buffer_size=4 * self._workers)
    for groups in self._chunks(reader):
      dataset = grain.MapDataset.source(groups).map(functools.partial(self._group, buffers=buffers))
      for rows in dataset.to_iter_dataset(options):
        yield from rows

  def _process_rows(
    self, reader: readers.Reader, buffers: _Buffers, pool: decode_workers.Pool
  ) -> Iterator[_Row]:
    """Every example of the reader's stream, preprocessed by worker processes, in order."""
    shape = (buffers.size, *self._preprocessing.shape)

    def task(group: tuple[int, list[Example]]) -> decode_workers.Task:
      start, examples = group
      return shape, [(*buffers.place(n), e[2], e[1]) for n, e in enumerate(examples, start)]

    groups = (group for chunk in self._chunks(reader) for group in chunk)
    first = next(groups, None)
    if first is None:
      return
    # Files on a bucket: more tasks held by each worker, whose files it reads at once.
    remote = self._preprocessing.is_remote(first[1][0][2])
    for (start, examples), written in pool.map(itertools.chain([first], groups), task, remote):
      for n, ok, (position, uid, _, label, text) in zip(itertools.count(start), written, examples):
        yield (n, position, self._eye[label], text, uid) if ok else None

  def _take_pool(self) -> decode_workers.Pool:
    """An idle pool of this stage's worker processes, or a new one (a stream left open
    while another starts keeps its own)."""
    with self._lock:
      if self._idle_pools:
        return self._idle_pools.pop()
    p = self._preprocessing
    return decode_workers.Pool((p.settings, p.kind, p.train), self._processes)

  def batches(self, reader: readers.Reader, local_batch: int) -> Callable[[], Iterator[tuple]]:
    """A function giving a fresh stream of (positions, images, labels, texts, uids)
    batches of at most `local_batch` rows (failed images left out)."""

    def stream() -> Iterator[tuple[np.ndarray, ...]]:
      pool = self._take_pool() if self._processes else None
      buffers = _Buffers(functools.partial(self._empty, pool=pool), local_batch)
      if pool is None:
        rows = self._thread_rows(reader, buffers)
      else:
        rows = self._process_rows(reader, buffers, pool)
      try:
        yield from _batches(rows, buffers)
      finally:
        rows.close()  # the pool's tasks in flight are done before it serves another stream
        if pool is not None and pool.alive():
          with self._lock:
            self._idle_pools.append(pool)
        elif pool is not None:
          pool.close()

    return stream

  def _empty(
    self, size: int, pool: decode_workers.Pool | None
  ) -> tuple[tuple[np.ndarray, ...], str | None]:
    """A new batch's arrays, and the path of its images where worker processes write them."""
    shape, path = (size, *self._preprocessing.shape), None
    if pool is None:
      images = np.empty(shape, np.float32)
    else:
      images, path = pool.images.take(shape)
    arrays = (
      np.zeros([size], np.int64),
      images,
      np.empty([size, self._eye.shape[0]], np.float32),
      np.empty([size], object),
      np.zeros([size], np.int64),
    )
    return arrays, path


def _batches(rows: Iterator[_Row], buffers: _Buffers) -> Iterator[tuple[np.ndarray, ...]]:
  """The rows in batches of `buffers.size` (the last may be shorter): each image row where
  its worker wrote it, moved up only after a failed image."""
  b, k = 0, 0  # the batch being filled and its rows so far
  for row in rows:
    if row is None:
      continue
    n, position, label, text, uid = row
    batch = buffers.batch(b)
    if n != b * buffers.size + k:  # after a failed image: the row moves up
      batch[1][k] = buffers.image(n)
    batch[0][k], batch[2][k], batch[3][k], batch[4][k] = position, label, text, uid
    k += 1
    if k == buffers.size:
      yield buffers.pop(b)
      b, k = b + 1, 0
  if k:
    yield tuple(a[:k] for a in buffers.pop(b))


def _close_pools(pools: list[decode_workers.Pool]) -> None:
  """Ends a stage's worker processes (when the stage is collected, or at exit)."""
  for pool in pools:
    pool.close()
  pools.clear()
