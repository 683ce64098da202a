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
"""

from __future__ import annotations

import pathlib
from typing import Iterator

import numpy as np
import tensorflow_datasets as tfds

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
