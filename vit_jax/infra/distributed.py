"""Multi-process start-up: `jax.distributed` for a run over several processes or hosts.

`initialize_distributed` finds the processes of a run from explicit settings (arguments or
`VIT_*` environment variables) or from a cluster JAX can detect (Cloud TPU, a SLURM `srun`
step, Open MPI) and starts `jax.distributed`; in a single process it does nothing. It must
run before anything else touches a JAX backend (any device query starts one), which is why
`vit_jax.main` calls it first and why `vit_jax.infra.sharding` queries no device at import time.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Optional

import jax
from absl import logging

from vit_jax.infra import compat, errors

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
    raise errors.ConfigError(
      f"Environment variable {name}={value!r} is not an integer: set it to "
      "a whole number or unset it."
    ) from None


def _on_cloud_tpu_vm() -> bool:
  """True on a Cloud TPU VM with TPU chips and libtpu, as `import jax` found it (JAX
  records it, before any backend starts, in a private module: `compat.on_cloud_tpu_vm`)."""
  return compat.on_cloud_tpu_vm() and "TPU_SKIP_MDS_QUERY" not in os.environ


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
  if "SLURM_JOB_ID" in env and "SLURM_STEP_NODELIST" in env and (_env_int("SLURM_NTASKS") or 1) > 1:
    return "SLURM"
  if (_env_int("OMPI_COMM_WORLD_SIZE") or 1) > 1:
    if "OMPI_MCA_orte_hnp_uri" not in env:
      raise errors.ConfigError(
        f"Open MPI launch with OMPI_COMM_WORLD_SIZE={env['OMPI_COMM_WORLD_SIZE']} but no "
        "OMPI_MCA_orte_hnp_uri (Open MPI 5 / PRRTE), which JAX cannot auto-detect: set "
        f"{_ENV_COORDINATOR}, {_ENV_NUM_PROCESSES} and {_ENV_PROCESS_ID} (or pass "
        "--coordinator_address, --num_processes, --process_id)."
      )
    return "Open MPI"
  return None


def initialize_distributed(
  coordinator_address: Optional[str] = None,
  num_processes: Optional[int] = None,
  process_id: Optional[int] = None,
  initialization_timeout: Optional[int] = None,
  heartbeat_timeout: Optional[int] = None,
) -> None:
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
    if "heartbeat_timeout_seconds" not in params and not any(
      p.kind is p.VAR_KEYWORD for p in params.values()
    ):
      raise errors.ConfigError(
        f"heartbeat_timeout={heartbeat_timeout}: this JAX "
        f"({jax.__version__}) has no heartbeat_timeout_seconds; upgrade JAX "
        "or leave it unset."
      )
    kwargs["heartbeat_timeout_seconds"] = int(heartbeat_timeout)

  explicit = (coordinator_address, num_processes, process_id)
  if any(v is not None for v in explicit):
    cluster = None if None not in explicit else _detect_cluster()
    if cluster is None and None in explicit:
      missing = [
        name
        for name, v in zip((_ENV_COORDINATOR, _ENV_NUM_PROCESSES, _ENV_PROCESS_ID), explicit)
        if v is None
      ]
      raise errors.ConfigError(
        f"Incomplete multi-process settings: coordinator_address={coordinator_address!r}, "
        f"num_processes={num_processes!r}, process_id={process_id!r}. Outside a cluster "
        f"JAX can detect, give all three (missing: {', '.join(missing)}; or the "
        "--coordinator_address/--num_processes/--process_id flags)."
      )
    logging.info(
      "initialize_distributed: explicit coordinator=%s num_processes=%s process_id=%s%s.",
      coordinator_address,
      num_processes,
      process_id,
      f" (rest from {cluster})" if cluster and None in explicit else "",
    )
    if None not in explicit and any(k in os.environ for k in _LOCAL_DEVICE_CLUSTERS):
      # Complete explicit settings inside a SLURM step or an Open MPI job: JAX would still
      # detect the job and keep one device per process (number SLURM_LOCALID / local
      # rank), i.e. one GPU per node when the job runs one process per node. Explicit
      # means all local devices (restrict with JAX_LOCAL_DEVICE_IDS or
      # CUDA_VISIBLE_DEVICES).
      kwargs["cluster_detection_method"] = "deactivate"
    jax.distributed.initialize(
      coordinator_address=coordinator_address,
      num_processes=num_processes,
      process_id=process_id,
      **kwargs,
    )
  else:
    cluster = _detect_cluster()
    if cluster is None:
      logging.debug("initialize_distributed: no multi-process settings; single process.")
      _initialized = True
      return
    logging.info("initialize_distributed: %s detected; JAX auto-detects the processes.", cluster)
    jax.distributed.initialize(**kwargs)
  _initialized = True
  logging.info(
    "initialize_distributed: process %d of %d, %d local / %d global devices.",
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
  )
