"""Timing the run's own steps on synthetic batches: the figures every speed row reports
(img/s, the median and spread of `TIMED_STEPS` blocked steps, MFU against the published
dense peak of the compute dtype, memory against the compiled prediction)."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Optional

from benchmarks.gpu_check.config import SMOKE, TIMED_STEPS, WARMUP_STEPS, smoke_model


def device_info() -> dict[str, Any]:
  import jax  # pylint: disable=g-import-not-at-top

  device = jax.devices()[0]
  return dict(platform=device.platform, device_kind=device.device_kind, count=jax.device_count())


def relative_difference(a: Any, b: Any) -> float:
  """||a - b|| / ||b|| over a whole tree (float64 on the host)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  la = [np.asarray(x, np.float64) for x in jax.tree.leaves(jax.device_get(a))]
  lb = [np.asarray(x, np.float64) for x in jax.tree.leaves(jax.device_get(b))]
  diff = sum(float(np.sum((x - y) ** 2)) for x, y in zip(la, lb))
  norm = sum(float(np.sum(y**2)) for y in lb)
  return (diff / max(norm, 1e-30)) ** 0.5


def shrink(config: Any, smoke: bool) -> Any:
  """``config`` at the smoke shapes (`SMOKE`, a tiny model) when ``smoke``; a dtype set to
  bfloat16 computes in float32 there (the CPU compiles bfloat16 steps several times slower;
  the code path is the same)."""
  if smoke:
    smoke_model(config.model)
    image = config.model.image if "image" in config.model else config.model
    image.dtype = image.dtype and "float32"
    config.pp.crop = SMOKE["resolution"]
    config.batch = config.batch_eval = SMOKE["batch"]
  return config


def synthetic_batch(trainer: Any, seed: int = 0) -> dict[str, Any]:
  """A host batch of the train step's own fields (`RunSteps.abstract_train_batch`): images
  in [-1, 1] (0..255 values when the step runs RandAugment), one-hot labels, token ids."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)
  batch = {}
  for name, leaf in trainer.abstract_train_batch().items():
    shape, dtype = leaf.shape, np.dtype(leaf.dtype)
    if name == "image" and trainer.spec.data.randaug:
      batch[name] = rng.integers(0, 256, shape).astype(dtype)
    elif name == "image":
      batch[name] = rng.uniform(-1, 1, shape).astype(dtype)
    elif name == "label":
      batch[name] = np.eye(shape[-1], dtype=dtype)[rng.integers(0, shape[-1], shape[0])]
    else:  # token ids: any small values are valid ids
      batch[name] = rng.integers(1, 100, shape).astype(dtype)
  return batch


def timed(fn: Callable[[], Any], steps: int, warmup: int) -> list[float]:
  """Seconds of each of ``steps`` blocked calls after ``warmup`` untimed ones."""
  import jax  # pylint: disable=g-import-not-at-top

  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return times


def counts(smoke: bool) -> tuple[int, int]:
  """(timed steps, warm-up steps) of a row."""
  return (SMOKE["steps"], SMOKE["warmup"]) if smoke else (TIMED_STEPS, WARMUP_STEPS)


def figures(
  times: list[float],
  batch: int,
  flops_per_example: Optional[float],
  dtype: str,
  compiled: Any,
  compile_s: float,
) -> dict[str, Any]:
  """The row's figures from its step times and compiled program, with ``hlo_step_ms``:
  the plan's estimate (`vit_jax.plan.gpu_estimate`) of the program this GPU compiled
  (None off a GPU the estimate knows)."""
  import jax  # pylint: disable=g-import-not-at-top

  from vit_jax.infra import hardware  # pylint: disable=g-import-not-at-top
  from vit_jax.plan import gpu_estimate  # pylint: disable=g-import-not-at-top
  from vit_jax.run import step_cost  # pylint: disable=g-import-not-at-top

  median = sorted(times)[len(times) // 2]
  device = jax.devices()[0]
  peak = step_cost.peak_flops(device, dtype)
  img_s = batch / median
  flops_xla, _ = step_cost.step_flops(compiled, jax.device_count(), analytic=None)
  stats = device.memory_stats() or {}
  rate = flops_per_example * img_s if flops_per_example else None
  chip = hardware.chip_for_device_kind(device.device_kind)
  estimate, why = None, None
  try:  # a figure beside the row's, never the reason it fails
    estimate = chip and gpu_estimate.of_compiled(compiled, chip)
  except Exception as e:  # pylint: disable=broad-except
    why = f"{type(e).__name__}: {e}"[-300:]
  return dict(
    device=device_info(),
    dtype=dtype,
    batch=batch,
    img_s=img_s,
    step_ms_median=1e3 * median,
    step_ms_min=1e3 * min(times),
    step_ms_max=1e3 * max(times),
    hlo_step_ms=1e3 * estimate.step_s if estimate else None,
    hlo_estimate_error=why,
    gflop_per_img_analytic=flops_per_example / 1e9 if flops_per_example else None,
    gflop_per_img_xla=flops_xla / batch / 1e9 if flops_xla else None,
    tflop_s=rate / 1e12 if rate else None,
    mfu=rate / peak if rate and peak else None,
    peak_tflop_s=peak / 1e12 if peak else None,
    compile_s=compile_s,
    peak_bytes_in_use=stats.get("peak_bytes_in_use"),
    bytes_limit=stats.get("bytes_limit"),
    compiled_peak_bytes=step_cost.peak_bytes(compiled),
  )


def train_row(
  config: Any,
  smoke: bool,
  feed: Optional[Callable[[Any], Iterator[Any]]] = None,
  profile_steps: int = 0,
) -> dict[str, Any]:
  """The run's train step of ``config`` (`vit_jax.run.build`): compiled once, warmed up,
  timed on one synthetic batch already on the device, or on the batches ``feed(steps)``
  gives (the input pipeline's global batches) when given; with ``profile_steps``, where
  the device's time goes over that many more steps (`kernel_profile.profile_steps`)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from vit_jax import models, run  # pylint: disable=g-import-not-at-top

  trainer = run.build(shrink(config, smoke), open_data=feed is not None)
  holder = {"state": trainer.init_state()}
  start = time.perf_counter()
  compiled = trainer.compile_train_step()
  compile_s = time.perf_counter() - start
  if feed is None:
    fixed = jax.device_put(synthetic_batch(trainer), trainer.batch_sharding)
    batches = iter(lambda: fixed, None)  # endless
  else:
    batches = feed(trainer)

  def step():
    holder["state"], metrics = compiled(holder["state"], next(batches))
    return metrics

  spec = trainer.spec
  result = figures(
    timed(step, *counts(smoke)),
    spec.batch,
    trainer.train_flops_per_example(),
    str(spec.model.dtype),
    compiled,
    compile_s,
  )
  final_loss = float(step()["train/loss"])
  result.update(
    attention=models.image_settings(spec.model).attention_impl,
    final_loss=final_loss,
    ok=bool(np.isfinite(final_loss)),
  )
  if profile_steps:
    from benchmarks.gpu_check import kernel_profile  # pylint: disable=g-import-not-at-top

    result["profile"] = kernel_profile.profile_steps(step, profile_steps)
  return result


def infer_row(config: Any, smoke: bool) -> dict[str, Any]:
  """The forward pass of ``config``'s model on a synthetic batch, as `train_row` times."""
  import jax  # pylint: disable=g-import-not-at-top

  from vit_jax import run  # pylint: disable=g-import-not-at-top
  from vit_jax.run import step_cost  # pylint: disable=g-import-not-at-top

  trainer = run.build(shrink(config, smoke), open_data=False)
  params = trainer.init_state().params
  images = jax.device_put(synthetic_batch(trainer)["image"], trainer.batch_sharding)
  model = trainer.objective.model
  start = time.perf_counter()
  compiled = (
    jax.jit(lambda p, x: model.apply({"params": p}, x, train=False)).lower(params, images).compile()
  )
  compile_s = time.perf_counter() - start
  spec = trainer.spec
  flops = step_cost.vit_flops_per_image(spec.model, spec.crop, spec.num_classes, train=False)
  result = figures(
    timed(lambda: compiled(params, images), *counts(smoke)),
    spec.batch,
    flops,
    str(spec.model.dtype),
    compiled,
    compile_s,
  )
  result.update(attention=spec.model.attention_impl, ok=True)
  return result
