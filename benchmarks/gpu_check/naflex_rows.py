"""NaFlex on the GPU: its padded attention through the fused kernel against the einsum
path (`row_masked_attention`), and the train step's tokens per second at one budget and
at a mix of budgets whose batch keeps the tokens per step about constant, as timm's
NaFlex loader sizes them (`row_mixed_budgets`)."""

from __future__ import annotations

import time
from typing import Any

from benchmarks.gpu_check import measure
from benchmarks.gpu_check.config import DEFAULT, get_config

# ViT-B/16's table at its 224 grid, resized to each image's; budgets in patches per image.
TABLE_GRID = (14, 14)
BUDGETS = (128, 256, 576)
FIXED_BUDGET = 256
TOKENS_PER_STEP = 256 * 256  # ViT-B/16's batch of 256 at 256 patches
ROUNDS = 3  # interleaved rounds of fixed-budget and mixed-budget steps
STEPS_PER_ROUND = 10
# --smoke: 2x2 patches of the tiny model (`config.SMOKE`'s 32-pixel crop) and 32 tokens.
SMOKE_TABLE_GRID, SMOKE_BUDGETS, SMOKE_FIXED, SMOKE_TOKENS = (2, 2), (4, 8, 16), 8, 32


def naflex_config(seq_len: int, batch: int, attention: str = DEFAULT) -> Any:
  """ViT-B/16's train row (`config.get_config`) on NaFlex inputs of ``seq_len`` patches."""
  config = get_config(f"ViT-B_16,{batch},{attention}")
  config.model.posemb_grid = TABLE_GRID
  config.model.posemb_resample = "bilinear"
  config.pp.seq_len = seq_len
  return config


def naflex_rows(batch: int, seq_len: int, patch: int, seed: int) -> Any:
  """A packed batch float32 [batch, seq_len, P * P * 3 + 3] (`naflex_images.pack`):
  images of aspect ratios from 1:4 to 4:1, each at its largest grid within ``seq_len``,
  their pixels uniform in [-1, 1], the rest padding."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  from vit_jax.data import naflex_images  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)
  inputs = naflex_images.NaFlexInputs(patch, seq_len)
  rows = np.zeros((batch, *inputs.row_shape), np.float32)
  for i, ratio in enumerate(np.exp(rng.uniform(np.log(0.25), np.log(4.0), batch))):
    h, w = naflex_images.sequence_grid((int(1000 * ratio), 1000), patch, seq_len)
    n = h * w
    coords = np.zeros((seq_len, 2), np.int32)
    coords[:n] = np.stack(np.divmod(np.arange(n), w), axis=-1)
    patches = np.zeros((seq_len, patch * patch * 3), np.float32)
    patches[:n] = rng.uniform(-1, 1, (n, patch * patch * 3))
    naflex_images.pack(patches, coords, np.arange(seq_len) < n, out=rows[i])
  return rows


def _shrunk(config: Any, smoke: bool) -> Any:
  config = measure.shrink(config, smoke)
  if smoke:
    config.model.posemb_grid = SMOKE_TABLE_GRID
  return config


def row_masked_attention(smoke: bool) -> dict[str, Any]:
  """ViT-B/16's features and gradients on padded NaFlex batches (budget 256, bf16): the
  fused attention (cuDNN's padding mask; 'xla' on the CPU) against the einsum path's
  explicit mask, and whether the compiled program calls cuDNN's fused attention."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from vit_jax import models  # pylint: disable=g-import-not-at-top
  from vit_jax.models import naflex, vit  # pylint: disable=g-import-not-at-top
  from vit_jax.models.execution import ExecutionOptions  # pylint: disable=g-import-not-at-top

  fused_impl = "xla" if smoke else "cudnn"
  config = _shrunk(naflex_config(SMOKE_FIXED if smoke else FIXED_BUDGET, 8), smoke)
  settings = models.model_settings(config.model)
  patch = settings.patches.size[0]
  batch = naflex.NaFlexPatches.unpack(jnp.asarray(naflex_rows(8, config.pp.seq_len, patch, 0)))
  dtype = jnp.float32 if smoke else jnp.bfloat16
  nets = {
    impl: vit.VisionTransformer(settings, None, ExecutionOptions(attention_impl=impl, dtype=dtype))
    for impl in ("einsum", fused_impl)
  }
  params = nets["einsum"].init(jax.random.key(0), batch)
  results: dict[str, Any] = dict(device=measure.device_info(), fused=fused_impl, ok=True)
  for impl, net in nets.items():
    loss = lambda p, net=net: jnp.sin(net.apply(p, batch).astype(jnp.float32)).sum()
    fn = jax.jit(jax.value_and_grad(loss))
    compiled = fn.lower(params).compile()
    results[impl] = jax.device_get(compiled(params))
    results[f"{impl}_calls_cudnn_attention"] = "__cudnn$fmha" in compiled.as_text()
    features = jax.jit(net.apply)(params, batch)
    results[f"{impl}_features"] = jax.device_get(features.astype(jnp.float32))
  einsum, fused = results.pop("einsum"), results.pop(fused_impl)
  results["features_rel_diff"] = measure.relative_difference(
    results.pop(f"{fused_impl}_features"), results.pop("einsum_features")
  )
  results["grad_rel_diff"] = measure.relative_difference(fused[1], einsum[1])
  # bf16 features and gradients: within 2% of the einsum path's (the same function).
  results["ok"] = bool(results["features_rel_diff"] < 2e-2 and results["grad_rel_diff"] < 2e-2)
  if not smoke:
    results["ok"] = results["ok"] and results[f"{fused_impl}_calls_cudnn_attention"]
  return results


def row_mixed_budgets(smoke: bool) -> dict[str, Any]:
  """ViT-B/16's train step at `BUDGETS` patches, one compiled step per budget with the
  batch `TOKENS_PER_STEP` // budget (`time_budget_mix`)."""
  budgets = SMOKE_BUDGETS if smoke else BUDGETS
  tokens = SMOKE_TOKENS if smoke else TOKENS_PER_STEP
  configs = {}
  for budget in budgets:
    config = _shrunk(naflex_config(budget, tokens // budget), smoke)
    config.batch = config.batch_eval = tokens // budget  # the smoke's too
    configs[budget] = config
  rounds, per_round = (1, 2) if smoke else (ROUNDS, STEPS_PER_ROUND)
  return time_budget_mix(configs, SMOKE_FIXED if smoke else FIXED_BUDGET, rounds, per_round)


def time_budget_mix(
  configs: dict[int, Any], fixed: int, rounds: int, per_round: int
) -> dict[str, Any]:
  """The train step of each budget's run config (``configs``: budget -> config, its batch
  set), one compiled step per budget on one state: ``per_round`` steps at ``fixed`` alone
  and as many whose budget is drawn at random each step, in ``rounds`` interleaved
  rounds; the tokens per second of each (real patches and padding alike: the step's
  work), their ratio, and each budget's median step, MFU and compiled memory."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from vit_jax import models, run  # pylint: disable=g-import-not-at-top
  from vit_jax.run import step_cost  # pylint: disable=g-import-not-at-top

  budgets = tuple(configs)
  peak = None  # the device's dense peak FLOP/s in the step's compute dtype
  steps, per_budget, state = {}, {}, None
  for budget, config in configs.items():
    batch = config.batch
    trainer = run.build(config, open_data=False)
    state = state or trainer.init_state()  # one state: the step's shapes are the batch's
    peak = step_cost.peak_flops(jax.devices()[0], trainer.spec.model.dtype)
    start = time.perf_counter()
    compiled = trainer.compile_train_step()
    compile_s = time.perf_counter() - start
    host = measure.synthetic_batch(trainer)
    patch = trainer.spec.model.patches.size[0]
    host["image"] = naflex_rows(batch, budget, patch, seed=budget)
    steps[budget] = (compiled, jax.device_put(host, trainer.batch_sharding))
    per_budget[budget] = dict(
      batch=batch,
      tokens=batch * budget,
      compile_s=compile_s,
      # analytic (`models.cost`, padding counted): XLA's count leaves cuDNN's calls out
      tflop_per_step=trainer.train_flops_per_example() * batch / 1e12,
      compiled_peak_bytes=step_cost.peak_bytes(compiled),
    )
  holder = {"state": state}

  def step(budget: int) -> float:
    compiled, batch = steps[budget]
    begin = time.perf_counter()
    holder["state"], metrics = compiled(holder["state"], batch)
    jax.block_until_ready(metrics)
    return time.perf_counter() - begin

  for budget in budgets:  # warm-up
    step(budget)
  rng = np.random.default_rng(0)
  timings: dict[str, list[tuple[int, float]]] = {"fixed": [], "mixed": []}
  for _ in range(rounds):
    timings["fixed"] += [(fixed, step(fixed)) for _ in range(per_round)]
    drawn = rng.choice(budgets, per_round)
    timings["mixed"] += [(int(b), step(int(b))) for b in drawn]
  rate = {
    kind: sum(per_budget[b]["tokens"] for b, _ in pairs) / sum(t for _, t in pairs)
    for kind, pairs in timings.items()
  }
  for budget in budgets:
    times = sorted(t for kind in timings for b, t in timings[kind] if b == budget)
    if times:
      median = times[len(times) // 2]
      b = per_budget[budget]
      b.update(step_ms_median=1e3 * median, tokens_s=b["tokens"] / median)
      b["mfu"] = peak and 1e12 * b["tflop_per_step"] / median / peak
  loss = float(jax.device_get(steps[fixed][0](holder["state"], steps[fixed][1])[1]["train/loss"]))
  stats = jax.devices()[0].memory_stats() or {}
  return dict(
    device=measure.device_info(),
    budgets={str(b): v for b, v in per_budget.items()},
    fixed_tokens_s=rate["fixed"],
    mixed_tokens_s=rate["mixed"],
    mixed_over_fixed=rate["mixed"] / rate["fixed"],
    step_ms_median=per_budget[fixed].get("step_ms_median"),
    attention=models.image_settings(trainer.spec.model).attention_impl,
    dtype=str(models.image_settings(trainer.spec.model).dtype),
    peak_bytes_in_use=stats.get("peak_bytes_in_use"),
    final_loss=loss,
    ok=bool(np.isfinite(loss)),
  )
