"""The Grain stage of the input pipeline: a reader's chunks -> preprocessed numpy batches,
without TensorFlow (`config.input_pipeline='grain'`).

Each chunk of a reader (`readers.py`: positions, uids, values, labels, texts in stream
order) becomes a `grain.MapDataset` whose map reads the file (a 'path' source), checks
and decodes the image (`host_images`) and preprocesses it; Grain runs the map over
`workers` threads in order (`ReadOptions`); the threads drain at the end of each chunk
(`readers.CHUNK` examples: a few images' idle time per thousand). A failed image is left
out, as the tf.data stage's `ignore_errors`, so `pipeline._realign` finds its position
and `Stage.reason` names the error. Rows are written into preallocated batch arrays (no
stacking copy).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator

import cv2
import grain
import numpy as np

from vit_jax import input_files
from vit_jax.data import host_images, readers
from vit_jax.data.dataset import Settings

# (position, image [crop, crop, 3], label [K], text, uid), or None: the image failed.
_Row = tuple[int, np.ndarray, np.ndarray, bytes, int] | None


def default_workers() -> int:
  """Threads that decode: one per core this process may use."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def read_bytes(path: Any) -> bytes:
  """A 'path' source's local file, at most `input_files.MAX_IMAGE_BYTES` (OSError else)."""
  name = path.decode() if isinstance(path, bytes) else str(path)
  if not input_files.is_local(name):
    raise OSError("a remote file: the Grain pipeline reads local files (input_pipeline='tf')")
  name = name.removeprefix("file://")
  with open(name, "rb") as f:
    data = f.read(input_files.MAX_IMAGE_BYTES + 1)
  if len(data) > input_files.MAX_IMAGE_BYTES:
    raise OSError(f"more than {input_files.MAX_IMAGE_BYTES:,} bytes, larger than an image may be")
  return data


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

  def image(self, value: Any, uid: int) -> np.ndarray:
    """One example's batch row, float32 [crop, crop, 3]: the train crop normalised in
    place (or rounded, with RandAugment) in the worker thread, so that the batch's main
    thread only copies it; or the eval image. ValueError or OSError when it fails."""
    data = read_bytes(value) if self._kind == "path" else bytes(value)
    s = self._settings
    if not self._train:
      return host_images.eval_image(data, s.eval_data_config())
    rng = host_images.example_rng(s.seed, uid)
    pixels = host_images.train_crop(data, rng, crop=s.crop, min_area=s.min_area, flip=s.flip)
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

  def _row(self, example: tuple[int, int, Any, int, bytes]) -> _Row:
    position, uid, value, label, text = example
    try:
      image = self.image(value, uid)
    except (ValueError, OSError):
      return None
    return position, image, self._eye[label], text, uid

  def _rows(self, reader: readers.Reader) -> Iterator[_Row]:
    """Every example of the reader's stream, preprocessed by Grain's threads, in order."""
    options = grain.ReadOptions(num_threads=self._workers, prefetch_buffer_size=4 * self._workers)
    for positions, uids, values, labels, texts in reader():
      examples = list(
        zip(positions.tolist(), uids.tolist(), values.tolist(), labels.tolist(), texts.tolist())
      )
      dataset = grain.MapDataset.source(examples).map(self._row)
      yield from dataset.to_iter_dataset(options)

  def batches(self, reader: readers.Reader, local_batch: int) -> Callable[[], Iterator[tuple]]:
    """A function giving a fresh stream of (positions, images, labels, texts, uids)
    batches of at most `local_batch` rows (failed images left out), as the tf.data
    stage's `as_numpy_iterator`."""

    def stream() -> Iterator[tuple[np.ndarray, ...]]:
      batch = self._empty(local_batch)
      k = 0
      for row in self._rows(reader):
        if row is None:
          continue
        position, image, label, text, uid = row
        batch[1][k] = image
        batch[0][k], batch[2][k], batch[3][k], batch[4][k] = position, label, text, uid
        k += 1
        if k == local_batch:
          yield batch
          batch, k = self._empty(local_batch), 0
      if k:
        yield tuple(a[:k] for a in batch)

    return stream

  def _empty(self, size: int) -> tuple[np.ndarray, ...]:
    return (
      np.zeros([size], np.int64),
      np.empty([size, *self._shape], np.float32),
      np.empty([size, self._eye.shape[0]], np.float32),
      np.empty([size], object),
      np.zeros([size], np.int64),
    )
