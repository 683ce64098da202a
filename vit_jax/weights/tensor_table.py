"""One two-way table between our parameter paths and a PyTorch state dict, numpy only.

A `Row` pairs our path (``'Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel'``) with
a torch key (``'blocks.0.mlp.fc1.weight'``) and the `Layout` that converts the array each
way. Several of our arrays may be the parts of one torch array (a fused ``qkv``): each
row then names its part, and the parts are stacked along the torch array's first axis.
`to_torch` and `from_torch` read the same rows, so an export and an import cannot drift.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Optional

import numpy as np
from flax import traverse_util

from vit_jax.infra import errors
from vit_jax.infra.aliases import Params

Convert = Callable[[np.ndarray], np.ndarray]


@dataclasses.dataclass(frozen=True)
class Layout:
  """How one array is stored on each side: ours -> torch and torch -> ours."""

  to_torch: Convert
  from_torch: Convert


def _same(x: np.ndarray) -> np.ndarray:
  return x


def _t(x: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(x.T)


def conv_to_torch(kernel: np.ndarray) -> np.ndarray:
  """A Flax convolution kernel [kh, kw, Cin, Cout] -> torch's weight [Cout, Cin, kh, kw]."""
  return np.ascontiguousarray(kernel.transpose(3, 2, 0, 1))


def conv_from_torch(weight: np.ndarray) -> np.ndarray:
  """torch's convolution weight [Cout, Cin, kh, kw] -> a Flax kernel [kh, kw, Cin, Cout]."""
  return np.ascontiguousarray(weight.transpose(2, 3, 1, 0))


SAME = Layout(_same, _same)
DENSE = Layout(_t, _t)  # Dense kernel [in, out] <-> torch Linear weight [out, in]
CONV = Layout(conv_to_torch, conv_from_torch)
# A Dense kernel [in, out] <-> a 1x1 convolution weight [out, in, 1, 1] (BiT's head).
DENSE_AS_CONV = Layout(lambda k: _t(k)[:, :, None, None], lambda w: _t(w[:, :, 0, 0]))


def heads_in(num_heads: int) -> Layout:
  """Our per-head projection kernel [D, H, Dh] <-> torch's weight [H*Dh, D]."""
  return Layout(
    lambda k: _t(k.reshape(k.shape[0], -1)),
    lambda w: _t(w).reshape(w.shape[1], num_heads, -1),
  )


def heads_out(num_heads: int) -> Layout:
  """Our output kernel [H, Dh, D] <-> torch's weight [D, H*Dh]."""
  return Layout(
    lambda k: _t(k.reshape(-1, k.shape[-1])),
    lambda w: _t(w).reshape(num_heads, -1, w.shape[0]),
  )


def heads_bias(num_heads: int) -> Layout:
  """Our per-head bias [H, Dh] <-> torch's [H*Dh]."""
  return Layout(lambda b: b.reshape(-1), lambda b: b.reshape(num_heads, -1))


@dataclasses.dataclass(frozen=True)
class Row:
  """Our ``ours`` is torch's ``theirs`` (or part ``part[0]`` of ``part[1]`` equal parts of
  it, along its first axis), converted by ``layout``. A ``required`` row's array must be
  on the side read."""

  ours: str
  theirs: str
  layout: Layout = SAME
  part: Optional[tuple[int, int]] = None
  required: bool = True


def rows(ours: str, theirs: str, layout: Layout = SAME, **kwargs) -> list[Row]:
  """``ours/kernel|scale`` and ``ours/bias`` <-> ``theirs.weight`` and ``theirs.bias``: a
  Dense, a convolution or a norm (``layout`` converts the weight; biases are the same)."""
  weight = "scale" if layout is SAME else "kernel"
  return [
    Row(f"{ours}/{weight}", f"{theirs}.weight", layout, **kwargs),
    Row(f"{ours}/bias", f"{theirs}.bias", SAME, **kwargs),
  ]


def flat_float32(params: Params) -> dict[str, np.ndarray]:
  """A parameter tree as {'a/b/kernel': float32 array}, the form `to_torch` reads."""
  return {
    k: np.asarray(v, np.float32) for k, v in traverse_util.flatten_dict(params, sep="/").items()
  }


def to_torch(table: Iterable[Row], flat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The torch state dict of the rows whose array ``flat`` holds (a missing required one
  is a KeyError: the tree is not the family's); parts stacked in order."""
  parts: dict[str, dict[int, np.ndarray]] = {}
  out = {}
  for row in table:
    if row.ours not in flat:
      if row.required:
        raise KeyError(row.ours)
      continue
    value = row.layout.to_torch(flat[row.ours])
    if row.part is None:
      out[row.theirs] = value
    else:
      parts.setdefault(row.theirs, {})[row.part[0]] = value
  for theirs, pieces in parts.items():
    out[theirs] = np.concatenate([pieces[i] for i in sorted(pieces)])
  # np.require keeps a 0-d array (CLIP's logit_scale) 0-d; ascontiguousarray makes it [1].
  return {k: np.require(v, requirements="C") for k, v in out.items()}


def from_torch(
  table: Iterable[Row],
  tensors: dict[str, np.ndarray],
  source: str,
  family: str,
  what: str = "",
  library: str = "timm",
) -> Params:
  """Our parameter tree of the rows whose torch array ``tensors`` holds; one
  CheckpointError names every missing required array, another every array no row takes
  (``family``: ``library``'s name of the model; ``what``: what ours has, said with the
  second)."""
  tensors = {k: np.asarray(v, np.float32) for k, v in tensors.items()}
  table = list(table)
  missing = sorted({r.theirs for r in table if r.required and r.theirs not in tensors})
  if missing:
    raise errors.CheckpointError(
      f"{source}: no {missing[:4]}{' ...' if len(missing) > 4 else ''}; this is not a "
      f"{library} {family} state dict."
    )
  flat = {}
  for row in table:
    if row.theirs not in tensors:
      continue
    value = tensors[row.theirs]
    try:
      if row.part is not None:
        value = np.split(value, row.part[1])[row.part[0]]
      flat[row.ours] = row.layout.from_torch(value)
    except ValueError:  # a reshape or split the architecture's sizes do not allow
      raise errors.CheckpointError(
        f"{source}: {row.theirs} of shape {tuple(tensors[row.theirs].shape)} does not fit "
        f"the {library} {family} its config names; the arrays and config.json disagree."
      ) from None
  unused = set(tensors) - {r.theirs for r in table}
  if unused:
    raise errors.CheckpointError(
      f"{source}: {len(unused)} {library} arrays have no place in this {family}{what}: "
      f"{sorted(unused)[:8]}{' ...' if len(unused) > 8 else ''}."
    )
  return traverse_util.unflatten_dict(flat, sep="/")
