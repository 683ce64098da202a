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
timm's NaFlexViT (``timm/models/naflexvit.py``) resizes the table to each image's grid
with its own mode (bicubic by default), antialiasing and ``pos_embed_ar_preserving``
(resized to the longer side's square, then cropped): `TableResample` says which. Both
resize with the output's pixel centres as F.interpolate(align_corners=False) does, which
`jax.image.scale_and_translate` computes; a canvas larger than the grid leaves its first
rows and columns as they are.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import flax.struct
import jax
import jax.numpy as jnp

from vit_jax.infra import errors
from vit_jax.infra.image_constants import NAFLEX_MAX_SIDE, NAFLEX_PACKED_FIELDS


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

  @classmethod
  def unpack(cls, rows: jax.Array) -> "NaFlexPatches":
    """A batch as the input pipeline packs it, float32 [B, N, P * P * C + 3]
    (`image_constants.NAFLEX_PACKED_FIELDS`: each patch's pixels, row, column, mask)."""
    k = NAFLEX_PACKED_FIELDS
    return cls(
      patches=rows[..., :-k],
      coords=rows[..., -k : -k + 2].astype(jnp.int32),
      mask=rows[..., -1] > 0.5,
    )

  @property
  def grid_hw(self) -> jax.Array:
    """int32 [B, 2]: each image's grid of patches (rows, columns)."""
    return self.coords.max(axis=1) + 1


RESAMPLE_METHODS: tuple[str, ...] = ("bilinear", "bicubic")  # config.model.posemb_resample


def check_model(settings: Any, what: str = "NaFlex inputs") -> None:
  """One ConfigError unless the ViT ``settings`` describe takes NaFlex inputs: a plain ViT
  (no ResNet hybrid, Axial-ViT, relative or rotary positions, whose tables follow one
  grid) with a learned absolute table that may be resized (``posemb_resample``)."""
  if settings.resnet is not None or settings.axial or settings.rope is not None:
    raise errors.ConfigError(
      f"{what} take a plain ViT with learned absolute positions, not a ResNet hybrid, an "
      "Axial-ViT or rotary embeddings (their positions follow one grid)."
    )
  if settings.posemb != "learn" or settings.posemb_resample is None:
    why = "a table read at one grid" if settings.posemb == "learn" else repr(settings.posemb)
    raise errors.ConfigError(
      f"{what} take a learned position table that is resized to each image's grid "
      f"(config.model.posemb='learn'), not {why}."
    )


@dataclasses.dataclass(frozen=True)
class TableResample:
  """How the learned position table [gh, gw, D] becomes an image's grid: big_vision's
  NaFlex (the defaults) or timm's NaFlexViT (``pos_embed_interp_mode``,
  ``pos_embed_antialias``, ``pos_embed_ar_preserving``)."""

  method: str = "bilinear"  # `RESAMPLE_METHODS`
  antialias: bool = True
  keep_aspect: bool = False  # the longer side's square, cropped to the grid (timm's)

  def resize(self, table: jax.Array, grid: jax.Array, out_hw: tuple[int, int]) -> jax.Array:
    """``table`` [gh, gw, D] at ``grid`` (rows, columns), its first ``out_hw`` cells
    [h, w, D] (``out_hw`` >= the grid: a canvas whose top-left corner is the grid)."""
    grid = jnp.asarray(grid, jnp.float32)
    target = jnp.broadcast_to(grid.max(), (2,)) if self.keep_aspect else grid
    return jax.image.scale_and_translate(
      table,
      shape=(*out_hw, table.shape[-1]),
      spatial_dims=(0, 1),
      scale=target / jnp.asarray(table.shape[:2], jnp.float32),
      translation=jnp.zeros((2,), jnp.float32),
      method=self.method,
      antialias=self.antialias,
    )


def resample_positions(
  table: jax.Array,
  grid_hw: jax.Array,
  coords: jax.Array,
  how: TableResample = TableResample(),
  max_side: int = NAFLEX_MAX_SIDE,
) -> jax.Array:
  """Position embeddings of each patch [B, N, D]: the learned ``table`` [gh, gw, D]
  resized (``how``) to each image's grid ``grid_hw`` [B, 2], read at the patches'
  ``coords`` [B, N, 2]."""

  def one(grid: jax.Array, where: jax.Array) -> jax.Array:
    canvas = how.resize(table, grid, (max_side, max_side))  # [S, S, D]: the grid top-left
    inside = (where < max_side).all(-1, keepdims=True)  # [N, 1]
    rows = canvas[jnp.minimum(where[:, 0], max_side - 1), jnp.minimum(where[:, 1], max_side - 1)]
    return jnp.where(inside, rows, jnp.nan)  # [N, D]

  return jax.vmap(one)(grid_hw.astype(jnp.float32), coords)
