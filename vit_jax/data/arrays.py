"""In-memory arrays as a dataset: ``config.dataset = 'arrays:/path/data.npz'``.

`save_arrays` writes images [N, H, W, 3] (uint8, or float in [0, 1]) and integer labels
[N] into one `.npz` (``train_images``, ``train_labels``, optionally ``test_images``,
``test_labels`` and ``class_names``); the run reads its splits ``train`` and ``test``
(slices as for any dataset: ``train[:90%]``). Each image is PNG-encoded when it is read,
so it goes through the pipeline every source goes through (decode, crop, flip,
RandAugment, normalise): lossless for uint8, float images are rounded to 0..255 first.

Any finite iterable of batches becomes such arrays (`gather_batches`; `Model.fine_tune`
takes one in place of images and labels).

Exact resume: the split is random-access, so a run's batches are a function of
(``config.seed``, the step, the file's arrays) only; a run resumed at step k reads the
batches an uninterrupted run reads from step k + 1 on (`vit_jax.data.order`). The path
is in the run's config, so a resumed process finds the same arrays; changing the file's
contents under a run changes its data (its size is checked on resume, as any dataset's).
"""

from __future__ import annotations

import io
import os
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from vit_jax.data import splits as splits_lib
from vit_jax.infra import errors

PREFIX = "arrays:"  # config.dataset = 'arrays:/path/data.npz'
SPLITS = ("train", "test")


def as_uint8_images(images: Any, what: str = "images") -> np.ndarray:
  """[N, H, W, 3] uint8 from uint8, or float in [0, 1] (scaled by 255 and rounded)."""
  images = np.asarray(images)
  if images.ndim != 4 or images.shape[-1] != 3:
    raise errors.ConfigError(f"{what} must be [N, H, W, 3] RGB images, got shape {images.shape}.")
  if images.dtype == np.uint8:
    return images
  if not np.issubdtype(images.dtype, np.floating) or images.min() < 0 or images.max() > 1:
    raise errors.ConfigError(
      f"{what} must be uint8 (0..255) or float in [0, 1], got {images.dtype} in "
      f"[{images.min()}, {images.max()}]: scale them to one of those."
    )
  return np.round(images * 255.0).astype(np.uint8)


def _labels(labels: Any, n: int, what: str) -> np.ndarray:
  labels = np.asarray(labels)
  if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
    raise errors.ConfigError(
      f"{what} must be {n} integer class indices >= 0 (one per image), got {labels.dtype} "
      f"{labels.shape}."
    )
  return labels.astype(np.int64)


def save_arrays(
  path: str | os.PathLike,
  images: Any,
  labels: Any,
  *,
  test_images: Any = None,
  test_labels: Any = None,
  class_names: Optional[Sequence[str]] = None,
) -> str:
  """Writes the arrays a run reads as ``arrays:<path>``; returns that dataset name."""
  images = as_uint8_images(images)
  arrays = {"train_images": images, "train_labels": _labels(labels, len(images), "labels")}
  if test_images is not None:
    test = as_uint8_images(test_images, "test_images")
    arrays.update(test_images=test, test_labels=_labels(test_labels, len(test), "test_labels"))
  num_classes = max(int(a.max()) + 1 for k, a in arrays.items() if k.endswith("labels"))
  if class_names is not None:
    if len(class_names) < num_classes:
      raise errors.ConfigError(
        f"{len(class_names)} class_names for labels up to {num_classes - 1}: name every class."
      )
    arrays["class_names"] = np.asarray(list(class_names), dtype=str)
  path = os.fspath(path)
  np.savez(path, **arrays)
  return PREFIX + path


def gather_batches(batches: Iterable[Any]) -> tuple[np.ndarray, np.ndarray]:
  """(images [N, H, W, 3] uint8, labels [N]) of a finite iterable of ``(images, labels)``
  or ``{'image': ..., 'label': ...}`` batches, in order (labels: class indices, or one-hot
  rows read by their argmax). Gathered into arrays, they get the run's own order,
  augmentation and exact resume, whatever the iterable does when iterated again."""
  images, labels = [], []
  for batch in batches:
    x, y = (batch["image"], batch["label"]) if isinstance(batch, dict) else batch
    y = np.asarray(y)
    images.append(as_uint8_images(x, "a batch's images"))
    labels.append(y.argmax(-1) if y.ndim == 2 else y)
  if not images:
    raise errors.ConfigError("The iterable of batches yielded none: give at least one batch.")
  return np.concatenate(images), np.concatenate(labels)


class ArrayDataset:
  """The arrays of an `.npz` written by `save_arrays`."""

  def __init__(self, path: str):
    if not os.path.isfile(path):
      raise errors.MissingError(
        f"No arrays file {path!r}: write one with vit_jax.data.arrays.save_arrays(path, "
        "images, labels) and set config.dataset='arrays:<path>'."
      )
    with np.load(path) as stored:
      self._arrays = {k: stored[k] for k in stored.files}
    if "train_images" not in self._arrays or "train_labels" not in self._arrays:
      raise errors.ConfigError(f"{path!r} has no train_images and train_labels: save_arrays it.")
    self.path = path
    names = self._arrays.get("class_names")
    labels = [a for k, a in self._arrays.items() if k.endswith("_labels")]
    num_classes = max(int(a.max()) + 1 for a in labels)
    self.class_names = (
      [str(n) for n in names] if names is not None else [str(i) for i in range(num_classes)]
    )

  def split(self, spec: str) -> "ArraySplit":
    sizes = {s: len(self._arrays[f"{s}_labels"]) for s in SPLITS if f"{s}_labels" in self._arrays}
    return ArraySplit(self, spec, splits_lib.resolve(spec, sizes))

  def rows(self, split: str, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    return self._arrays[f"{split}_images"][start:stop], self._arrays[f"{split}_labels"][start:stop]


class ArraySplit(splits_lib.RangedSplit):
  """A configured split of an `ArrayDataset`; values are PNG-encoded images."""

  kind = "bytes"

  def __init__(self, dataset: ArrayDataset, spec: str, ranges: list[splits_lib.Range]):
    super().__init__(f"{dataset.path}:{spec}", ranges)
    self._dataset = dataset

  def _rows(self, split: str, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    images, labels = self._dataset.rows(split, start, stop)
    values = np.empty(len(images), object)  # bytes, not a fixed-width numpy string
    values[:] = [_png(image) for image in images]
    return values, labels


def _png(image: np.ndarray) -> bytes:
  """uint8 [H, W, 3] -> PNG bytes (lossless, quickly compressed: read back at once)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  out = io.BytesIO()
  Image.fromarray(image).save(out, "PNG", compress_level=1)
  return out.getvalue()
