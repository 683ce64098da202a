"""Stored parameters fitted to a new model's grid (part of `fit.fit_params`' policy): the
position embeddings (learned, 2-D learned, relative tables) interpolated to the new grid
with the prefix-token rows kept apart, or re-initialised; a patch-embedding kernel of
another patch size resampled (FlexiViT). Each returns notes of what changed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import numpy as np

from vit_jax import models
from vit_jax.infra import errors
from vit_jax.models.embeddings import REGISTERS
from vit_jax.models.patchemb import resample_patch_kernel
from vit_jax.models.posemb import (
  POSEMB_REINIT,
  RELATIVE_EMBEDDING,
  resize_posemb,
  resize_posemb_2d,
  resize_relative,
  square_grid,
)
from vit_jax.weights import architecture
from vit_jax.weights.architecture import POSEMB, POSEMB_X, POSEMB_Y


def posemb_prefix_rows(tree: Mapping[str, Any], config: Optional[Any], model_config: Any) -> int:
  """Rows before the grid in ``tree``'s 1-D position table: from its config where the
  source has one, else its class token and registers unless the model's table covers the
  patches only (an `.npz` does not say; the model's layout is assumed)."""
  if config is not None:
    return architecture.num_prefix_rows(config)
  if model_config.get("posemb_patches_only", False):
    return 0
  return int("cls" in tree) + (np.shape(tree[REGISTERS])[1] if REGISTERS in tree else 0)


@dataclasses.dataclass(frozen=True)
class Grids:
  """The stored and the new position-embedding layouts: prefix-token rows (class token,
  registers) and grids (None: square, read from the table)."""

  stored_prefix: int
  new_prefix: int
  stored_hw: Optional[tuple[int, int]]
  new_hw: Optional[tuple[int, int]]


def _interpolation_note(
  what: str, noun: str, method: str, old_hw: tuple[int, int], new_hw: tuple[int, int]
) -> list[str]:
  """The note of a resize from ``old_hw`` to ``new_hw``; none when the size is kept."""
  if old_hw == new_hw:
    return []
  old, new = "x".join(map(str, old_hw)), "x".join(map(str, new_hw))
  return [f"{what}: {method} interpolation of the {old} {noun} to {new}"]


def adapt_posemb(
  got: dict[str, Any],
  want: Mapping[str, Any],
  posemb_kind: str,
  method: str,
  grids: Grids,
  where: str,
) -> list[str]:
  """Interpolates (or re-initialises) the stored position embeddings of ``got`` to the
  new grid; returns notes of what changed."""
  notes: list[str] = []
  stored_prefix, new_prefix = grids.stored_prefix, grids.new_prefix
  stored_grid_hw, new_grid_hw = grids.stored_hw, grids.new_hw
  if method == POSEMB_REINIT:
    for key in (POSEMB, POSEMB_X, POSEMB_Y):
      got.pop(key, None)
      if key in want:
        got[key] = want[key]
    notes.append("position embeddings: the fresh ones of init_params (reinit)")
  elif posemb_kind == "learn" and POSEMB in got and POSEMB in want:
    stored, fresh = np.asarray(got[POSEMB]), np.asarray(want[POSEMB])
    n_new = fresh.shape[1] - new_prefix
    if new_grid_hw is None:
      grid_hw = square_grid(n_new, "pass new_grid_hw=(height, width) of the model's grid")
    elif new_grid_hw[0] * new_grid_hw[1] != n_new:
      raise errors.CheckpointError(
        f"new_grid_hw={tuple(new_grid_hw)} does not match init_params' "
        f"{n_new} grid tokens: pass the model's grid (image size / patch size)."
      )
    else:
      grid_hw = tuple(new_grid_hw)
    n_stored = stored.shape[1] - stored_prefix
    try:
      old_hw = (
        tuple(stored_grid_hw)
        if stored_grid_hw is not None
        else square_grid(n_stored, "pass stored_grid_hw=(height, width) of the stored grid")
      )
      resized = resize_posemb(stored, grid_hw, stored_prefix, old_hw, method)
    except ValueError as e:
      raise errors.CheckpointError(f"Position embeddings of the {where}: {e}") from e
    notes += _interpolation_note("position embeddings", "grid", method, old_hw, grid_hw)
    if stored_prefix != new_prefix:  # the prefix rows of another token layout: fresh ones
      prefix = fresh[:, :new_prefix].astype(resized.dtype)
      resized = np.concatenate([prefix, resized[:, stored_prefix:]], axis=1)
      notes.append(
        f"position rows of the prefix tokens: {stored_prefix} stored, {new_prefix} in the "
        "model; using the model's fresh ones"
      )
    got[POSEMB] = resized
  elif posemb_kind == "learn_2d" and all(k in got and k in want for k in (POSEMB_X, POSEMB_Y)):
    grid_hw = (want[POSEMB_Y].shape[1], want[POSEMB_X].shape[2])
    old_hw = (got[POSEMB_Y].shape[1], got[POSEMB_X].shape[2])
    if new_grid_hw is not None and tuple(new_grid_hw) != grid_hw:
      raise errors.CheckpointError(
        f"new_grid_hw={tuple(new_grid_hw)} does not match init_params' learn_2d "
        f"grid {grid_hw}: pass the model's grid or leave it out."
      )
    try:
      got[POSEMB_X], got[POSEMB_Y] = resize_posemb_2d(got[POSEMB_X], got[POSEMB_Y], grid_hw, method)
    except ValueError as e:
      raise errors.CheckpointError(f"Position embeddings of the {where}: {e}") from e
    notes += _interpolation_note("learn_2d position embeddings", "tables", method, old_hw, grid_hw)
  return notes


def adapt_relative_tables(
  got: dict[str, Any], want: Mapping[str, Any], grids: Grids, method: str
) -> list[str]:
  """Every attention layer's offset table (posemb 'relative') resized to the model's
  sequence (`posemb.resize_relative`, the 2N - 1 patch offsets as a 1-D table), or fresh
  with 'reinit'; the prefix rows are the stored ones, or fresh where the model's prefix
  differs."""
  notes: list[str] = []
  stored_prefix, new_prefix = grids.stored_prefix > 0, grids.new_prefix > 0
  for key, fresh in want.items():
    if not key.endswith("/" + RELATIVE_EMBEDDING) or key not in got:
      continue
    old_rows, new_rows = np.shape(got[key])[-3], np.shape(fresh)[-3]
    if method == POSEMB_REINIT:
      got[key] = fresh
      continue
    if (old_rows, stored_prefix) == (new_rows, new_prefix):
      continue
    patches = new_rows - 3 * new_prefix  # 2N - 1 offsets, then the prefix rows
    resized = resize_relative(got[key], (patches + 1) // 2, stored_prefix, method)
    prefix_source = resized if stored_prefix == new_prefix else np.asarray(fresh)
    prefix_rows = prefix_source[..., prefix_source.shape[-3] - 3 * new_prefix :, :, :]
    got[key] = np.concatenate([resized[..., :patches, :, :], prefix_rows], axis=-3)
    note = f"relative position tables: {method} interpolation of {old_rows} rows to {new_rows}"
    notes += [] if note in notes else [note]
  return notes


# The patch embeddings of the families that have one (a ViT's, a Mixer's).
PATCH_KERNELS = tuple(f.patch_kernel for f in models.FAMILIES if f.patch_kernel)


def adapt_patch_size(got: dict[str, Any], want: Mapping[str, Any]) -> list[str]:
  """Resamples a stored patch-embedding kernel to the model's patch size (FlexiViT's
  pseudo-inverse resize, `models.patchemb`); notes of what changed."""
  notes = []
  for key in PATCH_KERNELS:
    if key not in got or key not in want:
      continue
    stored, wanted = np.shape(got[key]), np.shape(want[key])
    if len(stored) == len(wanted) == 4 and stored[2:] == wanted[2:] and stored[:2] != wanted[:2]:
      got[key] = resample_patch_kernel(got[key], wanted[:2])
      old, new = "x".join(map(str, stored[:2])), "x".join(map(str, wanted[:2]))
      notes.append(f"patch embedding: {old} kernel resampled to {new} patches (FlexiViT)")
  return notes
