"""The device mesh, the logical axis names of the parameters and the rules joining them.

One sharding path: `jax.jit` with `NamedSharding`s over a `Mesh` with two named axes,
`DATA_AXIS` (the batch; under FSDP also the parameters) and `MODEL_AXIS` (tensor
parallelism). Every parameter carries logical axis names (`EMBED`, `MLP`, `HEADS`, `KV`,
`LAYERS`, set with `nn.with_logical_partitioning` in `vit_jax.models`); `LOGICAL_RULES`
maps them onto mesh axes per strategy and `state_shardings` turns a boxed abstract train
state into a tree of `NamedSharding`s.

This module defines those names; `vit_jax.models` and `vit_jax.data` import them, so it
imports nothing from `vit_jax`. It queries no device at import time:
`vit_jax.infra.distributed.initialize_distributed` must be able to run after it is imported.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence, Union

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from vit_jax.infra import errors

# Mesh axes.
DATA_AXIS = "data"  # the batch (and the parameters under FSDP)
MODEL_AXIS = "model"  # tensor parallelism

# Logical axes of the parameters.
EMBED = "embed"  # the model width D
MLP = "mlp"  # the MLP's hidden units M
HEADS = "heads"  # attention heads H
KV = "kv"  # the width of one head Dh
LAYERS = "layers"  # the stacked layers L of a scanned encoder

MeshAxes = Union[Mapping[str, int], Sequence[tuple[str, int]]]


def _resolve_axes(axes: MeshAxes, num_devices: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
  """Axis names and sizes with the one -1 resolved; raises when they cannot fit."""
  pairs = list(axes.items()) if isinstance(axes, Mapping) else [tuple(a) for a in axes]
  if not pairs or any(len(p) != 2 for p in pairs):
    raise errors.ConfigError(
      f"Mesh axes {axes!r} must be name -> size pairs, e.g. "
      f"{{{DATA_AXIS!r}: -1, {MODEL_AXIS!r}: 1}}."
    )
  names = tuple(str(n) for n, _ in pairs)
  if len(set(names)) != len(names):
    raise errors.ConfigError(f"Mesh axes {axes!r} repeat a name; give each axis a unique name.")
  try:
    sizes = [int(s) for _, s in pairs]
  except (TypeError, ValueError):
    raise errors.ConfigError(
      f"Mesh axes {axes!r}: every size must be an integer (-1: the remaining devices)."
    ) from None
  if any(s == 0 or s < -1 for s in sizes) or sizes.count(-1) > 1:
    raise errors.ConfigError(
      f"Mesh axes {dict(zip(names, sizes))}: sizes must be positive, with at "
      "most one -1 (the remaining devices)."
    )
  fixed = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % fixed:
      raise errors.ConfigError(
        f"Mesh axes {dict(zip(names, sizes))}: the fixed sizes multiply to {fixed}, which "
        f"does not divide the {num_devices} devices; choose sizes whose product divides "
        f"{num_devices}."
      )
    sizes[sizes.index(-1)] = num_devices // fixed
  elif fixed != num_devices:
    raise errors.ConfigError(
      f"Mesh axes {dict(zip(names, sizes))} multiply to {fixed} but there are {num_devices} "
      f"devices; make the product {num_devices}, or set one size to -1 to take the rest."
    )
  return names, tuple(sizes)


def make_mesh(axes: MeshAxes, devices: Optional[Sequence[Any]] = None) -> Mesh:
  """A `Mesh` over all (or the given) devices, e.g. ``make_mesh({'data': -1, 'model': 1})``.

  Axis types are Auto (linen's `nn.Conv` rejects Explicit meshes). Devices are laid out by
  `mesh_utils.create_device_mesh` (fast interconnect on the last axes; processes stay
  contiguous along the first), falling back to a reshape ordered by process and id.
  """
  devices = list(jax.devices() if devices is None else devices)
  names, sizes = _resolve_axes(axes, len(devices))
  try:
    from jax.experimental import mesh_utils  # pylint: disable=g-import-not-at-top

    device_array = mesh_utils.create_device_mesh(sizes, devices)
  except Exception as e:  # pylint: disable=broad-except
    logging.info("make_mesh: create_device_mesh failed (%s); plain reshape instead.", e)
    devices = sorted(devices, key=lambda d: (d.process_index, d.id))
    device_array = np.array(devices, dtype=object).reshape(sizes)
  axis_type = getattr(jax.sharding, "AxisType", None)
  if axis_type is not None:
    mesh = Mesh(device_array, names, axis_types=(axis_type.Auto,) * len(names))
  else:  # Older JAX: every axis is Auto anyway.
    mesh = Mesh(device_array, names)
  logging.debug("make_mesh: %s over %d devices.", dict(zip(names, sizes)), len(devices))
  return mesh


def replicated(mesh: Mesh) -> NamedSharding:
  """The same full copy on every device."""
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """The leading (batch) dimension split over the `DATA_AXIS` axis, the rest whole."""
  if DATA_AXIS not in mesh.axis_names:
    raise errors.ConfigError(
      f"The mesh has axes {mesh.axis_names} but batches are split over a "
      f"{DATA_AXIS!r} axis; add one, e.g. "
      f"make_mesh({{{DATA_AXIS!r}: -1, {MODEL_AXIS!r}: 1}})."
    )
  return NamedSharding(mesh, P(DATA_AXIS))


STRATEGIES: tuple[str, ...] = ("data_parallel", "fsdp", "tensor_parallel")

# Logical axis name (vit_jax.models) -> mesh axis, per strategy. flax applies the rules in
# order and uses a mesh axis at most once per array: an earlier rule wins.
#   data_parallel: every parameter replicated; only the batch is split (over 'data').
#   fsdp: ZeRO-3 style. Every weight has exactly one 'embed' (width D) dimension, so
#     'embed' -> 'data' splits every kernel, the position embeddings, the class token and
#     the LayerNorm/bias vectors of width D n ways (as does the optimizer state, which
#     mirrors the parameters); 'mlp' -> 'data' then only reaches the MLP's first bias [M].
#     jit all-gathers a layer's weights where it needs them. 'layers' (the scan axis) stays
#     whole, since each scan iteration slices it; 'heads'/'kv' stay whole (small, and H is
#     often not a multiple of the device count).
#   tensor_parallel: Megatron-style. q/k/v split their heads and the MLP's first kernel its
#     hidden units (column parallel), `out` and the MLP's second kernel their input (row
#     parallel), all over 'model'; one all-reduce after attention and one after the MLP.
#     Everything else replicated; the batch is split over 'data'.
LOGICAL_RULES: dict[str, tuple[tuple[str, Optional[str]], ...]] = {
  "data_parallel": tuple((name, None) for name in (LAYERS, EMBED, MLP, HEADS, KV)),
  "fsdp": ((LAYERS, None), (EMBED, DATA_AXIS), (MLP, DATA_AXIS), (HEADS, None), (KV, None)),
  "tensor_parallel": (
    (LAYERS, None),
    (HEADS, MODEL_AXIS),
    (MLP, MODEL_AXIS),
    (EMBED, None),
    (KV, None),
  ),
}


def logical_rules(strategy: str) -> tuple[tuple[str, Optional[str]], ...]:
  """The (logical name, mesh axis or None) rules of one strategy in `STRATEGIES`."""
  if strategy not in LOGICAL_RULES:
    raise errors.ConfigError(
      f"Unknown partitioning strategy {strategy!r}; choose one of "
      f"{STRATEGIES} (config.partitioning)."
    )
  return LOGICAL_RULES[strategy]


def _is_box(x: Any) -> bool:
  return isinstance(x, nn.Partitioned)


def _axis_size(mesh: Mesh, axis: Union[str, tuple[str, ...], None]) -> int:
  if axis is None:
    return 1
  axes = (axis,) if isinstance(axis, str) else tuple(axis)
  return math.prod(mesh.shape[a] for a in axes)


def state_shardings(abstract_tree: Any, mesh: Mesh, strategy: str) -> Any:
  """`NamedSharding`s for every leaf of ``nn.unbox(abstract_tree)``.

  ``abstract_tree`` comes from `jax.eval_shape` of a function returning boxed parameters
  (`nn.LogicallyPartitioned`) and plain leaves (optax counts, rng keys, step). Boxed
  leaves follow `logical_rules(strategy)`; plain leaves are replicated. A dimension whose
  size the mesh axis does not divide, or whose mesh axis the mesh lacks, stays whole
  (logged once per call) instead of failing.
  """
  rules = logical_rules(strategy)
  fallbacks: list[str] = []

  def leaf_sharding(path, leaf) -> NamedSharding:
    if not _is_box(leaf):
      return NamedSharding(mesh, P())
    value = leaf.value
    if isinstance(leaf, nn.LogicallyPartitioned):
      axes = list(nn.logical_to_mesh_axes(leaf.names, rules))
    else:  # A plain `nn.Partitioned` already names mesh axes.
      axes = list(leaf.names)
    for i, axis in enumerate(axes):
      if axis is None:
        continue
      missing = [a for a in ((axis,) if isinstance(axis, str) else axis) if a not in mesh.shape]
      size = 1 if missing else _axis_size(mesh, axis)
      if missing or value.shape[i] % size:
        why = (
          f"no mesh axis {missing}"
          if missing
          else f"{value.shape[i]} not divisible by {axis}={size}"
        )
        fallbacks.append(f"{jax.tree_util.keystr(path)} dim {i} ({why})")
        axes[i] = None
    while axes and axes[-1] is None:
      axes.pop()
    return NamedSharding(mesh, P(*axes))

  shardings = jax.tree_util.tree_map_with_path(leaf_sharding, abstract_tree, is_leaf=_is_box)
  if fallbacks:
    logging.warning(
      "state_shardings(%s): %d dimension(s) left whole: %s",
      strategy,
      len(fallbacks),
      "; ".join(fallbacks[:20]) + (" ..." if len(fallbacks) > 20 else ""),
    )
  return shardings
