"""What a compiled step needs and costs on a TPU slice or GPUs: memory, FLOPs, collectives, time.

`measure` compiles one lowered step and reads XLA's memory and cost analyses and the
collectives of its HLO text (`vit_jax.plan.hlo`). `StepTime` is the lower bound

    max(FLOPs / peak, HBM traffic / HBM bandwidth, ICI traffic / ICI bandwidth)

per device (on GPUs: NVLink within a node and, separately, the network between nodes in
place of ICI), with the model FLOPs utilisation (MFU) a step of exactly that time would
have. It is a bound, not a forecast: every unit at its published peak, nothing waiting.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Any, Optional

import jax
import numpy as np

from vit_jax.infra import compat
from vit_jax.infra.hardware import Chip
from vit_jax.plan import hlo, loop_cost
from vit_jax.run import step_cost

GIB = 2**30
# XLA:TPU refuses a program larger than the device's memory at compile time, e.g.
# "RESOURCE_EXHAUSTED: ... HLO temporaries (43.95G) exceeds available HBM (15.48G)".
_TOO_LARGE = re.compile(r"\(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)")
_UNIT = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def tree_bytes_per_device(tree: Any) -> int:
  """Bytes of one device's shards of a tree of `jax.ShapeDtypeStruct`s with shardings."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    total += math.prod(leaf.sharding.shard_shape(leaf.shape)) * np.dtype(leaf.dtype).itemsize
  return int(total)


@dataclasses.dataclass(frozen=True)
class Memory:
  """One device's memory for a compiled step, in bytes (XLA's memory analysis)."""

  arguments: int  # state and batch as the program holds them (layout padding included)
  outputs: int
  aliased: int  # outputs written in place of donated arguments
  temporaries: int
  code: int
  total: int  # arguments + outputs - aliased + temporaries + code


@dataclasses.dataclass(frozen=True)
class Measure:
  """One compiled step on one device. ``memory`` is None when XLA refused the program as
  larger than the device (``needed_bytes`` is then XLA's figure for what it needs)."""

  memory: Optional[Memory]
  needed_bytes: int
  xla_flops: float  # one device's program, each loop body x its trip count
  xla_bytes_accessed: float  # its HBM traffic, counted the same way
  has_loops: bool
  collectives: Optional[hlo.Totals]
  compile_seconds: float
  # Loops whose trip count could not be read: their bodies are counted once above.
  unknown_trip_counts: int = 0


def too_large_bytes(error: BaseException) -> Optional[int]:
  """The bytes XLA:TPU says a program needs when ``error`` is its refusal; else None."""
  match = _TOO_LARGE.search(str(error))
  return int(float(match.group(1)) * _UNIT[match.group(2)]) if match else None


def _cost_analysis(compiled: jax.stages.Compiled) -> tuple[float, float]:
  """XLA's (FLOPs, bytes accessed) of one device's compiled program.

  A compile-only GPU executable has no cost analysis: XLA's analysis is then run on its
  optimized module through the CPU client. It counts each fusion's and custom call's
  operands and results (the HBM traffic), but no FLOPs of the cuBLAS and cuDNN calls that
  do the matrix products.
  """
  if compiled.cost_analysis() is not None:
    return step_cost.compiled_flops(compiled), step_cost.compiled_bytes_accessed(compiled)
  (module,) = compiled.runtime_executable().hlo_modules()
  analysis = compat.cost_analysis(jax.devices("cpu")[0].client, module)
  return float(analysis.get("flops", 0.0)), float(analysis.get("bytes accessed", 0.0))


def measure(
  lowered: Any,
  num_devices: int,
  node_size: Optional[int] = None,
  compiler_options: Optional[dict[str, Any]] = None,
) -> tuple[Measure, Optional[jax.stages.Compiled]]:
  """Compiles ``lowered`` (a `jax.stages.Lowered`, with XLA's ``compiler_options``) and
  reads its needs and costs; the compiled step too (None when XLA refused it).
  ``node_size``: see `hlo.totals`."""
  start = time.perf_counter()
  try:
    compiled = lowered.compile(compiler_options=compiler_options)
  except Exception as e:  # pylint: disable=broad-except
    needed = too_large_bytes(e)
    if needed is None:
      raise
    return Measure(None, needed, 0.0, 0.0, False, None, time.perf_counter() - start), None
  seconds = time.perf_counter() - start
  stats = compiled.memory_analysis()
  total = step_cost.peak_bytes(compiled)
  memory = Memory(
    stats.argument_size_in_bytes,
    stats.output_size_in_bytes,
    stats.alias_size_in_bytes,
    stats.temp_size_in_bytes,
    stats.generated_code_size_in_bytes,
    total,
  )
  text = compiled.as_text()
  flops, bytes_accessed = _cost_analysis(compiled)
  loops = step_cost.has_loops(compiled)
  unknown = 0
  if loops:  # XLA counted each loop body once: the other iterations added
    extra = loop_cost.loop_cost(text)
    flops, bytes_accessed = flops + extra.extra_flops, bytes_accessed + extra.extra_bytes
    unknown = extra.unknown_trip_counts
  measured = Measure(
    memory,
    total,
    flops,
    bytes_accessed,
    loops,
    hlo.totals(text, num_devices, node_size),
    seconds,
    unknown,
  )
  return measured, compiled


@dataclasses.dataclass(frozen=True)
class StepTime:
  """The step-time lower bound on one device, and which resource sets it."""

  compute_s: float  # step FLOPs per device / peak FLOP/s
  hbm_s: float  # HBM bytes per device / HBM bandwidth
  ici_s: float  # ring traffic of the collectives / ICI (GPUs: NVLink) bandwidth, both ways
  bound_s: float
  limited_by: str  # 'compute', 'HBM', 'ICI', or on GPUs 'NVLink' or 'network'
  mfu: Optional[float]  # model FLOPs / (bound x devices x peak): the best MFU possible
  network_s: float = 0.0  # GPU nodes: traffic of the collectives between nodes / network


def train_step_time(
  measured: Measure,
  compiled: Any,
  chip: Chip,
  *,
  num_devices: int,
  model_flops: Optional[float],
  dtype: str,
) -> tuple[Optional[float], str, Optional[StepTime]]:
  """(FLOPs of one step over all devices, their source, the step-time bound) of a train
  step: XLA's count on TPUs (its loops multiplied out, `loop_cost`), the analytic
  ``model_flops`` elsewhere (XLA:GPU's matrix products are cuBLAS/cuDNN calls its cost
  analysis does not count); (None, 'none', None) where XLA refused the program."""
  if compiled is None:
    return None, "none", None
  if chip.platform == "tpu":
    step_flops = measured.xla_flops * num_devices
    source = "xla, loops multiplied out" if measured.has_loops else "xla"
  else:
    step_flops, source = model_flops, "analytic"
  if not step_flops:
    return step_flops, source, None
  timing = step_time(
    measured,
    chip,
    num_devices=num_devices,
    step_flops=step_flops,
    model_flops=model_flops,
    dtype=dtype,
  )
  return step_flops, source, timing


def step_time(
  measured: Measure,
  chip: Chip,
  *,
  num_devices: int,
  step_flops: float,
  model_flops: Optional[float],
  dtype: str = "bfloat16",
) -> StepTime:
  """The lower bound for ``measured`` on ``chip``, whose products run in ``dtype``.

  ``step_flops``: every FLOP the step executes (XLA's count with its loops multiplied
  out, `loop_cost`; on GPUs the analytic one, as XLA:GPU's count leaves out the cuBLAS and
  cuDNN products); ``model_flops``: the model's analytic count that MFU is defined on.
  The HBM traffic is XLA's, loops multiplied out the same way.
  """
  flops_per_device = step_flops / num_devices
  traffic = measured.xla_bytes_accessed
  totals = measured.collectives
  ici = sum(totals.traffic_bytes.values()) - totals.network_traffic_bytes if totals else 0.0
  network = totals.network_traffic_bytes if totals else 0.0
  peak = chip.peak_flops_for(dtype)
  times = {
    "compute": flops_per_device / peak,
    "HBM": traffic / chip.per_device(chip.hbm_bytes_per_s),
    # A device sends and receives its traffic: both directions of its share of the links.
    chip.interconnect: 2 * ici / chip.per_device(chip.ici_bytes_per_s),
  }
  if chip.network_bytes_per_s:
    times["network"] = 2 * network / chip.network_bytes_per_s
  limited_by = max(times, key=times.get)
  bound = times[limited_by]
  mfu = model_flops / (bound * num_devices * peak) if model_flops and bound > 0 else None
  return StepTime(
    times["compute"],
    times["HBM"],
    times[chip.interconnect],
    bound,
    limited_by,
    mfu,
    times.get("network", 0.0),
  )


# TensorCores per chip, the unit of the papers' "TPUv3 core-days" (v4 and v5p join their
# two into one JAX device; v5e and v6e have one).
TENSORCORES_PER_CHIP = {"v2": 2, "v3": 2, "v4": 2, "v5p": 2, "v5e": 1, "v6e": 1}


@dataclasses.dataclass(frozen=True)
class RunTotals:
  """The whole run at the step bound: ``total_steps`` steps of ``batch`` images."""

  hours_at_bound: Optional[float]  # total_steps x the step-time bound
  core_days: Optional[float]  # TensorCore-days at that bound, as the papers count compute
  exaflops: Optional[float]  # analytic: 3 x forward FLOPs per image x images seen
  exaflops_xla: Optional[float]  # XLA's (or the looped step's analytic) step FLOPs x steps


def run_totals(
  *,
  total_steps: int,
  batch: int,
  chip: Chip,
  chips: int,
  bound_s: Optional[float],
  train_flops_per_image: Optional[float],
  step_flops: Optional[float],
) -> RunTotals:
  """`RunTotals` of a run; None where the step's bound or FLOPs are unknown.

  ``train_flops_per_image``: the analytic forward count x 3 (forward and backward), as
  the ViT paper counts a training image (`step_cost.vit_flops_per_image`).
  """
  hours = total_steps * bound_s / 3600 if bound_s else None
  cores = chips * TENSORCORES_PER_CHIP.get(chip.name, chip.devices_per_chip)
  exa = 1e18
  return RunTotals(
    hours_at_bound=hours,
    core_days=hours * cores / 24 if hours is not None else None,
    exaflops=train_flops_per_image * batch * total_steps / exa if train_flops_per_image else None,
    exaflops_xla=step_flops * total_steps / exa if step_flops else None,
  )


def gib(value: float) -> str:
  return f"{value / GIB:.2f} GiB"
