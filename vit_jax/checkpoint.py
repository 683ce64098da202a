"""Checkpoints: the official ViT `.npz` layout (read, write, scanned <-> per-layer).

Official files are flat `np.savez` archives whose keys are Flax parameter paths joined by
'/' (FORMATS.md). A scanned encoder (`nn.scan`) keeps every block's arrays once, under
`Transformer/encoderblock/`, with a leading depth axis; the per-layer layout has
`Transformer/encoderblock_{i}/`. Files are written per-layer, as the official ones.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping

import flax.linen as nn
import numpy as np

Params = dict[str, Any]  # a nested dict of arrays

SCANNED_BLOCK = "encoderblock"
_LAYER_BLOCK = re.compile(r"^encoderblock_(\d+)$")


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """{'a': {'b': x}} -> {'a/b': x}."""
  flat = {}
  for key, value in tree.items():
    path = f"{prefix}{key}"
    if isinstance(value, Mapping):
      flat.update(flatten(value, path + "/"))
    else:
      flat[path] = value
  return flat


def unflatten(flat: Mapping[str, Any]) -> Params:
  """{'a/b': x} -> {'a': {'b': x}}."""
  tree: Params = {}
  for path, value in flat.items():
    *parents, leaf = path.split("/")
    node = tree
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return tree


def is_scanned(params: Mapping[str, Any]) -> bool:
  """Whether the encoder blocks are stored once with a leading depth axis."""
  return SCANNED_BLOCK in params.get("Transformer", {})


def scanned_to_layers(params: Params) -> Params:
  """Splits `Transformer/encoderblock` [L, ...] into `encoderblock_{i}` [...] (exact)."""
  if not is_scanned(params):
    return params
  transformer = dict(params["Transformer"])
  stacked = flatten(transformer.pop(SCANNED_BLOCK))
  depth = {v.shape[0] for v in stacked.values()}
  if len(depth) != 1:
    raise ValueError(f"Scanned encoder arrays disagree on the depth axis: {sorted(depth)}.")
  for i in range(depth.pop()):
    transformer[f"encoderblock_{i}"] = unflatten({k: v[i] for k, v in stacked.items()})
  return {**params, "Transformer": transformer}


def layers_to_scanned(params: Params) -> Params:
  """Stacks `encoderblock_{0..L-1}` into `Transformer/encoderblock` [L, ...] (exact)."""
  if is_scanned(params):
    return params
  transformer = dict(params["Transformer"])
  layers = sorted((int(m.group(1)), k) for k in transformer
                  if (m := _LAYER_BLOCK.match(k)))
  if [i for i, _ in layers] != list(range(len(layers))):
    raise ValueError(f"Encoder blocks are not numbered 0..L-1: {[k for _, k in layers]}.")
  flats = [flatten(transformer.pop(k)) for _, k in layers]
  stacked = {k: np.stack([np.asarray(f[k]) for f in flats]) for k in flats[0]}
  transformer[SCANNED_BLOCK] = unflatten(stacked)
  return {**params, "Transformer": transformer}


def to_layout(params: Params, scanned: bool) -> Params:
  """Converts a parameter tree to the scanned or the per-layer encoder layout."""
  return layers_to_scanned(params) if scanned else scanned_to_layers(params)


def _squeeze_groupnorm(path: str, value: np.ndarray) -> np.ndarray:
  # Older hybrid files store GroupNorm scale/bias as (1, 1, 1, W).
  leaf_module = path.split("/")[-2] if "/" in path else ""
  if leaf_module.startswith("gn") and value.ndim == 4 and value.shape[:3] == (1, 1, 1):
    return value.reshape(value.shape[-1])
  return value


def load_npz(path: str | os.PathLike) -> Params:
  """Reads an official-layout `.npz` (per-layer or scanned) into a nested parameter tree."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"No checkpoint file at {path!r}: check the path.")
  try:
    with np.load(path, allow_pickle=False) as archive:
      flat = {k: _squeeze_groupnorm(k, archive[k]) for k in archive.files}
  except ValueError as e:  # object arrays, or not an npz at all
    raise ValueError(f"{path!r} is not a plain-array .npz checkpoint: {e}") from e
  return unflatten(flat)


def save_npz(path: str | os.PathLike, params: Params) -> None:
  """Writes parameters as an official per-layer `.npz` (float32, scanned trees converted).

  The file appears atomically: a crash mid-write leaves any earlier file untouched.
  """
  path = os.fspath(path)
  flat = flatten(scanned_to_layers(nn.unbox(dict(params))))
  arrays = {}
  for k, v in flat.items():
    v = np.asarray(v)
    # bfloat16 and other extension dtypes do not round-trip through np.load; widen them.
    arrays[k] = v.astype(np.float32) if v.dtype.kind == "V" or v.dtype.name == "bfloat16" else v
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    with open(tmp, "wb") as f:
      np.savez(f, **arrays)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def check_tree(loaded: Mapping[str, Any], expected: Mapping[str, Any],
               source: str = "checkpoint") -> None:
  """Raises one ValueError listing missing keys, unexpected keys and shape mismatches."""
  got = {k: tuple(np.shape(v)) for k, v in flatten(nn.unbox(dict(loaded))).items()}
  want = {k: tuple(np.shape(v)) for k, v in flatten(nn.unbox(dict(expected))).items()}
  missing = sorted(want.keys() - got.keys())
  unexpected = sorted(got.keys() - want.keys())
  mismatched = sorted(f"{k}: {source} {got[k]} vs model {want[k]}"
                      for k in got.keys() & want.keys() if got[k] != want[k])
  if missing or unexpected or mismatched:
    lines = [f"The {source} does not fit the model:"]
    for title, items in (("missing keys", missing), ("unexpected keys", unexpected),
                         ("shape mismatches", mismatched)):
      if items:
        lines.append(f"  {title} ({len(items)}):")
        lines.extend(f"    {item}" for item in items)
    raise ValueError("\n".join(lines))
