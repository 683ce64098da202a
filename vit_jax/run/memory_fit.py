"""Will a train step fit: the memory probes (a device's limit, this machine's available
memory) and `accum_steps='auto'`, the fewest micro-batches whose compiled train step fits
the device.

Run by `vit_jax.run.resolve` (so a built step only ever sees an int) and the loop's check
of the compiled step.

Each candidate is compiled (not run) and its peak memory read from XLA's memory analysis
(`step_cost.peak_bytes`), so a batch that does not fit is found without an out-of-memory
crash. Candidates are the accumulation counts A that split the global batch evenly over
the 'data' devices, smallest first; when even the largest does not fit, the same search
repeats with `model.remat` (recompute each block's activations in the backward pass).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
from absl import logging

from vit_jax.run import step_cost

AUTO = "auto"
# Leave this share of the device's memory free: XLA's analysis omits the runtime's own
# buffers (allocator fragmentation, collectives' scratch, the input pipeline's prefetch).
HEADROOM = 0.1


@dataclasses.dataclass(frozen=True)
class Fit:
  accum_steps: int
  remat: bool
  peak_bytes: int  # 0 where nothing was compiled (no memory limit)


def device_memory_limit(device: Any) -> Optional[int]:
  """Bytes the runtime lets one device allocate; None where it reports none (a CPU, or a
  device this process cannot address, such as a compile-only TPU)."""
  try:
    stats = device.memory_stats()
  except jax.errors.JaxRuntimeError:
    return None
  return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def local_device(mesh: jax.sharding.Mesh) -> Any:
  """A device of ``mesh`` that this process drives (the first one if it drives none)."""
  devices = list(mesh.devices.flat)
  return next((d for d in devices if d.process_index == jax.process_index()), devices[0])


def host_memory_available() -> Optional[int]:
  """Bytes this machine can still give a process (MemAvailable); None where unknown."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def per_device_limit(mesh: jax.sharding.Mesh) -> tuple[Optional[int], str]:
  """(bytes one device of ``mesh`` may use, what that is): the device's own limit, or on a
  CPU this machine's available memory shared by its local devices; None when unknown."""
  device = local_device(mesh)
  limit = device_memory_limit(device)
  if limit is not None:
    return limit, f"the {device.device_kind} device's memory"
  available = host_memory_available()
  if available is None:
    return None, "unknown"
  local = sum(d.process_index == device.process_index for d in mesh.devices.flat)
  return available // local, f"this machine's available memory (shared by {local} devices)"


def accum_candidates(batch: int, data_size: int) -> list[int]:
  """Accumulation counts A, ascending, with batch divisible by A x data_size."""
  return [a for a in range(1, batch // data_size + 1) if batch % (a * data_size) == 0]


def fit(
  compile_step: Callable[[int, bool], Optional[jax.stages.Compiled]],
  *,
  batch: int,
  data_size: int,
  limit_bytes: Optional[int],
  remat: bool,
) -> Fit:
  """The smallest accumulation (then remat) whose compiled step fits ``limit_bytes``.

  ``compile_step(accum_steps, remat)`` compiles a candidate, or returns None when the
  compiler refused it for the device's memory (XLA:TPU does, at compile time). Memory
  falls as A grows, so after A=1 the search bisects the candidates: about log2 of their
  count compilations.
  ``remat``: the model's setting; remat is tried only where it is off.
  """
  if limit_bytes is None:
    logging.info("accum_steps='auto': the device reports no memory limit (CPU); using 1.")
    return Fit(1, remat, 0)
  budget = int(limit_bytes * (1 - HEADROOM))
  gib = 2.0**30
  tried: dict[tuple[int, bool], Fit] = {}

  def attempt(accum: int, with_remat: bool) -> Fit:
    if (accum, with_remat) not in tried:
      compiled = compile_step(accum, with_remat)
      peak = limit_bytes + 1 if compiled is None else step_cost.peak_bytes(compiled)
      tried[accum, with_remat] = Fit(accum, with_remat, peak)
      need = (
        f"more than the device's {limit_bytes / gib:.2f} GiB (refused by the compiler)"
        if compiled is None
        else f"{peak / gib:.2f} GiB per device"
      )
      logging.info(
        "accum_steps='auto': accum_steps=%d remat=%s needs %s (budget %.2f GiB).",
        accum,
        with_remat,
        need,
        budget / gib,
      )
    return tried[accum, with_remat]

  candidates = accum_candidates(batch, data_size)
  for with_remat in (remat,) if remat else (False, True):
    if attempt(candidates[0], with_remat).peak_bytes <= budget:
      chosen_accum = candidates[0]
    elif attempt(candidates[-1], with_remat).peak_bytes > budget:
      continue
    else:
      lo, hi = 0, len(candidates) - 1  # candidates[lo] does not fit, candidates[hi] does
      while hi - lo > 1:
        mid = (lo + hi) // 2
        if attempt(candidates[mid], with_remat).peak_bytes <= budget:
          hi = mid
        else:
          lo = mid
      chosen_accum = candidates[hi]
    chosen = tried[chosen_accum, with_remat]
    logging.info(
      "accum_steps='auto' chose accum_steps=%d (micro-batch %d per device) "
      "remat=%s: %.2f GiB of the %.2f GiB budget (%d%% of %.2f GiB), the fewest "
      "micro-batches that fit.",
      chosen.accum_steps,
      batch // (chosen.accum_steps * data_size),
      with_remat,
      chosen.peak_bytes / gib,
      budget / gib,
      round(100 * (1 - HEADROOM)),
      limit_bytes / gib,
    )
    return chosen
  smallest = min(f.peak_bytes for f in tried.values())
  raise ValueError(
    f"accum_steps='auto': no train step for batch={batch} fits the device's "
    f"{limit_bytes / gib:.2f} GiB (the smallest, {smallest / gib:.2f} GiB, is one example "
    f"per device with remat): use a smaller model, a lower resolution or more devices."
  )
