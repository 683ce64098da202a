"""The correctness row: a small ViT's train step (AdamW, `CORRECTNESS_STEPS` steps, f32)
on the accelerator against the same step on the CPU backend of the same process, from the
same initial state and batches: loss, gradient norm and parameters, at f32 matrix
precision (`F32_RTOL`) and at the GPU's default precision (TF32 products, `TF32_RTOL`);
then cuDNN attention against XLA's in bf16 (logits and gradients, `BF16_RTOL`). On a CPU
(``--smoke``) XLA's `dot_product_attention` against the einsum attention."""

from __future__ import annotations

import contextlib
from typing import Any, Optional

from benchmarks.gpu_check import measure
from benchmarks.gpu_check.config import NUM_CLASSES, SMOKE, get_config, smoke_model

CORRECTNESS_STEPS = 3
F32_RTOL = 1e-4  # GPU vs CPU, f32 matrix products on both
TF32_RTOL = 2e-2  # GPU at its default precision (TF32 products) vs CPU
BF16_RTOL = 3e-2  # cuDNN vs XLA attention, bf16 compute


def _batch(rng: Any, batch: int, resolution: int, num_classes: int) -> dict[str, Any]:
  import numpy as np  # pylint: disable=g-import-not-at-top

  images = rng.uniform(-1, 1, (batch, resolution, resolution, 3)).astype(np.float32)
  labels = np.eye(num_classes, dtype=np.float32)[rng.integers(0, num_classes, batch)]
  return {"image": images, "label": labels}


def row_correctness(smoke: bool) -> dict[str, Any]:
  """GPU vs CPU train steps in f32; cuDNN vs XLA attention in bf16."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from vit_jax import run  # pylint: disable=g-import-not-at-top
  from vit_jax.infra import sharding  # pylint: disable=g-import-not-at-top

  accel = jax.devices()
  cpu = jax.devices("cpu")
  result: dict[str, Any] = dict(device=measure.device_info())
  resolution, batch, classes = 32, 8, 10
  config = get_config(f"ViT-Ti_16,{batch},einsum")
  config.model.dtype = "float32"
  config.pp.crop = resolution
  config.num_classes = classes
  config.lr.warmup_steps = 0  # full-size updates from the first step: differences show
  config.lr.base = 1e-3
  if smoke:
    smoke_model(config.model)

  def build(devices: list[Any]) -> Any:
    return run.build(
      config, mesh=sharding.make_mesh(tuple(config.mesh), devices[:1]), open_data=False
    )

  # On a CPU (--smoke) the accelerator is the CPU: the same steps.
  steps = {"cpu": build(cpu)}
  steps["accel"] = steps["cpu"] if accel[0].platform == "cpu" else build(accel)
  init = steps["cpu"].init_state()
  host_state = jax.device_get(init)
  rng = np.random.default_rng(0)
  batches = [_batch(rng, batch, resolution, classes) for _ in range(CORRECTNESS_STEPS)]

  def trajectory(kind: str, precision: Optional[str]) -> tuple[list[dict[str, float]], Any]:
    s = steps[kind]
    state = jax.device_put(host_state, s.state_shardings)
    metrics = []
    with jax.default_matmul_precision(precision) if precision else contextlib.nullcontext():
      for b in batches:
        state, m = s.train_step(state, jax.device_put(b, s.batch_sharding))
        metrics.append({k: float(v) for k, v in m.items()})
    return metrics, jax.device_get(state.params)

  reference, ref_params = trajectory("cpu", "float32")
  checks = {}
  for label, precision, rtol in (("f32", "float32", F32_RTOL), ("default", None, TF32_RTOL)):
    metrics, params = trajectory("accel", precision)

    def worst(key: str, metrics=metrics) -> float:  # the largest relative step difference
      return max(abs(a[key] - b[key]) / abs(b[key]) for a, b in zip(metrics, reference))

    loss, grad = worst("train/loss"), worst("train/grad_norm")
    param = measure.relative_difference(params, ref_params)
    checks[label] = dict(
      rtol=rtol,
      loss_rel=loss,
      grad_norm_rel=grad,
      params_rel=param,
      ok=bool(max(loss, grad, param) <= rtol),
    )
  checks["losses_cpu"] = [m["train/loss"] for m in reference]
  result["train_step_vs_cpu"] = checks
  result["attention"] = _attention_check(smoke)
  result["ok"] = bool(checks["f32"]["ok"] and checks["default"]["ok"] and result["attention"]["ok"])
  return result


def _attention_check(smoke: bool) -> dict[str, Any]:
  """cuDNN's fused attention against XLA's in bf16 (ViT-S/16: 64-wide heads, as cuDNN
  needs): logits and the gradient of a random projection of them. On a CPU (``--smoke``),
  XLA's `dot_product_attention` against the model's einsum attention, in float32 (the CPU
  compiles bfloat16 several times slower)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from vit_jax.models import create_model, get_model_config  # pylint: disable=g-import-not-at-top

  on_gpu = jax.devices()[0].platform == "gpu"
  test, reference = ("cudnn", "xla") if on_gpu else ("xla", "einsum")
  resolution = 224 if not smoke else SMOKE["resolution"]
  dtype = "float32" if smoke else "bfloat16"
  rng = np.random.default_rng(1)
  images = jnp.asarray(rng.uniform(-1, 1, (16, resolution, resolution, 3)), jnp.float32)
  weights = jnp.asarray(rng.standard_normal((16, NUM_CLASSES)), jnp.float32)
  outputs = {}
  params = None
  for impl in (reference, test):
    config = get_model_config("ViT-S_16")
    if smoke:
      smoke_model(config)
    config.dtype = dtype
    config.attention_impl = impl
    model = create_model(config, num_classes=NUM_CLASSES)
    if params is None:
      params = nn.unbox(model.init(jax.random.PRNGKey(0), images[:1], train=False)["params"])
      params = dict(params)
      # The head starts at zero: a random one, so that the logits and every gradient count.
      head = params["head"]["kernel"]
      params["head"] = dict(
        params["head"], kernel=0.02 * jax.random.normal(jax.random.PRNGKey(1), head.shape)
      )

    def objective(p, model=model, weights=weights):
      logits = model.apply({"params": p}, images, train=False).astype(jnp.float32)
      return jnp.sum(logits * weights), logits

    (_, logits), grads = jax.jit(jax.value_and_grad(objective, has_aux=True))(params)
    outputs[impl] = (logits, grads)
  logits_rel = measure.relative_difference(outputs[test][0], outputs[reference][0])
  grads_rel = measure.relative_difference(outputs[test][1], outputs[reference][1])
  return dict(
    test=test,
    reference=reference,
    dtype=dtype,
    rtol=BF16_RTOL,
    logits_rel=logits_rel,
    grads_rel=grads_rel,
    ok=bool(max(logits_rel, grads_rel) <= BF16_RTOL),
  )
