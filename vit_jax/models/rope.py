"""Rotary position embeddings (RoPE) of the 2026 ViT families, on a grid of patches.

Queries and keys of the patch tokens are rotated, pair of channels by pair of channels, by
angles that grow with the patch's row and column; prefix tokens (class token, registers)
are left as they are. Three kinds, each equal to timm's (`timm.layers.pos_embed_sincos`):

- `EVA` (timm's ``RotaryEmbeddingCat`` with ``in_pixels=False``: EVA-02, Perception
  Encoder, Naver's axial RoPE-ViT): integer row/column indices (plus ``grid_offset``,
  rescaled to ``ref_grid`` when the grid differs from the pre-training one), frequencies
  1 / temperature ** (i / n) for i < n = head_dim / 4.
- `DINOV3` (timm's ``RotaryEmbeddingDinoV3``): patch centres normalised to [-1, 1] (each
  axis by its own size, or both by the smaller or larger one), periods
  temperature ** (2 i / (head_dim / 2)), angles 2 pi x / period.

- `MIXED` (timm's ``RotaryEmbeddingMixed``, Naver's RoPE-Mixed): learned frequencies, per
  layer and head, of both axes at once: angle = x * fx + y * fy per channel pair, the
  [2, H, Dh / 2] frequencies a parameter of each attention layer (`mixed_sin_cos`,
  initialised as timm's `init_mixed_freqs`); integer positions, no offset or rescaling.

The first half of each angle table holds the row angles, the second the column angles
(``grid_indexing`` 'ij'); 'xy' (timm's ``rope_grid_indexing='xy'``: PE, RoPE-ViT) swaps
them, columns first: the patches stay in row-major order either way.
``rotate_half`` chooses how channels pair up: channel i with i + head_dim / 2 (the "half"
layout, GPT-NeoX / DINOv3) or channel 2i with 2i + 1 (interleaved, EVA-02). The tables of
the fixed kinds are numpy constants of the grid, computed in float32 at trace time; mixed
RoPE's follow its parameter, in float32.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.infra import errors

EVA = "eva"
DINOV3 = "dinov3"
MIXED = "mixed"
KINDS = (EVA, DINOV3, MIXED)
NORMALIZE_COORDS = ("separate", "min", "max")
GRID_INDEXINGS = ("ij", "xy")  # coordinate channels (row, column) or (column, row)
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
  grid_indexing: str = "ij"  # `GRID_INDEXINGS`

  def __post_init__(self):
    if self.kind not in KINDS:
      raise errors.ConfigError(f"rope kind={self.kind!r}; choose one of {KINDS}.")
    if self.normalize_coords not in NORMALIZE_COORDS:
      raise errors.ConfigError(
        f"rope normalize_coords={self.normalize_coords!r}; choose one of {NORMALIZE_COORDS}."
      )
    if self.grid_indexing not in GRID_INDEXINGS:
      raise errors.ConfigError(
        f"rope grid_indexing={self.grid_indexing!r}; choose one of {GRID_INDEXINGS}."
      )
    if self.kind == MIXED and (self.rotate_half or self.grid_offset or self.ref_grid):
      raise errors.ConfigError(
        "mixed RoPE (timm's RotaryEmbeddingMixed) pairs channels 2i and 2i+1 at integer "
        "positions: set rotate_half=False, grid_offset=0 and no ref_grid."
      )
    if not self.temperature > 0:
      raise errors.ConfigError(f"rope temperature={self.temperature} must be positive.")

  def _coordinates(self, grid_hw: tuple[int, int]) -> list[np.ndarray]:
    """Per axis, the positions of its rows or columns: [gh], [gw]."""
    if self.kind in (EVA, MIXED):
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

  def positions(self, grid_hw: tuple[int, int]) -> np.ndarray:
    """float32 [gh * gw, 2] coordinates of the patches, row-major: (row, column) per patch,
    or (column, row) with ``grid_indexing`` 'xy'."""
    rows, cols = self._coordinates(grid_hw)
    grid = np.stack(np.meshgrid(rows, cols, indexing="ij"), axis=-1).reshape(-1, 2)  # [N, 2]
    return (grid[:, ::-1] if self.grid_indexing == "xy" else grid).astype(np.float32)

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
    if self.kind == MIXED:
      raise errors.ConfigError("mixed RoPE's tables follow its learned frequencies: mixed_sin_cos.")
    grid = self.positions(grid_hw)  # [N, 2]
    angles = self._angles(grid, head_dim).reshape(len(grid), -1)  # [N, D/2]
    angles = _layout(angles, self.rotate_half)
    return np.sin(angles).astype(np.float32), np.cos(angles).astype(np.float32)  # [N, D]


def _layout(angles: Any, rotate_half: bool) -> Any:
  """Per-pair angles [..., D/2] -> per-channel [..., D]: [a, a] (half) or each one twice."""
  xp = np if isinstance(angles, np.ndarray) else jnp
  if rotate_half:
    return xp.concatenate([angles, angles], axis=-1)
  return xp.repeat(angles, 2, axis=-1)


def init_mixed_freqs(temperature: float) -> Callable[[jax.Array, tuple[int, ...], Any], jax.Array]:
  """timm's ``init_random_2d_freqs`` for one layer: [2, H, Dh / 2] frequencies (x's, then
  y's), magnitudes 1 / temperature ** (4 i / Dh) at a random angle per head, each band
  pair at that angle and at a right angle to it."""

  def init(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
    _, h, half = shape
    head_dim = 2 * half
    mag = 1.0 / temperature ** (jnp.arange(0, head_dim, 4, dtype=jnp.float32) / head_dim)
    angle = jax.random.uniform(key, (h, 1), jnp.float32) * 2 * math.pi  # [H, 1]
    fx = jnp.concatenate([mag * jnp.cos(angle), mag * jnp.cos(angle + math.pi / 2)], -1)
    fy = jnp.concatenate([mag * jnp.sin(angle), mag * jnp.sin(angle + math.pi / 2)], -1)
    return jnp.stack([fx, fy]).astype(dtype)  # [2, H, Dh / 2]

  return init


def mixed_sin_cos(freqs: jax.Array, positions: np.ndarray) -> tuple[jax.Array, jax.Array]:
  """float32 [H, N, Dh] sines and cosines of mixed RoPE: frequencies [2, H, Dh / 2] (x's,
  y's) at positions [N, 2] (x, y: `Rope.positions`' channels), channels interleaved."""
  freqs = freqs.astype(jnp.float32)
  pos = jnp.asarray(positions)
  # As timm, elementwise outer products (the same rounding as its autocast-free path).
  angles = pos[None, :, 0:1] * freqs[0][:, None, :] + pos[None, :, 1:2] * freqs[1][:, None, :]
  angles = _layout(angles, rotate_half=False)  # [H, N, Dh]
  return jnp.sin(angles), jnp.cos(angles)


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

  def rotate(
    self, x: jax.Array, heads_first: bool = True, freqs: Optional[jax.Array] = None
  ) -> jax.Array:
    """Queries or keys [B, H, N, Dh] (``heads_first``) or [B, N, H, Dh], rotated; ``freqs``
    [2, H, Dh / 2]: the layer's learned frequencies of mixed RoPE."""
    if self.rope.kind == MIXED:
      assert freqs is not None, "mixed RoPE rotates by the layer's learned frequencies"
      sin, cos = mixed_sin_cos(freqs, self.rope.positions(self.grid_hw))  # [H, N - P, Dh]
    else:
      sin, cos = self.rope.sin_cos(self.grid_hw, x.shape[-1])  # [N - P, Dh] each
    if heads_first:
      return apply(x, sin, cos, self.rope.rotate_half, self.num_prefix)
    moved = jnp.swapaxes(x, 1, 2)  # [B, H, N, Dh]
    rotated = apply(moved, sin, cos, self.rope.rotate_half, self.num_prefix)
    return jnp.swapaxes(rotated, 1, 2)  # [B, N, H, Dh]
