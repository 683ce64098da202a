"""Position embeddings of ViT (paper Sec. 3.1 and Appendix D.4) and their resizing.

Kinds:
  * ``learn``: learned 1-D table over the token sequence, ``pos_embedding`` [1, N(+1), D]
    (the official checkpoints' layout; the class token has its own row).
  * ``learn_2d``: an X-table [1, 1, gw, D/2] and a Y-table [1, gh, 1, D/2], concatenated by
    each patch's coordinates. The class token gets no position embedding (it is itself
    a learned vector, so a row for it would be redundant).
  * ``sincos2d``: fixed 2-D sine-cosine features, no parameters.
  * ``none``: nothing is added.
"""
from __future__ import annotations

from typing import Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

PosembKind = Literal["learn", "learn_2d", "sincos2d", "none"]
POSEMB_KINDS: tuple[str, ...] = ("learn", "learn_2d", "sincos2d", "none")


def sincos_2d(grid_hw: tuple[int, int], width: int, temperature: float = 10_000.0) -> np.ndarray:
  """Fixed 2-D sine-cosine position features, [gh * gw, D] (row-major patch order)."""
  if width % 4:
    raise ValueError(f"sincos2d position embeddings need a width divisible by 4, got {width}.")
  gh, gw = grid_hw
  y, x = np.meshgrid(np.arange(gh, dtype=np.float64), np.arange(gw, dtype=np.float64),
                     indexing="ij")
  omega = 1.0 / temperature ** (np.arange(width // 4) / (width // 4))  # [D/4]
  y_angles = y.reshape(-1, 1) * omega  # [N, D/4]
  x_angles = x.reshape(-1, 1) * omega  # [N, D/4]
  return np.concatenate(
      [np.sin(x_angles), np.cos(x_angles), np.sin(y_angles), np.cos(y_angles)],
      axis=1).astype(np.float32)


class AddPositionEmbs(nn.Module):
  """Adds position embeddings of the chosen kind to [B, N(+1), D] tokens.

  ``grid_hw`` is the patch grid; ``num_prefix`` is 1 when a class token leads the sequence.
  """
  kind: PosembKind
  grid_hw: tuple[int, int]
  num_prefix: int
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    _, n, d = x.shape  # [B, N(+1), D]
    gh, gw = self.grid_hw
    if n != gh * gw + self.num_prefix:
      raise ValueError(f"{n} tokens do not match a {gh}x{gw} grid plus {self.num_prefix} prefix.")
    if self.kind == "none":
      return x
    if self.kind == "learn":
      init = nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02),
                                          (None, None, "embed"))
      posemb = self.param("pos_embedding", init, (1, n, d), self.param_dtype)
      return x + posemb.astype(x.dtype)
    if self.kind == "learn_2d":
      if d % 2:
        raise ValueError(f"learn_2d position embeddings need an even width, got {d}.")
      init = nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02),
                                          (None, None, None, "embed"))
      pe_x = self.param("pos_embedding_x", init, (1, 1, gw, d // 2), self.param_dtype)
      pe_y = self.param("pos_embedding_y", init, (1, gh, 1, d // 2), self.param_dtype)
      grid = jnp.concatenate([jnp.broadcast_to(pe_x, (1, gh, gw, d // 2)),
                              jnp.broadcast_to(pe_y, (1, gh, gw, d // 2))], axis=-1)
      posemb = grid.reshape(1, gh * gw, d)  # [1, N, D]
    elif self.kind == "sincos2d":
      posemb = jnp.asarray(sincos_2d(self.grid_hw, d))[None]  # [1, N, D]
    else:
      raise ValueError(f"Unknown position embedding kind {self.kind!r}; "
                       f"choose one of {POSEMB_KINDS}.")
    posemb = jnp.pad(posemb, ((0, 0), (self.num_prefix, 0), (0, 0)))  # no embedding for cls
    return x + posemb.astype(x.dtype)


def resize_grid(grid: np.ndarray, new_hw: tuple[int, int], method: str = "bilinear") -> np.ndarray:
  """Resizes a [gh, gw, D] embedding grid to [new_h, new_w, D] by 2-D interpolation.

  Interpolation follows the patches' locations in the image (paper Sec. 3.2): pixel
  centres are aligned, as `jax.image.resize` does, and the arithmetic is float32.
  """
  if method not in ("bilinear", "bicubic", "nearest"):
    raise ValueError(f"Unknown resize method {method!r}; use 'bilinear', 'bicubic' or 'nearest'.")
  grid = np.asarray(grid, np.float32)
  if tuple(grid.shape[:2]) == tuple(new_hw):
    return grid
  resized = jax.image.resize(jnp.asarray(grid), (*new_hw, grid.shape[-1]), method=method,
                             antialias=False)
  return np.asarray(resized, np.float32)
