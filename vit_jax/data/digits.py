"""`digits`: a tfds dataset that builds offline from scikit-learn's bundled UCI digits.

It exists so that every part of the project (tests, notebooks, the quickstart) can train
and evaluate on real images with no network. Importing this module registers the builder,
so `tfds.builder('digits')` works once `vit_jax.data` is imported.

Contents (fixed for version 1.0.0):
  * 1,797 greyscale 8x8 handwritten digits, 10 classes ('0' .. '9').
  * `image`: uint8 [8, 8, 1], the original 0..16 intensities scaled to 0..255
    (`round(v * 255 / 16)`), stored as PNG like any tfds image. The input pipeline
    decodes it to RGB [H, W, 3] (grey repeated on the three channels).
  * `label`: ClassLabel with 10 classes.
  * Splits: a seeded 80/20 split of the scikit-learn order
    (`numpy.random.RandomState(0).permutation(1797)`): the first 1,437 indices form
    `train`, the last 360 form `test`.
  * Stored order: tfds' (each split sorted by the md5 of its name and the example's key,
    `stored_order`).

Without TensorFlow, which tfds needs to build it, `DigitsArrays` reads the same examples
straight from scikit-learn's arrays: the same splits in the stored order, the same PNG
pixels, so the same batches.
"""

from __future__ import annotations

import hashlib
import io
import pathlib
from typing import Iterator

import numpy as np
import tensorflow_datasets as tfds

from vit_jax.data import splits as splits_lib

NAME = "digits"  # config.dataset of this dataset
NUM_TRAIN = 1437  # Size of the `train` split.
NUM_TEST = 360  # Size of the `test` split.
_SPLIT_SEED = 0  # Seed of the permutation that defines the splits; never change it.


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
  """All 1,797 digits as (images uint8 [N, 8, 8, 1] in 0..255, labels int64 [N])."""
  from sklearn import datasets  # Imported lazily: only the builder needs it.

  bunch = datasets.load_digits()
  images = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
  return images, bunch.target.astype(np.int64)


def split_indices() -> dict[str, np.ndarray]:
  """Indices into `digits_arrays()` of the `train` and `test` splits (fixed, seeded)."""
  order = np.random.RandomState(_SPLIT_SEED).permutation(NUM_TRAIN + NUM_TEST)
  return {"train": order[:NUM_TRAIN], "test": order[NUM_TRAIN:]}


def stored_order(split: str, keys: np.ndarray) -> np.ndarray:
  """``keys`` (a split's example keys: scikit-learn indices) in the order tfds stores
  them: ascending md5 of the split's name followed by the key's decimal digits, as tfds'
  shuffler hashes keys (tensorflow_datasets/core/hashing.py, salted by the split name)."""
  digest = lambda k: hashlib.md5(f"{split}{int(k)}".encode()).hexdigest()
  return np.array(sorted(keys.tolist(), key=digest), np.int64)


class DigitsArrays:
  """`digits` from scikit-learn's arrays, read without TensorFlow: splits as the prepared
  tfds dataset's, PNG values."""

  name = NAME
  class_names = [str(d) for d in range(10)]

  def __init__(self):
    images, self._labels = digits_arrays()
    self._png = [_png(image) for image in images]  # 1,797 tiny PNGs: a few ms
    self._keys = {name: stored_order(name, idx) for name, idx in split_indices().items()}

  def split(self, spec: str) -> "DigitsSplit":
    sizes = {name: len(keys) for name, keys in self._keys.items()}
    return DigitsSplit(self, spec, splits_lib.resolve(spec, sizes))

  def rows(self, split: str, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """(PNG bytes object [n], labels int64 [n]) of stored positions [start, stop) of a split."""
    keys = self._keys[split][start:stop]
    values = np.empty(len(keys), object)
    values[:] = [self._png[k] for k in keys]
    return values, self._labels[keys]


class DigitsSplit(splits_lib.RangedSplit):
  """A configured split of `DigitsArrays`; values are PNG-encoded greyscale images."""

  kind = "bytes"
  # Shuffled in windows, as the prepared (TFRecord) dataset is: the same batches.
  random_access = False

  def __init__(self, dataset: DigitsArrays, spec: str, ranges: list[splits_lib.Range]):
    super().__init__(f"{NAME}:{spec}", ranges)
    self._dataset = dataset

  def _rows(self, split: str, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    return self._dataset.rows(split, start, stop)


def _png(image: np.ndarray) -> bytes:
  """uint8 [8, 8, 1] -> greyscale PNG bytes (lossless: the pixels tfds stores)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  out = io.BytesIO()
  Image.fromarray(image[..., 0]).save(out, "PNG")
  return out.getvalue()


class Digits(tfds.core.GeneratorBasedBuilder):
  """UCI handwritten digits (scikit-learn copy), split 80/20 with a fixed seed."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Seeded 80/20 split of the 1,797 scikit-learn digits."}
  # tfds derives this from the module path through `importlib_resources`, which is not
  # installed here (ModuleNotFoundError while building); the file itself is the answer.
  code_path = pathlib.Path(__file__)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=__doc__,
      features=tfds.features.FeaturesDict(
        {
          "image": tfds.features.Image(shape=(8, 8, 1)),
          "label": tfds.features.ClassLabel(names=[str(d) for d in range(10)]),
        }
      ),
      supervised_keys=("image", "label"),
      homepage="https://archive.ics.uci.edu/dataset/80",
    )

  # tfds prints "Downloading and preparing dataset Unknown size ..." and "... downloaded
  # and prepared" around every build; nothing downloads here, and the pipeline logs the
  # build itself (`tfds_source`).
  def _log_download_bytes(self) -> None:
    pass

  def _log_download_done(self) -> None:
    pass

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # Nothing to download: the data ships with scikit-learn.
    images, labels = digits_arrays()
    return {
      name: self._generate_examples(images, labels, idx) for name, idx in split_indices().items()
    }

  def _generate_examples(
    self, images: np.ndarray, labels: np.ndarray, indices: np.ndarray
  ) -> Iterator[tuple[int, dict]]:
    for i in indices:
      # The key is the scikit-learn index, so each stored example can be traced back.
      yield int(i), {"image": images[i], "label": int(labels[i])}
