"""Images as NaFlex patch sequences (numpy, for the decode workers and for Python use):
each image resized, keeping its aspect ratio, to the largest patch grid within a sequence
budget, cut into patches and padded to the budget.

    patches, coords, mask = to_patches(pixels, patch=16, budget=256)  # one image
    batch = NaFlexPatches.stack([to_patches(p, 16, 256) for p in images])  # the model's
    batch = NaFlexPatches(*prepare(["a.jpg", "b.png"], 16, 256))  # files, PIL, arrays

The grid follows big_vision's ``resize_to_sequence`` (``pp/proj/image_text/ops_naflex.py``):
a binary search for the largest scale r whose grid ceil(h r / P) x ceil(w r / P) (at least
one patch a side) holds at most ``budget`` patches; the patches are its ``patchify`` (each
patch's pixels in (row, column, channel) order, the patches in row-major order). The resize
is Pillow's antialiased bilinear (big_vision's is TensorFlow's antialiased bilinear).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np

from vit_jax.data import eval_images, host_images
from vit_jax.infra import errors
from vit_jax.infra.image_constants import (
  NAFLEX_MAX_SIDE,
  NAFLEX_PACKED_FIELDS,
  OFFICIAL_INPUT_MEAN,
  OFFICIAL_INPUT_STD,
)

_EPS = 1e-5  # the binary search's resolution on the scale (big_vision's)


@dataclasses.dataclass(frozen=True)
class NaFlexInputs:
  """A run's NaFlex images (config.pp.seq_len): ``seq_len`` patches of ``patch`` pixels a
  side, each example one packed row array (`pack`) in place of a square crop."""

  patch: int
  seq_len: int

  @property
  def row_shape(self) -> tuple[int, int]:
    """One example's packed array: [seq_len, P * P * 3 + `NAFLEX_PACKED_FIELDS`]."""
    return self.seq_len, self.patch * self.patch * 3 + NAFLEX_PACKED_FIELDS

  def pack_into(
    self,
    pixels: np.ndarray,
    mean: Sequence[float],
    std: Sequence[float],
    out: Optional[np.ndarray] = None,
  ) -> np.ndarray:
    """An image (uint8 [H, W, 3]) packed into ``out`` (`row_shape`; None: a new array)."""
    return pack(*to_patches(pixels, self.patch, self.seq_len, mean, std), out=out)


def sequence_grid(image_hw: tuple[int, int], patch: int, budget: int) -> tuple[int, int]:
  """The patch grid (rows, columns) of an image of ``image_hw`` pixels at ``budget``."""
  if budget < 1 or patch < 1 or min(image_hw) < 1:
    raise errors.ConfigError(
      f"NaFlex needs a budget >= 1 patch, a patch size >= 1 and an image (got budget="
      f"{budget}, patch={patch}, image {image_hw[0]}x{image_hw[1]})."
    )
  hw, eps = np.asarray(image_hw, np.float32), np.float32(_EPS)  # float32, as big_vision's

  def grid(ratio: np.float32) -> tuple[int, int]:
    target = np.maximum(patch * np.ceil(hw * ratio / np.float32(patch)), patch)
    return int(target[0]) // patch, int(target[1]) // patch

  low, high = eps / np.float32(10), np.float32(100.0)
  while high - low >= eps:
    mid = (low + high) / np.float32(2)
    rows, columns = grid(mid)
    low, high = (mid, high) if rows * columns <= budget else (low, mid)
  return grid(low)


def to_patches(
  pixels: np.ndarray,
  patch: int,
  budget: int,
  mean: Sequence[float] = OFFICIAL_INPUT_MEAN,
  std: Sequence[float] = OFFICIAL_INPUT_STD,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """An image (uint8 [H, W, 3]) -> (patches float32 [budget, P * P * 3] normalised with
  ``mean``/``std`` of the 0..1 scale, coords int32 [budget, 2], mask bool [budget])."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  rows, columns = sequence_grid(pixels.shape[:2], patch, budget)
  if max(rows, columns) > NAFLEX_MAX_SIDE:
    raise errors.ConfigError(
      f"A {pixels.shape[0]}x{pixels.shape[1]} image at {budget} patches is a {rows}x{columns} "
      f"grid; the position table reaches {NAFLEX_MAX_SIDE} patches a side: use a smaller "
      "budget or crop the image nearer to square."
    )
  image = Image.fromarray(np.asarray(pixels, np.uint8)).resize(
    (columns * patch, rows * patch), Image.Resampling.BILINEAR
  )
  normalised = host_images.normalize(np.asarray(image), mean, std)  # [rows * P, columns * P, 3]
  cut = normalised.reshape(rows, patch, columns, patch, 3).transpose(0, 2, 1, 3, 4)
  n = rows * columns
  patches = np.zeros((budget, patch * patch * 3), np.float32)
  patches[:n] = cut.reshape(n, -1)
  coords = np.zeros((budget, 2), np.int32)
  coords[:n] = np.stack(np.divmod(np.arange(n), columns), axis=-1)
  return patches, coords, np.arange(budget) < n


def pack(
  patches: np.ndarray, coords: np.ndarray, mask: np.ndarray, out: Optional[np.ndarray] = None
) -> np.ndarray:
  """`to_patches`' arrays as one float32 [budget, P * P * 3 + 3]: each patch's pixels, row,
  column, then 1.0 for a patch of the image or 0.0 for padding (what the input pipeline
  carries; `models.naflex.NaFlexPatches.unpack` reads it)."""
  k = patches.shape[-1]
  if out is None:
    out = np.empty((len(patches), k + NAFLEX_PACKED_FIELDS), np.float32)
  out[:, :k] = patches
  out[:, k : k + 2] = coords
  out[:, k + 2] = mask
  return out


def prepare(
  images: Any,
  patch: int,
  budget: int,
  mean: Sequence[float] = OFFICIAL_INPUT_MEAN,
  std: Sequence[float] = OFFICIAL_INPUT_STD,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Images (paths, bytes, PIL images, uint8 arrays, or a list of them: what
  `host_images.prepare` takes) -> `to_patches` of each, stacked: patches [B, budget,
  P * P * 3], coords [B, budget, 2], mask [B, budget]."""
  rows = [
    to_patches(np.asarray(eval_images.to_pil(item)), patch, budget, mean, std)
    for item in eval_images.image_list(images)
  ]
  patches, coords, mask = (np.stack(part) for part in zip(*rows))
  return patches, coords, mask
