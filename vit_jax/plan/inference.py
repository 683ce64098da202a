"""A model's inference step on one TPU core, compiled, never run: the paper's Fig. 12.

    point = inference_point(models.get_model_config("ViT-B_16"), 384, hardware.CHIPS["v3"])
    point.largest_batch, point.images_per_s

The paper (Appendix D.5) measured on TPUv3 cores, across input sizes, the peak inference
throughput per core (the best over batch sizes) and the largest batch one core holds.
Here both come from XLA's own analyses of the compiled forward pass on one compile-only
core (libtpu): the largest batch by a search against the core's memory budget, and the
throughput as the step-time bound (max of FLOPs / peak and bytes accessed / HBM
bandwidth, `vit_jax.plan.report`'s bound without collectives) at the batches compiled.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import ml_collections

from vit_jax import models
from vit_jax.infra.hardware import Chip
from vit_jax.plan import report
from vit_jax.run import memory_fit

# Batches compiled first; memory grows close to linearly with the batch, so the two give
# the line the search extrapolates along.
PROBE_BATCHES = (16, 128)
# Compiles after the extrapolation before the search gives up (each corrects the line).
MAX_CONFIRMATIONS = 3
# The inference head: the classes of ImageNet, where the paper's models are evaluated.
NUM_CLASSES = 1000


@dataclasses.dataclass(frozen=True)
class Compiled:
  """One compiled forward pass of ``batch`` images on one core."""

  batch: int
  bytes_needed: int  # XLA's memory total, or what XLA said it needs when it refused
  fits: bool  # compiled, within the budget
  bound_s: Optional[float]  # the step-time bound; None where XLA refused the program


@dataclasses.dataclass(frozen=True)
class Point:
  """One model at one input size: Fig. 12's two quantities and the compiles behind them."""

  image_size: int
  largest_batch: int  # 0: not even the smallest probe fits
  images_per_s: Optional[float]  # the best bound over the fitting compiles
  compiles: tuple[Compiled, ...]


def forward_step(model_config: ml_collections.ConfigDict, image_size: int, dtype: str) -> Any:
  """The model's deterministic forward pass (logits) and its abstract parameters."""
  model = models.create_model(model_config, num_classes=NUM_CLASSES, dtype=jnp.dtype(dtype))
  images = jnp.zeros((1, image_size, image_size, 3), jnp.float32)  # [B, H, W, 3]
  params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), images))["params"]
  return lambda p, x: model.apply({"params": p}, x, train=False), params


def compile_forward(
  forward: Callable[..., Any],
  params: Any,
  image_size: int,
  batch: int,
  device: Any,
  chip: Chip,
  dtype: str,
  budget_bytes: float,
) -> Compiled:
  """``forward`` compiled for ``batch`` images on ``device``, and what it needs and costs."""
  placed = jax.sharding.SingleDeviceSharding(device)
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=placed), params)
  images = jax.ShapeDtypeStruct((batch, image_size, image_size, 3), jnp.float32, sharding=placed)
  lowered = jax.jit(forward).lower(abstract, images)
  measured, compiled = report.measure(lowered, num_devices=1)
  if compiled is None:
    return Compiled(batch, measured.needed_bytes, False, None)
  peak = chip.peak_flops_for(dtype)
  bound = max(
    measured.xla_flops / peak, measured.xla_bytes_accessed / chip.per_device(chip.hbm_bytes_per_s)
  )
  return Compiled(batch, measured.needed_bytes, measured.needed_bytes <= budget_bytes, bound)


def extrapolate(a: Compiled, b: Compiled, budget_bytes: float) -> int:
  """The batch at which the line through ``a`` and ``b`` (bytes against batch) meets
  ``budget_bytes``, rounded down; at least 1."""
  slope = (b.bytes_needed - a.bytes_needed) / (b.batch - a.batch)
  if slope <= 0:
    return max(a.batch, b.batch)
  return max(1, math.floor(a.batch + (budget_bytes - a.bytes_needed) / slope))


def largest_batch(compile_at: Callable[[int], Compiled], budget_bytes: float) -> list[Compiled]:
  """The compiles of the search, by batch; the largest fitting one is the answer.

  Compiles `PROBE_BATCHES`, extrapolates their memory linearly to the budget and
  compiles there; a miss corrects the line with the newest two compiles and tries again,
  `MAX_CONFIRMATIONS` compiles at most.
  """
  done = {b: compile_at(b) for b in PROBE_BATCHES}
  line = [done[b] for b in PROBE_BATCHES]
  if line[0].fits:
    for _ in range(MAX_CONFIRMATIONS):
      guess = extrapolate(line[0], line[1], budget_bytes)
      if guess in done:
        break
      done[guess] = compile_at(guess)
      if done[guess].fits:
        break
      line = [line[1], done[guess]]
  return sorted(done.values(), key=lambda c: c.batch)


def inference_point(
  model_config: ml_collections.ConfigDict,
  image_size: int,
  chip: Chip,
  device: Any,
  dtype: str = "bfloat16",
) -> Point:
  """Fig. 12 at one input size: the largest batch that fits the core's budget (the plan's
  90% of its HBM) and the best throughput bound over the fitting compiles."""
  forward, params = forward_step(model_config, image_size, dtype)
  budget = chip.per_device(chip.hbm_bytes) * (1 - memory_fit.HEADROOM)
  compiles = largest_batch(
    lambda b: compile_forward(forward, params, image_size, b, device, chip, dtype, budget),
    budget,
  )
  fitting = [c for c in compiles if c.fits]
  best = max((c.batch / c.bound_s for c in fitting if c.bound_s), default=None)
  return Point(image_size, max((c.batch for c in fitting), default=0), best, tuple(compiles))
