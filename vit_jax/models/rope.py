"""Rotary position embeddings (RoPE) of the 2026 ViT families, on a grid of patches.

Queries and keys of the patch tokens are rotated, pair of channels by pair of channels, by
angles that grow with the patch's row and column; prefix tokens (class token, registers)
are left as they are. Two kinds, each equal to timm's (`timm.layers.pos_embed_sincos`):

- `EVA` (timm's ``RotaryEmbeddingCat`` with ``in_pixels=False``: EVA-02, Perception
  Encoder, Naver's axial RoPE-ViT): integer row/column indices (plus ``grid_offset``,
  rescaled to ``ref_grid`` when the grid differs from the pre-training one), frequencies
  1 / temperature ** (i / n) for i < n = head_dim / 4.
- `DINOV3` (timm's ``RotaryEmbeddingDinoV3``): patch centres normalised to [-1, 1] (each
  axis by its own size, or both by the smaller or larger one), periods
  temperature ** (2 i / (head_dim / 2)), angles 2 pi x / period.

The first half of each angle table holds the row angles, the second the column angles.
``rotate_half`` chooses how channels pair up: channel i with i + head_dim / 2 (the "half"
layout, GPT-NeoX / DINOv3) or channel 2i with 2i + 1 (interleaved, EVA-02). The tables are
numpy constants of the grid, computed in float32 at trace time.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import errors

EVA = "eva"
DINOV3 = "dinov3"
KINDS = (EVA, DINOV3)
NORMALIZE_COORDS = ("separate", "min", "max")
TEMPERATURE = 10_000.0  # timm's default (EVA-02); DINOv3 sets 100


@dataclasses.dataclass(frozen=True)
class Rope:
  """One family's rotary embedding (see the module docstring)."""

  kind: str
  temperature: float
  rotate_half: bool
  grid_offset: float = 0.0
  normalize_coords: str = "separate"  # DINOv3
  ref_grid: Optional[tuple[int, int]] = None  # EVA: the pre-training grid, (gh, gw)

  def __post_init__(self):
    if self.kind not in KINDS:
      raise errors.ConfigError(f"rope kind={self.kind!r}; choose one of {KINDS}.")
    if self.normalize_coords not in NORMALIZE_COORDS:
      raise errors.ConfigError(
        f"rope normalize_coords={self.normalize_coords!r}; choose one of {NORMALIZE_COORDS}."
      )
    if not self.temperature > 0:
      raise errors.ConfigError(f"rope temperature={self.temperature} must be positive.")

  def _coordinates(self, grid_hw: tuple[int, int]) -> list[np.ndarray]:
    """Per axis, the positions of its rows or columns: [gh], [gw]."""
    if self.kind == EVA:
      axes = [np.arange(n, dtype=np.float32) + np.float32(self.grid_offset) for n in grid_hw]
      if self.ref_grid is not None:
        axes = [a / np.float32(n) * np.float32(r) for a, n, r in zip(axes, grid_hw, self.ref_grid)]
      return axes
    denominators = {
      "separate": grid_hw,
      "min": (min(grid_hw),) * 2,
      "max": (max(grid_hw),) * 2,
    }[self.normalize_coords]
    return [
      2.0 * ((np.arange(0.5, n, dtype=np.float32) + np.float32(self.grid_offset)) / np.float32(d))
      - 1.0
      for n, d in zip(grid_hw, denominators)
    ]

  def _angles(self, grid: np.ndarray, head_dim: int) -> np.ndarray:
    """[N, 2] positions -> [N, 2, head_dim / 4] angles, in timm's order of operations."""
    n = head_dim // 4
    if self.kind == EVA:
      bands = 1.0 / np.float32(self.temperature) ** (np.arange(n, dtype=np.float32) / n)
      return grid[:, :, None] * bands.astype(np.float32)
    exponents = 2.0 * np.arange(n, dtype=np.float32) / (head_dim // 2)
    periods = (np.float32(self.temperature) ** exponents.astype(np.float32)).astype(np.float32)
    return np.float32(2 * math.pi) * grid[:, :, None] / periods

  def sin_cos(self, grid_hw: tuple[int, int], head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 [gh * gw, head_dim] sines and cosines of the patches, row-major."""
    if head_dim % 4:
      raise errors.ConfigError(f"RoPE needs a head width divisible by 4, not {head_dim}.")
    rows, cols = self._coordinates(grid_hw)
    grid = np.stack(np.meshgrid(rows, cols, indexing="ij"), axis=-1).reshape(-1, 2)  # [N, 2]
    angles = self._angles(grid.astype(np.float32), head_dim).reshape(len(grid), -1)  # [N, D/2]
    if self.rotate_half:
      angles = np.concatenate([angles, angles], axis=-1)
    else:
      angles = np.repeat(angles, 2, axis=-1)
    return np.sin(angles).astype(np.float32), np.cos(angles).astype(np.float32)  # [N, D]


def _rotated(x: jax.Array, rotate_half: bool) -> jax.Array:
  """The partner of each channel, negated where the rotation needs it."""
  if rotate_half:
    first, second = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-second, first], axis=-1)
  pairs = x.reshape(*x.shape[:-1], -1, 2)  # [..., D/2, 2]
  return jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)


def apply(
  x: jax.Array, sin: jax.Array, cos: jax.Array, rotate_half: bool, num_prefix: int = 0
) -> jax.Array:
  """Rotates the patch tokens of queries or keys x [..., N, D] (the first ``num_prefix``
  tokens unrotated) by tables [N - num_prefix, D]; computed in float32, returned in x's
  dtype (as timm, which keeps the tables' precision until the rotation is done)."""
  prefix, patches = x[..., :num_prefix, :], x[..., num_prefix:, :]
  wide = patches.astype(jnp.float32)
  rotated = wide * cos + _rotated(wide, rotate_half) * sin
  return jnp.concatenate([prefix, rotated.astype(x.dtype)], axis=-2)


@dataclasses.dataclass(frozen=True)
class RotaryPositions:
  """What an attention layer needs to rotate its queries and keys: the family's `Rope`, the
  patch grid and the prefix tokens before it (left unrotated)."""

  rope: Rope
  grid_hw: tuple[int, int]
  num_prefix: int

  def rotate(self, x: jax.Array, heads_first: bool = True) -> jax.Array:
    """Queries or keys [B, H, N, Dh] (``heads_first``) or [B, N, H, Dh], rotated."""
    sin, cos = self.rope.sin_cos(self.grid_hw, x.shape[-1])  # [N - P, Dh] each
    if heads_first:
      return apply(x, sin, cos, self.rope.rotate_half, self.num_prefix)
    moved = jnp.swapaxes(x, 1, 2)  # [B, H, N, Dh]
    rotated = apply(moved, sin, cos, self.rope.rotate_half, self.num_prefix)
    return jnp.swapaxes(rotated, 1, 2)  # [B, N, H, Dh]
