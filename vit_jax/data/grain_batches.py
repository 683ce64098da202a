"""The input pipeline's decoding stage: a reader's chunks -> preprocessed numpy batches, in
Grain's threads, without TensorFlow.

Each chunk of a reader (`readers.py`: positions, uids, values, labels, texts in stream
order) becomes a `grain.MapDataset` whose map reads the file (a 'path' source), checks
and decodes the image (`host_images`) and preprocesses it; Grain runs the map over
`workers` threads in order (`ReadOptions`); the threads drain at the end of each chunk
(`readers.CHUNK` examples: a few images' idle time per thousand). A failed image is left
out, so `pipeline._realign` finds its position and `Stage.reason` names the error. Each
worker thread writes its images straight into their rows of the batch arrays
(`_Buffers`), so the main thread copies an image only to close the gap a failed one leaves.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any, Callable, Iterator

import cv2
import grain
import numpy as np

from vit_jax import input_files
from vit_jax.data import filesystems, host_images, readers
from vit_jax.data.dataset import Settings

Example = tuple[int, int, Any, int, bytes]  # position, uid, value, label, text
# (index in the stream, position, label [K], text, uid), or None: the image failed.
_Row = tuple[int, int, np.ndarray, bytes, int] | None
_GROUP = 8  # Examples per Grain element: a threads' drain at a chunk's end idles < 8 images.


def default_workers() -> int:
  """Threads that decode: two per core this process may use, so that a core stays busy
  while a thread waits on a file read or the GIL (and, on a shared machine, the stage
  gets the scheduler's share tf.data's thread pools get: 2 cores at load 8, 1.0x tf.data's
  images/s with two per core, 0.75x with one)."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return 2 * (cores or 1)


def read_bytes(path: Any) -> bytes:
  """A 'path' source's file (local, or remote through `filesystems`), at most
  `input_files.MAX_IMAGE_BYTES` (OSError else)."""
  name = path.decode() if isinstance(path, bytes) else str(path)
  data = filesystems.read_head(name, input_files.MAX_IMAGE_BYTES + 1)
  if len(data) > input_files.MAX_IMAGE_BYTES:
    raise OSError(f"more than {input_files.MAX_IMAGE_BYTES:,} bytes, larger than an image may be")
  return data


class _Buffers:
  """The batches being written, keyed by batch number: the stream's n-th example is
  written into row n % size of batch n // size (its place if no image before it fails),
  by whichever worker thread decodes it."""

  def __init__(self, empty: Callable[[], tuple[np.ndarray, ...]], size: int):
    self._empty, self._size = empty, size
    self._batches: dict[int, tuple[np.ndarray, ...]] = {}
    self._lock = threading.Lock()

  def batch(self, b: int) -> tuple[np.ndarray, ...]:
    """Batch ``b``'s arrays (positions, images, labels, texts, uids), made on first use."""
    with self._lock:
      if b not in self._batches:
        self._batches[b] = self._empty()
      return self._batches[b]

  def image(self, n: int) -> np.ndarray:
    """The image row (float32 [crop, crop, 3]) the stream's n-th example is written into."""
    b, r = divmod(n, self._size)
    return self.batch(b)[1][r]

  def pop(self, b: int) -> tuple[np.ndarray, ...]:
    with self._lock:
      return self._batches.pop(b)


class Stage:
  """Preprocessing of one split's examples on the host: train (crop, flip) or eval."""

  def __init__(
    self, settings: Settings, kind: str, num_classes: int, train: bool, workers: int | None = None
  ):
    self._settings, self._kind, self._train = settings, kind, train
    self._eye = np.eye(num_classes, dtype=np.float32)
    self._workers = workers or default_workers()
    cv2.setNumThreads(1)  # Grain's threads are the parallelism; OpenCV's pool would spin beside
    self._shape = (settings.crop, settings.crop, 3)
    if not train:
      host_images.check_eval_config(settings.eval_data_config())

  def image(self, value: Any, uid: int, out: np.ndarray | None = None) -> np.ndarray:
    """One example's batch row, float32 [crop, crop, 3], written into ``out`` where given:
    the train crop, normalised (or rounded, with RandAugment) in place, or the eval image.
    ValueError or OSError when it fails."""
    data = read_bytes(value) if self._kind == "path" else bytes(value)
    s = self._settings
    if not self._train:
      image = host_images.eval_image(data, s.eval_data_config())
      if out is None:
        return image
      out[...] = image
      return out
    rng = host_images.example_rng(s.seed, uid)
    pixels = host_images.train_crop(
      data, rng, crop=s.crop, min_area=s.min_area, flip=s.flip, out=out
    )
    host_images.normalize_into(pixels, pixels, s.randaug is not None, s.input_mean, s.input_std)
    return pixels

  def reason(self, value: Any, uid: int, label: int) -> str:
    """Why the example (value, uid, label) fails; "" when it does not (any more)."""
    del label  # The image alone fails.
    try:
      self.image(value, uid)
    except (ValueError, OSError) as e:
      return str(e).strip().splitlines()[0]
    return ""

  def _group(self, group: tuple[int, list[Example]], buffers: _Buffers) -> list[_Row]:
    """The rows of a few consecutive examples, the first of them the stream's ``start``-th:
    each image written by this worker thread straight into its slot in `buffers` (no
    copy in the main thread); None where the image fails. One Grain element per `_GROUP`
    examples, so that Grain's per-element cost (futures, statistics) is paid per group."""
    start, examples = group
    rows: list[_Row] = []
    for n, (position, uid, value, label, text) in enumerate(examples, start):
      try:
        self.image(value, uid, buffers.image(n))
      except (ValueError, OSError):
        rows.append(None)
        continue
      rows.append((n, position, self._eye[label], text, uid))
    return rows

  def _rows(self, reader: readers.Reader, buffers: _Buffers) -> Iterator[_Row]:
    """Every example of the reader's stream, preprocessed by Grain's threads, in order."""
    options = grain.ReadOptions(num_threads=self._workers, prefetch_buffer_size=4 * self._workers)
    start = 0
    for positions, uids, values, labels, texts in reader():
      examples = list(
        zip(positions.tolist(), uids.tolist(), values.tolist(), labels.tolist(), texts.tolist())
      )
      groups = [(start + i, examples[i : i + _GROUP]) for i in range(0, len(examples), _GROUP)]
      start += len(examples)
      dataset = grain.MapDataset.source(groups).map(functools.partial(self._group, buffers=buffers))
      for rows in dataset.to_iter_dataset(options):
        yield from rows

  def batches(self, reader: readers.Reader, local_batch: int) -> Callable[[], Iterator[tuple]]:
    """A function giving a fresh stream of (positions, images, labels, texts, uids)
    batches of at most `local_batch` rows (failed images left out)."""

    def stream() -> Iterator[tuple[np.ndarray, ...]]:
      buffers = _Buffers(functools.partial(self._empty, local_batch), local_batch)
      b, k = 0, 0  # the batch being filled and its rows so far
      for row in self._rows(reader, buffers):
        if row is None:
          continue
        n, position, label, text, uid = row
        batch = buffers.batch(b)
        if n != b * local_batch + k:  # after a failed image: the row moves up
          batch[1][k] = buffers.image(n)
        batch[0][k], batch[2][k], batch[3][k], batch[4][k] = position, label, text, uid
        k += 1
        if k == local_batch:
          yield buffers.pop(b)
          b, k = b + 1, 0
      if k:
        yield tuple(a[:k] for a in buffers.pop(b))

    return stream

  def _empty(self, size: int) -> tuple[np.ndarray, ...]:
    return (
      np.zeros([size], np.int64),
      np.empty([size, *self._shape], np.float32),
      np.empty([size, self._eye.shape[0]], np.float32),
      np.empty([size], object),
      np.zeros([size], np.int64),
    )
