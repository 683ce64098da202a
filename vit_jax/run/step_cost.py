"""What a compiled step costs and what the device can do: FLOPs, memory, peak, MFU.

The benchmark (`benchmarks/throughput.py`), the training run's MFU and the memory-fitted
accumulation (`vit_jax.run.memory_fit`) all read a step's cost from here:

- `compiled_flops`, `compiled_bytes_accessed`: XLA's cost analysis of a compiled step,
  the FLOPs and memory traffic of one device's program. XLA counts the body of a loop (a
  scanned encoder, gradient accumulation) once, whatever its trip count; `has_loops` says
  when that happened.
- `vit_flops_per_image`: the analytic count of any family's matrix products and
  convolutions (the family registry's, `vit_jax.models.families`), a check on the above
  and the count for programs with loops; `vit_activation_bytes` its activation bound.
- `peak_bytes`: the device memory a compiled step needs, from XLA's memory analysis.
- `peak_flops`: the device's dense peak for a compute dtype (the published figures of
  `vit_jax.infra.hardware`, which the plan reads too; on a CPU, a measured f32 matrix product).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import models
from vit_jax.infra import hardware
from vit_jax.models.settings import Settings

# The CPU's peak is measured: an f32 product of two square matrices of this size.
CPU_MATMUL_SIZE = 2048


def _cost(compiled: jax.stages.Compiled, key: str) -> float:
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # older JAX: one dict per program
    analysis = analysis[0] if analysis else {}
  return float((analysis or {}).get(key, 0.0))


def compiled_flops(compiled: jax.stages.Compiled) -> float:
  """FLOPs of one device's program, from XLA's cost analysis (0 when it gives none)."""
  return _cost(compiled, "flops")


def compiled_bytes_accessed(compiled: jax.stages.Compiled) -> float:
  """Bytes one device's program reads and writes by XLA's cost analysis (0 when none).

  Independent of the machine's load, unlike a timing: what a change of formulation (an
  attention layout, a fusion) saves in memory traffic. Loop bodies count once, as FLOPs.
  """
  return _cost(compiled, "bytes accessed")


def has_loops(compiled: jax.stages.Compiled) -> bool:
  """Whether the program has a while loop, whose body XLA's cost analysis counts once."""
  return " while(" in compiled.as_text()


def peak_bytes(compiled: jax.stages.Compiled) -> int:
  """Device memory one device needs for the step: arguments, outputs, temporaries, code.

  XLA's temporaries are one allocation sized for their peak; donated arguments (aliases)
  are not counted twice. (The analysis's own `peak_memory_in_bytes` leaves temporaries
  out on the CPU.)
  """
  stats = compiled.memory_analysis()
  if stats is None:
    return 0
  return int(
    stats.argument_size_in_bytes
    + stats.output_size_in_bytes
    - stats.alias_size_in_bytes
    + stats.temp_size_in_bytes
    + stats.generated_code_size_in_bytes
  )


def vit_flops_per_image(
  model_config: Settings | ml_collections.ConfigDict,
  image_size: int,
  num_classes: int,
  *,
  train: bool,
) -> Optional[float]:
  """The analytic FLOPs of one image through any family's model (its registry record's
  count: `models.cost` for the ViT, its hybrids and BiT, `models.mixer` for the Mixer):
  2 per multiply-add of the matrix products and convolutions, a train step 3x the forward
  pass, remat not counted (the model's count that MFU is defined on). None: unknown."""
  cfg = models.model_settings(model_config)
  return models.family_of(cfg).flops_per_image(cfg, image_size, num_classes, train=train)


def vit_activation_bytes(
  model_config: Settings | ml_collections.ConfigDict,
  image_size: int,
  images: int,
  compiler_rematerializes: bool = False,
) -> Optional[int]:
  """A lower bound of the activations any family's train step keeps for its backward pass
  on ``images`` images (its registry record's bound; None where it has none). XLA's TPU
  and GPU compilers rematerialize on their own when a program exceeds the device
  (``compiler_rematerializes``). Used to refuse a resolution or batch that cannot fit
  before anything is compiled."""
  cfg = models.model_settings(model_config)
  bound = models.family_of(cfg).activation_bytes
  return bound(cfg, image_size, images, compiler_rematerializes)


@functools.cache
def measured_cpu_peak_flops(size: int = CPU_MATMUL_SIZE, repeats: int = 5) -> float:
  """FLOP/s of XLA's f32 [size, size] x [size, size] product on the CPU, best of ``repeats``."""
  a = jax.device_put(np.ones((size, size), np.float32), jax.devices("cpu")[0])
  matmul = jax.jit(jnp.matmul)
  matmul(a, a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, a).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2.0 * size**3 / best


def peak_flops(device: Any, dtype: Any = jnp.float32) -> Optional[float]:
  """The dense peak FLOP/s of one ``device`` for ``dtype`` compute; None when unknown.

  A CPU's is measured (f32, whatever ``dtype``: it has no faster matrix unit that XLA uses).
  """
  if device.platform == "cpu":
    return measured_cpu_peak_flops()
  chip = hardware.chip_for_device_kind(device.device_kind)
  return chip.published_peak_flops(np.dtype(dtype).name) if chip else None


def peak_source(device: Any, dtype: Any = jnp.float32) -> str:
  """What `peak_flops` of ``device`` is, for the log: measured (a CPU) or published."""
  if device.platform == "cpu":
    n = CPU_MATMUL_SIZE
    return f"the CPU's peak, measured at start: XLA's f32 {n}x{n} matrix product"
  return f"the published {np.dtype(dtype).name} peak of one {device.device_kind}"


def format_flops_rate(flops_per_s: float) -> str:
  """1.2e11 -> '120 GFLOP/s'; 9.89e14 -> '989 TFLOP/s'."""
  if flops_per_s >= 1e12:
    return f"{flops_per_s / 1e12:.4g} TFLOP/s"
  return f"{flops_per_s / 1e9:.4g} GFLOP/s"


def step_flops(
  compiled: jax.stages.Compiled, num_devices: int, analytic: Optional[float]
) -> tuple[Optional[float], str]:
  """FLOPs of one step over all devices and their source: 'xla', 'analytic' or 'none'.

  XLA's count (one device's program times the devices) unless the program loops, where it
  would count each loop body once; then the ``analytic`` count, when there is one.
  """
  if not has_loops(compiled):
    return compiled_flops(compiled) * num_devices, "xla"
  return analytic, "analytic" if analytic else "none"
