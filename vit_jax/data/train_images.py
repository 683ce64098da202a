"""What a train batch's 'image' holds: one record that the pipeline writes by and the train
step reads by, so the two ends agree by type rather than by convention.

    images = settings.train_images                 # data.Settings -> TrainImages
    images.encode_into(crop, row)                  # the pipeline, per example (numpy)
    augment = images.augmenter(mesh)               # the step (None: nothing to do)

Two encodings, both float32 [B, crop, crop, 3]:

* normalised (``randaug`` None): ``(x / 255 - mean) / std``, fed to the model as it is;
* raw (``randaug`` = (layers, magnitude)): the crops' uint8 values 0..255 (rounded half
  to even), which the compiled step augments with RandAugment and then normalises with
  the same mean and std (`randaug.make_augmenter`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:
  import jax
  import numpy as np

RGB = tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class TrainImages:
  """The train images' encoding: the model's mean and std, and RandAugment's (layers,
  magnitude) when the step augments (config.pp.randaug)."""

  mean: RGB
  std: RGB
  randaug: Optional[tuple[int, float]] = None

  @property
  def raw(self) -> bool:
    """Whether the batches hold the crops' uint8 values (the step normalises them)."""
    return self.randaug is not None

  def encode_into(self, pixels: np.ndarray, out: np.ndarray) -> None:
    """A train crop (float32 or uint8 [crop, crop, 3], 0..255) -> ``out``, float32 of the
    same shape, in this encoding (in place where ``out`` is ``pixels``)."""
    from vit_jax.data import host_images  # pylint: disable=g-import-not-at-top  (the workers')

    host_images.normalize_into(pixels, out, self.raw, self.mean, self.std)

  def augmenter(
    self, mesh: Optional[jax.sharding.Mesh] = None
  ) -> Optional[Callable[[dict, jax.Array], dict]]:
    """The step's ``(batch, rng) -> batch`` that turns this encoding into the model's
    input (RandAugment, then normalisation); None for normalised batches."""
    from vit_jax.data import randaug  # pylint: disable=g-import-not-at-top  (JAX: the step's)

    return randaug.make_augmenter(self.randaug, self.mean, self.std, mesh)
