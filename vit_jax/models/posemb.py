"""Position embeddings of ViT (paper Sec. 3.1 and Appendix D.4) and their resizing.

Kinds:
  * ``learn``: learned 1-D table over the token sequence, ``pos_embedding`` [1, N(+1), D]
    (the official checkpoints' layout; the class token has its own row).
  * ``learn_2d``: an X-table [1, 1, gw, D/2] and a Y-table [1, gh, 1, D/2], concatenated by
    each patch's coordinates. The class token gets no position embedding (it is itself
    a learned vector, so a row for it would be redundant).
  * ``sincos2d``: fixed 2-D sine-cosine features, no parameters.
  * ``none``: nothing is added.
  * ``relative``: nothing is added to the tokens; every attention layer learns one
    embedding per query-key offset and adds the query's product with it to the attention
    logits (Appendix D.4, `RelativePositions`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.infra import errors
from vit_jax.infra.sharding import EMBED, HEADS, KV
from vit_jax.models import naflex
from vit_jax.models.naflex import NaFlexPatches

PosembKind = Literal["learn", "learn_2d", "sincos2d", "none", "relative"]
RELATIVE = "relative"  # the kind whose embeddings live in the attention layers
POSEMB_KINDS: tuple[str, ...] = ("learn", "learn_2d", "sincos2d", "none", RELATIVE)
RELATIVE_EMBEDDING = "relative_embedding"  # an attention layer's offset table [O, H, Dh]
RESIZE_METHODS: tuple[str, ...] = ("bilinear", "bicubic", "nearest")  # jax.image.resize's
POSEMB_REINIT = "reinit"  # fine-tuning: fresh position embeddings instead of resized ones
POSEMB_RESIZE_METHODS: tuple[str, ...] = (*RESIZE_METHODS, POSEMB_REINIT)  # config.posemb_resize
# The width each kind needs to be divisible by: learn_2d gives each axis half the width,
# sincos2d a sine and a cosine per axis.
_WIDTH_MULTIPLE = {"learn_2d": 2, "sincos2d": 4}


def check_posemb(kind: str, width: int) -> None:
  """Raises ConfigError unless ``kind`` is one of `POSEMB_KINDS` that a model of
  ``width`` can have (run by `vit_jax.models.settings.ModelSettings` and the module)."""
  if kind not in POSEMB_KINDS:
    raise errors.ConfigError(f"Unknown config.model.posemb={kind!r}; choose one of {POSEMB_KINDS}.")
  multiple = _WIDTH_MULTIPLE.get(kind, 1)
  if width % multiple:
    raise errors.ConfigError(
      f"{kind} position embeddings need a width (config.model.hidden_size) divisible by "
      f"{multiple}, got {width}."
    )


def check_resize_method(method: str) -> None:
  """Raises ConfigError unless ``method`` is one of `POSEMB_RESIZE_METHODS`."""
  if method not in POSEMB_RESIZE_METHODS:
    raise errors.ConfigError(
      f"Unknown config.posemb_resize={method!r}; use one of {POSEMB_RESIZE_METHODS}."
    )


def sincos_2d(grid_hw: tuple[int, int], width: int, temperature: float = 10_000.0) -> np.ndarray:
  """Fixed 2-D sine-cosine position features, [gh * gw, D] (row-major patch order)."""
  check_posemb("sincos2d", width)
  gh, gw = grid_hw
  y, x = np.meshgrid(
    np.arange(gh, dtype=np.float64), np.arange(gw, dtype=np.float64), indexing="ij"
  )
  omega = 1.0 / temperature ** (np.arange(width // 4) / (width // 4))  # [D/4]
  y_angles = y.reshape(-1, 1) * omega  # [N, D/4]
  x_angles = x.reshape(-1, 1) * omega  # [N, D/4]
  return np.concatenate(
    [np.sin(x_angles), np.cos(x_angles), np.sin(y_angles), np.cos(y_angles)], axis=1
  ).astype(np.float32)


class AddPositionEmbs(nn.Module):
  """Adds position embeddings of the chosen kind to [B, P + N, D] tokens.

  ``grid_hw`` is the patch grid; ``num_prefix`` the P tokens before the patches (class
  token, registers). ``embed_prefix``: the learned 1-D table has rows for them (the
  official layout), else it covers the patches only (timm's ``no_embed_class``).
  ``table_grid``: the learned table's own grid where it is not ``grid_hw``, resized to
  it by ``resample`` (a NaFlex tower's; None: the table is at ``grid_hw``).
  """

  kind: PosembKind
  grid_hw: tuple[int, int]
  num_prefix: int
  param_dtype: jnp.dtype = jnp.float32
  embed_prefix: bool = True
  table_grid: Optional[tuple[int, int]] = None
  resample: Optional[naflex.TableResample] = naflex.TableResample()

  @nn.compact
  def __call__(self, x: jax.Array, patches: Optional[NaFlexPatches] = None) -> jax.Array:
    """``patches``: NaFlex tokens [B, P + N, D] of images of any grid (`naflex`): the
    learned table, of ``grid_hw``, resampled to each image's grid."""
    if patches is not None:
      return self._naflex(x, patches)
    _, n, d = x.shape  # [B, N(+1), D]
    gh, gw = self.grid_hw
    if n != gh * gw + self.num_prefix:
      raise errors.ConfigError(
        f"{n} tokens do not match a {gh}x{gw} grid plus {self.num_prefix} prefix."
      )
    check_posemb(self.kind, d)
    if self.kind in ("none", RELATIVE):
      return x
    if self.kind == "learn" and self.table_grid not in (None, self.grid_hw):
      table, prefix = self._table(d)  # [th, tw, D], [1, P or 0, D]
      resized = self.resample.resize(table, self.grid_hw, self.grid_hw)  # [gh, gw, D]
      posemb = resized.reshape(1, gh * gw, d)
      if prefix.shape[1]:
        return x + jnp.concatenate([prefix, posemb], axis=1).astype(x.dtype)
    elif self.kind == "learn":
      init = nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02), (None, None, EMBED))
      rows = n if self.embed_prefix else gh * gw
      posemb = self.param("pos_embedding", init, (1, rows, d), self.param_dtype)
      if rows == n:
        return x + posemb.astype(x.dtype)
    elif self.kind == "learn_2d":
      init = nn.with_logical_partitioning(
        nn.initializers.normal(stddev=0.02), (None, None, None, EMBED)
      )
      pe_x = self.param("pos_embedding_x", init, (1, 1, gw, d // 2), self.param_dtype)
      pe_y = self.param("pos_embedding_y", init, (1, gh, 1, d // 2), self.param_dtype)
      grid = jnp.concatenate(
        [jnp.broadcast_to(pe_x, (1, gh, gw, d // 2)), jnp.broadcast_to(pe_y, (1, gh, gw, d // 2))],
        axis=-1,
      )
      posemb = grid.reshape(1, gh * gw, d)  # [1, N, D]
    else:  # sincos2d
      posemb = jnp.asarray(sincos_2d(self.grid_hw, d))[None]  # [1, N, D]
    posemb = jnp.pad(posemb, ((0, 0), (self.num_prefix, 0), (0, 0)))  # none for the prefix
    return x + posemb.astype(x.dtype)

  def _table(self, d: int) -> tuple[jax.Array, jax.Array]:
    """The learned table as a grid [th, tw, D] and its prefix rows [1, P or 0, D]."""
    if self.kind != "learn" or self.resample is None:
      raise errors.ConfigError(
        "Inputs of another grid (NaFlex inputs, or a table stored at its own grid) take "
        f"a learned table (posemb 'learn', not {self.kind!r}) that may be resized "
        "(posemb_resample not None: a table read at one grid takes one grid)."
      )
    th, tw = self.table_grid or self.grid_hw
    init = nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02), (None, None, EMBED))
    prefix = self.num_prefix if self.embed_prefix else 0
    posemb = self.param("pos_embedding", init, (1, prefix + th * tw, d), self.param_dtype)
    return posemb[0, prefix:].reshape(th, tw, d), posemb[:, :prefix]

  def _naflex(self, x: jax.Array, patches: NaFlexPatches) -> jax.Array:
    b, _, d = x.shape  # [B, P + N, D]
    table, prefix = self._table(d)  # [th, tw, D], [1, P or 0, D]
    per_patch = naflex.resample_positions(
      table, patches.grid_hw, patches.coords, self.resample
    )  # [B, N, D]
    if prefix.shape[1]:  # the table's first P rows
      prefix = jnp.broadcast_to(prefix, (b, self.num_prefix, d))
    else:
      prefix = jnp.zeros((b, self.num_prefix, d), per_patch.dtype)
    return x + jnp.concatenate([prefix, per_patch], axis=1).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class RelativePositions:
  """The query-key offsets of relative attention over ``num_prefix`` prefix tokens followed
  by ``num_patches`` patches (paper Appendix D.4, "1-dimensional Relative Attention").

  Offsets are taken along the patch sequence as it is flattened (row-major), as the
  paper's "1-dimensional" names it: query patch i and key patch j use the embedding of
  i - j, one of 2N - 1, whatever the grid (on a 2-D grid offset gw is one row down, offset
  1 one column right or, at a row's end, the next row's start). The Axial-ViT's row and
  column attentions give each axis its own 1-D sequence (`vit_jax.models.axial`). Prefix
  tokens (class token, registers) have no place in that sequence; as BEiT's relative
  position bias (three extra table entries), every pair with a prefix token uses one of
  three rows of its own: prefix query to patch key, patch query to prefix key, prefix to
  prefix.
  """

  num_patches: int
  num_prefix: int = 0

  @property
  def num_offsets(self) -> int:
    """Rows of the table: 2N - 1 offsets, then the three prefix rows when there is a prefix."""
    return 2 * self.num_patches - 1 + (_PREFIX_ROWS if self.num_prefix else 0)

  def index(self) -> np.ndarray:
    """[T, T] int32, T = P + N: the table row of each (query, key) pair."""
    n, p = self.num_patches, self.num_prefix
    position = np.arange(n)
    index = np.empty((p + n, p + n), np.int32)
    index[p:, p:] = position[:, None] - position[None, :] + n - 1  # i - j, shifted to >= 0
    first = 2 * n - 1  # the prefix rows follow the offsets
    index[:p, p:], index[p:, :p], index[:p, :p] = first, first + 1, first + 2
    return index


_PREFIX_ROWS = 3  # the relative table's rows for pairs with a prefix token


def relative_logits(q: jax.Array, table: jax.Array, positions: RelativePositions) -> jax.Array:
  """The relative attention's logits [B, H, T, T]: each query [B, H, T, Dh] against the
  embedding [O, H, Dh] of its offset to each key (the query as the content attention uses
  it, scaled by 1 / sqrt(Dh)).

  Each query meets each of the O table rows once (one product [B, H, T, O]), and the
  [T, T] offsets pick from it: O ~ 2T products instead of T x T gathered embeddings.
  """
  scores = jnp.einsum("bhqd,ohd->bhqo", q, table)  # [B, H, T, O]
  index = jnp.asarray(positions.index())[None, None]  # [1, 1, T, T]
  return jnp.take_along_axis(scores, index, axis=-1)  # [B, H, T, T]


def relative_table(
  module: nn.Module,
  positions: RelativePositions,
  num_heads: int,
  head_dim: int,
  param_dtype: jnp.dtype,
) -> jax.Array:
  """Declares an attention layer's offset table [O, H, Dh] on ``module``, N(0, 0.02^2) as
  the learned position tables."""
  init = nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02), (None, HEADS, KV))
  shape = (positions.num_offsets, num_heads, head_dim)
  return module.param(RELATIVE_EMBEDDING, init, shape, param_dtype)


def resize_relative(
  table: np.ndarray, new_num_patches: int, has_prefix: bool, method: str = "bilinear"
) -> np.ndarray:
  """An offset table [..., O, H, Dh] for a sequence of ``new_num_patches`` patches.

  The 2N - 1 patch offsets are interpolated as a 1-D table (centre on centre: offset 0
  stays offset 0, the largest offsets stay the largest); the prefix rows are kept. Along
  a flattened grid of another width an offset is another 2-D displacement, so this is a
  starting point for fine-tuning, as the interpolated absolute tables are.
  """
  table = np.asarray(table)
  offsets = table.shape[-3] - (_PREFIX_ROWS if has_prefix else 0)
  if offsets < 1 or offsets % 2 != 1:
    raise errors.CheckpointError(
      f"A relative position table of {table.shape[-3]} rows is not 2N - 1 offsets"
      f"{' plus 3 prefix rows' if has_prefix else ''}: load it into a model with the "
      "same prefix tokens."
    )
  patch_rows = np.moveaxis(table[..., :offsets, :, :], -3, 0)  # [2N - 1, ..., H, Dh]
  rest = patch_rows.shape[1:]
  new_offsets = 2 * new_num_patches - 1
  resized = resize_grid(patch_rows.reshape(offsets, 1, -1), (new_offsets, 1), method)
  resized = np.moveaxis(resized.reshape(new_offsets, *rest), 0, -3).astype(table.dtype)
  return np.concatenate([resized, table[..., offsets:, :, :]], axis=-3)


def resize_grid(grid: np.ndarray, new_hw: tuple[int, int], method: str = "bilinear") -> np.ndarray:
  """Resizes a [gh, gw, D] embedding grid to [new_h, new_w, D] by 2-D interpolation.

  Interpolation follows the patches' locations in the image (paper Sec. 3.2): pixel
  centres are aligned, as `jax.image.resize` does, and the arithmetic is float32.
  """
  if method not in RESIZE_METHODS:
    raise errors.ConfigError(f"Unknown resize method {method!r}; use one of {RESIZE_METHODS}.")
  grid = np.asarray(grid, np.float32)
  if tuple(grid.shape[:2]) == tuple(new_hw):
    return grid
  resized = jax.image.resize(
    jnp.asarray(grid), (*new_hw, grid.shape[-1]), method=method, antialias=False
  )
  return np.asarray(resized, np.float32)


def square_grid(num_tokens: int, fix: str) -> tuple[int, int]:
  """The (g, g) grid of ``num_tokens`` grid tokens; ``fix`` says what to pass otherwise."""
  side = math.isqrt(num_tokens)
  if side * side != num_tokens:
    raise errors.ConfigError(
      f"{num_tokens} position-embedding grid tokens do not form a square grid: {fix}."
    )
  return side, side


def resize_posemb(
  posemb: np.ndarray,
  new_grid_hw: tuple[int, int],
  num_prefix: int,
  stored_grid_hw: Optional[tuple[int, int]] = None,
  method: str = "bilinear",
) -> np.ndarray:
  """Resizes a learned table [1, num_prefix + gh*gw, D] to [1, num_prefix + nh*nw, D].

  The ``num_prefix`` leading rows (the class token's) are kept as they are; the grid rows
  (row-major, ``stored_grid_hw`` or else square) are 2-D interpolated by `resize_grid`.
  """
  posemb = np.asarray(posemb)
  if posemb.ndim != 3 or posemb.shape[0] != 1:
    raise errors.ConfigError(
      f"Expected a position embedding of shape [1, N, D], got {posemb.shape}."
    )
  if not 0 <= num_prefix <= posemb.shape[1]:
    raise errors.ConfigError(
      f"num_prefix={num_prefix} does not fit {posemb.shape[1]} rows: use 1 with "
      "a class token, else 0."
    )
  prefix, grid = posemb[:, :num_prefix], posemb[0, num_prefix:]  # [1, P, D], [N, D]
  n, d = grid.shape
  if stored_grid_hw is None:
    stored_grid_hw = square_grid(n, "pass stored_grid_hw=(height, width) of the stored grid")
  gh, gw = stored_grid_hw
  if gh * gw != n:
    raise errors.ConfigError(
      f"stored_grid_hw={tuple(stored_grid_hw)} has {gh * gw} cells, but the table "
      f"has {n} grid rows after {num_prefix} prefix rows: pass the grid it was "
      "trained on."
    )
  resized = resize_grid(grid.reshape(gh, gw, d), tuple(new_grid_hw), method)  # [nh, nw, D]
  return np.concatenate([prefix, resized.reshape(1, -1, d).astype(posemb.dtype)], axis=1)


def table_at_grid(posemb: np.ndarray, settings, grid_hw: tuple[int, int]) -> np.ndarray:
  """A learned table stored at ``settings.posemb_grid`` ([1, P + th * tw, D], P prefix rows
  or none) as the model resizes it for inputs of ``grid_hw``: [1, P + gh * gw, D], the table
  of a model fixed to that grid (an export)."""
  posemb = np.asarray(posemb, np.float32)
  th, tw = settings.posemb_grid
  prefix = posemb.shape[1] - th * tw
  d = posemb.shape[-1]
  table = jnp.asarray(posemb[0, prefix:].reshape(th, tw, d))
  resized = np.asarray(settings.table_resample().resize(table, grid_hw, tuple(grid_hw)))
  return np.concatenate([posemb[:, :prefix], resized.reshape(1, -1, d)], axis=1)


def resize_posemb_2d(
  pe_x: np.ndarray, pe_y: np.ndarray, new_grid_hw: tuple[int, int], method: str = "bilinear"
) -> tuple[np.ndarray, np.ndarray]:
  """Resizes `learn_2d` tables: X [1, 1, gw, D/2] -> [1, 1, nw, D/2] and Y [1, gh, 1, D/2] ->
  [1, nh, 1, D/2], each by 1-D interpolation along its own axis."""
  pe_x, pe_y = np.asarray(pe_x), np.asarray(pe_y)
  if pe_x.ndim != 4 or pe_x.shape[:2] != (1, 1) or pe_y.ndim != 4 or pe_y.shape[::2] != (1, 1):
    raise errors.ConfigError(
      f"Expected learn_2d tables X [1, 1, gw, D/2] and Y [1, gh, 1, D/2], got "
      f"{pe_x.shape} and {pe_y.shape}."
    )
  nh, nw = new_grid_hw
  x = resize_grid(pe_x[0], (1, nw), method)[None].astype(pe_x.dtype)
  y = resize_grid(pe_y[0], (nh, 1), method)[None].astype(pe_y.dtype)
  return x, y
