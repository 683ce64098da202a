"""Distributed start-up, the device mesh and the parameter partitioning rules.

One sharding path (ARCHITECTURE.md): `jax.jit` with `NamedSharding`s over a `Mesh` whose
axes are named 'data' (batch, and for FSDP the parameters) and 'model' (tensor
parallelism). Parameters carry logical axis names (`nn.with_logical_partitioning` in
`vit_jax.models.vit`); `LOGICAL_RULES` maps them onto mesh axes per strategy and
`state_shardings` turns a boxed abstract train state into a tree of `NamedSharding`s.

Nothing here touches a JAX backend at import time: `initialize_distributed` must be able to
run first.
"""
from __future__ import annotations

import inspect
import math
import os
from typing import Any, Mapping, Optional, Sequence, Union

from absl import logging
import flax.linen as nn
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np

# ----------------------------------------------------------------------------------------
# Distributed start-up.

_ENV_COORDINATOR = "VIT_COORDINATOR_ADDRESS"
_ENV_NUM_PROCESSES = "VIT_NUM_PROCESSES"
_ENV_PROCESS_ID = "VIT_PROCESS_ID"

_initialized = False
# Environment variables of the jobs in which JAX's auto-detection also limits each process
# to one local device (SLURM, Open MPI).
_LOCAL_DEVICE_CLUSTERS = ("SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri")


def _env_int(name: str) -> Optional[int]:
  value = os.environ.get(name)
  if value is None or value.strip() == "":
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"Environment variable {name}={value!r} is not an integer: set it to "
                     "a whole number or unset it.") from None


def _on_cloud_tpu_vm() -> bool:
  """True on a Cloud TPU VM with TPU chips and libtpu, as `import jax` found it.

  JAX records this when it is imported (before any backend starts) in a private
  module; any change there reads as False, i.e. the environment-variable checks only.
  """
  try:
    from jax._src import cloud_tpu_init  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  return (bool(getattr(cloud_tpu_init, "running_in_cloud_tpu_vm", False))
          and "TPU_SKIP_MDS_QUERY" not in os.environ)


def _detect_cluster() -> Optional[str]:
  """The multi-process cluster JAX can auto-detect from the environment, or None.

  Only launches with more than one process count: a single-host TPU VM, an `sbatch` script
  outside `srun`, or `mpirun -n 1` stay plain single processes.
  """
  env = os.environ
  hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
  if len(hosts) > 1 or "CLOUD_TPU_TASK_ID" in env or "MEGASCALE_COORDINATOR_ADDRESS" in env:
    return "Cloud TPU"
  if _on_cloud_tpu_vm():
    # A TPU VM created with `gcloud compute tpus tpu-vm create` sets none of the above:
    # JAX reads the workers from the metadata server (one worker: a 1-process run).
    return "Cloud TPU VM"
  # SLURM_STEP_NODELIST exists only inside an `srun` step, which is what JAX reads.
  if ("SLURM_JOB_ID" in env and "SLURM_STEP_NODELIST" in env
      and (_env_int("SLURM_NTASKS") or 1) > 1):
    return "SLURM"
  if (_env_int("OMPI_COMM_WORLD_SIZE") or 1) > 1:
    if "OMPI_MCA_orte_hnp_uri" not in env:
      raise ValueError(
          f"Open MPI launch with OMPI_COMM_WORLD_SIZE={env['OMPI_COMM_WORLD_SIZE']} but no "
          "OMPI_MCA_orte_hnp_uri (Open MPI 5 / PRRTE), which JAX cannot auto-detect: set "
          f"{_ENV_COORDINATOR}, {_ENV_NUM_PROCESSES} and {_ENV_PROCESS_ID} (or pass "
          "--coordinator_address, --num_processes, --process_id).")
    return "Open MPI"
  return None


def initialize_distributed(coordinator_address: Optional[str] = None,
                           num_processes: Optional[int] = None,
                           process_id: Optional[int] = None,
                           initialization_timeout: Optional[int] = None,
                           heartbeat_timeout: Optional[int] = None) -> None:
  """Starts `jax.distributed` when this is a multi-process run; otherwise does nothing.

  Order of precedence: the arguments; else the env vars `VIT_COORDINATOR_ADDRESS`,
  `VIT_NUM_PROCESSES`, `VIT_PROCESS_ID`; else a Cloud TPU VM or pod, a SLURM `srun`
  step or an Open MPI launch with more than one process, for which JAX auto-detects
  everything. Must run before any other JAX call. Idempotent: later calls are no-ops.

  ``initialization_timeout``: seconds to wait for every process to join (JAX: 300).
  ``heartbeat_timeout``: seconds without heartbeats after which a process counts as dead;
  every other process then aborts (exit status 134) with an error saying another task
  died (JAX: 100). Until then the others wait in their next collective.
  """
  global _initialized
  if _initialized:
    logging.info("initialize_distributed: already done; nothing to do.")
    return
  if getattr(jax.distributed, "is_initialized", lambda: False)():
    _initialized = True
    logging.info("initialize_distributed: jax.distributed was already initialized.")
    return

  if coordinator_address is None:
    coordinator_address = os.environ.get(_ENV_COORDINATOR) or None
  if num_processes is None:
    num_processes = _env_int(_ENV_NUM_PROCESSES)
  if process_id is None:
    process_id = _env_int(_ENV_PROCESS_ID)
  kwargs: dict[str, Any] = {}
  if initialization_timeout is not None:
    kwargs["initialization_timeout"] = int(initialization_timeout)
  if heartbeat_timeout is not None:
    params = inspect.signature(jax.distributed.initialize).parameters
    if ("heartbeat_timeout_seconds" not in params
        and not any(p.kind is p.VAR_KEYWORD for p in params.values())):
      raise ValueError(f"heartbeat_timeout={heartbeat_timeout}: this JAX "
                       f"({jax.__version__}) has no heartbeat_timeout_seconds; upgrade JAX "
                       "or leave it unset.")
    kwargs["heartbeat_timeout_seconds"] = int(heartbeat_timeout)

  explicit = (coordinator_address, num_processes, process_id)
  if any(v is not None for v in explicit):
    cluster = None if None not in explicit else _detect_cluster()
    if cluster is None and None in explicit:
      missing = [name for name, v in zip((_ENV_COORDINATOR, _ENV_NUM_PROCESSES,
                                          _ENV_PROCESS_ID), explicit) if v is None]
      raise ValueError(
          f"Incomplete multi-process settings: coordinator_address={coordinator_address!r}, "
          f"num_processes={num_processes!r}, process_id={process_id!r}. Outside a cluster "
          f"JAX can detect, give all three (missing: {', '.join(missing)}; or the "
          "--coordinator_address/--num_processes/--process_id flags).")
    logging.info("initialize_distributed: explicit coordinator=%s num_processes=%s "
                 "process_id=%s%s.", coordinator_address, num_processes, process_id,
                 f" (rest from {cluster})" if cluster and None in explicit else "")
    if None not in explicit and any(k in os.environ for k in _LOCAL_DEVICE_CLUSTERS):
      # Complete explicit settings inside a SLURM step or an Open MPI job: JAX would still
      # detect the job and keep one device per process (number SLURM_LOCALID / local
      # rank), i.e. one GPU per node when the job runs one process per node. Explicit
      # means all local devices (restrict with JAX_LOCAL_DEVICE_IDS or
      # CUDA_VISIBLE_DEVICES).
      kwargs["cluster_detection_method"] = "deactivate"
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id, **kwargs)
  else:
    cluster = _detect_cluster()
    if cluster is None:
      logging.info("initialize_distributed: no multi-process settings; single process.")
      _initialized = True
      return
    logging.info("initialize_distributed: %s detected; JAX auto-detects the processes.",
                 cluster)
    jax.distributed.initialize(**kwargs)
  _initialized = True
  logging.info("initialize_distributed: process %d of %d, %d local / %d global devices.",
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count())


# ----------------------------------------------------------------------------------------
# The mesh.

MeshAxes = Union[Mapping[str, int], Sequence[tuple[str, int]]]


def _resolve_axes(axes: MeshAxes, num_devices: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
  """Axis names and sizes with the one -1 resolved; raises when they cannot fit."""
  pairs = list(axes.items()) if isinstance(axes, Mapping) else [tuple(a) for a in axes]
  if not pairs or any(len(p) != 2 for p in pairs):
    raise ValueError(f"Mesh axes {axes!r} must be name -> size pairs, e.g. "
                     "{'data': -1, 'model': 1}.")
  names = tuple(str(n) for n, _ in pairs)
  if len(set(names)) != len(names):
    raise ValueError(f"Mesh axes {axes!r} repeat a name; give each axis a unique name.")
  try:
    sizes = [int(s) for _, s in pairs]
  except (TypeError, ValueError):
    raise ValueError(f"Mesh axes {axes!r}: every size must be an integer (-1: the "
                     "remaining devices).") from None
  if any(s == 0 or s < -1 for s in sizes) or sizes.count(-1) > 1:
    raise ValueError(f"Mesh axes {dict(zip(names, sizes))}: sizes must be positive, with at "
                     "most one -1 (the remaining devices).")
  fixed = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % fixed:
      raise ValueError(
          f"Mesh axes {dict(zip(names, sizes))}: the fixed sizes multiply to {fixed}, which "
          f"does not divide the {num_devices} devices; choose sizes whose product divides "
          f"{num_devices}.")
    sizes[sizes.index(-1)] = num_devices // fixed
  elif fixed != num_devices:
    raise ValueError(
        f"Mesh axes {dict(zip(names, sizes))} multiply to {fixed} but there are {num_devices} "
        f"devices; make the product {num_devices}, or set one size to -1 to take the rest.")
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
  logging.info("make_mesh: %s over %d devices.", dict(zip(names, sizes)), len(devices))
  return mesh


def replicated(mesh: Mesh) -> NamedSharding:
  """The same full copy on every device."""
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """The leading (batch) dimension split over the 'data' axis, the rest whole."""
  if "data" not in mesh.axis_names:
    raise ValueError(f"The mesh has axes {mesh.axis_names} but batches are split over a "
                     "'data' axis; add one, e.g. make_mesh({'data': -1, 'model': 1}).")
  return NamedSharding(mesh, P("data"))


# ----------------------------------------------------------------------------------------
# Partitioning rules.

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
_NAMES = ("layers", "embed", "mlp", "heads", "kv")
LOGICAL_RULES: dict[str, tuple[tuple[str, Optional[str]], ...]] = {
    "data_parallel": tuple((name, None) for name in _NAMES),
    "fsdp": (("layers", None), ("embed", "data"), ("mlp", "data"), ("heads", None),
             ("kv", None)),
    "tensor_parallel": (("layers", None), ("heads", "model"), ("mlp", "model"),
                        ("embed", None), ("kv", None)),
}


def logical_rules(strategy: str) -> tuple[tuple[str, Optional[str]], ...]:
  """The (logical name, mesh axis or None) rules of one strategy in `STRATEGIES`."""
  if strategy not in LOGICAL_RULES:
    raise ValueError(f"Unknown partitioning strategy {strategy!r}; choose one of "
                     f"{STRATEGIES} (config.partitioning).")
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
      missing = [a for a in ((axis,) if isinstance(axis, str) else axis)
                 if a not in mesh.shape]
      size = 1 if missing else _axis_size(mesh, axis)
      if missing or value.shape[i] % size:
        why = (f"no mesh axis {missing}" if missing
               else f"{value.shape[i]} not divisible by {axis}={size}")
        fallbacks.append(f"{jax.tree_util.keystr(path)} dim {i} ({why})")
        axes[i] = None
    while axes and axes[-1] is None:
      axes.pop()
    return NamedSharding(mesh, P(*axes))

  shardings = jax.tree_util.tree_map_with_path(leaf_sharding, abstract_tree, is_leaf=_is_box)
  if fallbacks:
    logging.warning("state_shardings(%s): %d dimension(s) left whole: %s", strategy,
                    len(fallbacks), "; ".join(fallbacks[:20]) +
                    (" ..." if len(fallbacks) > 20 else ""))
  return shardings
