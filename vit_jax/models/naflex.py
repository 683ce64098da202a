"""NaFlex inputs (NaViT + FlexiViT, as SigLIP 2's NaFlex towers and timm's NaFlexViT): each
image at its own aspect ratio, cut into patches, padded to a sequence budget.

    batch = NaFlexPatches(patches, coords, mask)  # what `VisionTransformer` takes instead
    logits = model.apply(params, batch)            # of [B, H, W, C] images

An image of h x w patches fills the first h * w rows of its sequence in row-major order;
the rest is padding (mask False, coordinates (0, 0)). The model embeds each patch with the
square path's patch kernel, adds the learned position table resampled to the image's own
grid (`resample_positions`), lets only real tokens attend to each other and pools over
them (MAP head or mean). Everything else is the ViT's.

Where this follows big_vision (``big_vision/models/proj/image_text/naflex_vit.py``): the
table resized with antialiased bilinear interpolation into a fixed ``max_side`` canvas,
per image, then read at each patch's (row, column); a grid side above ``max_side``
reads outside the canvas, NaN, as big_vision's (`image_constants.NAFLEX_MAX_SIDE`).
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.struct
import jax
import jax.numpy as jnp

from vit_jax.image_constants import NAFLEX_MAX_SIDE


@flax.struct.dataclass
class NaFlexPatches:
  """A batch of images as padded patch sequences; B images, N the sequence budget."""

  patches: jax.Array  # [B, N, ph * pw * C]: each patch's pixels (row, column, channel)
  coords: jax.Array  # int32 [B, N, 2]: each patch's (row, column) in its image's grid
  mask: jax.Array  # bool [B, N]: True a patch of the image, False padding

  @classmethod
  def stack(cls, examples: Sequence[tuple[Any, Any, Any]]) -> "NaFlexPatches":
    """A batch of (patches, coords, mask) of one budget (`data.naflex_images.to_patches`)."""
    patches, coords, mask = (jnp.stack(parts) for parts in zip(*examples))
    return cls(patches=patches, coords=coords, mask=mask)

  @property
  def grid_hw(self) -> jax.Array:
    """int32 [B, 2]: each image's grid of patches (rows, columns)."""
    return self.coords.max(axis=1) + 1


def resample_positions(
  table: jax.Array, grid_hw: jax.Array, coords: jax.Array, max_side: int = NAFLEX_MAX_SIDE
) -> jax.Array:
  """Position embeddings of each patch [B, N, D]: the learned ``table`` [gh, gw, D]
  resized (bilinear, antialiased) to each image's grid ``grid_hw`` [B, 2], read at the
  patches' ``coords`` [B, N, 2]."""

  def one(grid: jax.Array, where: jax.Array) -> jax.Array:
    canvas = jax.image.scale_and_translate(
      table,
      shape=(max_side, max_side, table.shape[-1]),
      spatial_dims=(0, 1),
      scale=grid / jnp.asarray(table.shape[:2], jnp.float32),
      translation=jnp.zeros((2,), jnp.float32),
      method="bilinear",
      antialias=True,
    )  # [max_side, max_side, D]: the image's grid in its top-left corner
    inside = (where < max_side).all(-1, keepdims=True)  # [N, 1]
    rows = canvas[jnp.minimum(where[:, 0], max_side - 1), jnp.minimum(where[:, 1], max_side - 1)]
    return jnp.where(inside, rows, jnp.nan)  # [N, D]

  return jax.vmap(one)(grid_hw.astype(jnp.float32), coords)
