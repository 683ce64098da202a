r"""One prepared check on a GPU: correctness against the CPU, our train step's speed and
memory beside the plan's prediction, and timm on the same GPU in the same run.

    python benchmarks/gpu_check.py --out=DIR [--smoke] [--budget-s=420] [--only=ROW,...]

Writes ``DIR/gpu_check.json`` (every figure), ``DIR/gpu_check.md`` (the table) and
``DIR/gpu_check.log`` (each row's output). Rows, each in a process of its own so that
peak device memory (``memory_stats``) is the row's and an out-of-memory ends only it:

- ``correctness``: a small ViT's train step (AdamW, 3 steps, f32) on the GPU against the
  same step on the CPU backend of the same process, from the same initial state and
  batches: loss, gradient norm and parameters after 3 steps, at f32 matrix precision
  (relative tolerance `F32_RTOL`) and at the GPU's default precision (TF32 matrix
  products, `TF32_RTOL`); then cuDNN attention against XLA's in bf16 (logits and
  gradients, `BF16_RTOL`).
- ``train/<model>/<batch>/<attention>``: the run's own train step (`vit_jax.run.build`,
  AdamW, bf16 compute, synthetic batches already on the device), compiled once, warmed up,
  `TIMED_STEPS` timed steps: img/s, MFU against the published dense bf16 peak, peak device
  memory, and the memory ``python -m vit_jax.plan`` predicted for the same settings on
  that GPU (`PLAN_FILE`, computed on a CPU beforehand: ``--make-plan``).
- ``infer/ViT-B_16/512``: the forward pass in bf16.
- ``timm``: timm's ``vit_base_patch16_224`` on the same GPU: bf16 autocast, fused AdamW,
  ``torch.compile``, PyTorch's fused attention (timm's default), the same batch; and its
  inference. The table gives ours / timm per row.

Rows run in the order of `ROWS` until ``--budget-s`` is spent; a row that does not start in
time, fails or times out is recorded as such and the rest go on, so the files always come
back. ``--smoke`` runs every row on the CPU with tiny models (CI: tests/test_gpu_check.py).

On a lent GPU machine (jax 0.11 with the CUDA plugin, torch and timm installed; no
TensorFlow and no ml_collections, so ml_collections travels as a wheel), from a checkout:

    pip download --no-deps -d .whl ml_collections==1.1.0     # once, here
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
      && PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 \
         python3 benchmarks/gpu_check.py --out=$OUT --budget-s=420

with a time limit of about 8 minutes for the command, which leaves room for one re-run
in 15 minutes of device time.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN_FILE = os.path.join(REPO, "benchmarks", "gpu_check_plan.json")
RESULT_PREFIX = "GPU_CHECK_RESULT "
TIMED_STEPS = 20
WARMUP_STEPS = 3
CORRECTNESS_STEPS = 3
F32_RTOL = 1e-4  # GPU vs CPU, f32 matrix products on both
TF32_RTOL = 2e-2  # GPU at its default precision (TF32 products) vs CPU
BF16_RTOL = 3e-2  # cuDNN vs XLA attention, bf16 compute
NUM_CLASSES = 1000
TIMM_MODEL = "vit_base_patch16_224"
VERSIONS = (
  "jax",
  "jaxlib",
  "jax-cuda13-plugin",
  "flax",
  "optax",
  "orbax-checkpoint",
  "torch",
  "timm",
)


@dataclasses.dataclass(frozen=True)
class Speed:
  """One timed row: the model, its global batch and the attention implementation."""

  mode: str  # 'train' or 'infer'
  model: str
  batch: int
  attention: str  # `vit_jax.models.execution.ATTENTION_IMPLS`: 'einsum', 'xla', 'cudnn'

  @property
  def name(self) -> str:
    return f"{self.mode}/{self.model}/{self.batch}/{self.attention}"


# The rows in the order they run (the most telling first, should the budget run out).
SPEEDS = (
  Speed("train", "ViT-B_16", 256, "einsum"),
  Speed("train", "ViT-B_16", 256, "cudnn"),
  Speed("train", "ViT-S_16", 512, "einsum"),
  Speed("train", "ViT-L_16", 128, "cudnn"),
  Speed("infer", "ViT-B_16", 512, "cudnn"),
  Speed("train", "ViT-B_16", 256, "xla"),
)
PROFILED = SPEEDS[1]  # the `profile` row: this step again, under `jax.profiler`
PROFILE_STEPS = 5
ROWS = (
  "correctness",
  *(s.name for s in SPEEDS[:2]),
  "timm",
  *(s.name for s in SPEEDS[2:]),
  "profile",
)
RESOLUTION = 224
# --smoke: every row on the CPU with a 2-layer, 32-wide model at 32x32.
SMOKE = dict(resolution=32, batch=4, steps=2, warmup=1)


def smoke_model(config: Any) -> Any:
  """A tiny ViT of the same family: 2 layers, width 32, 2 heads, patches 16."""
  config.hidden_size = 32
  config.transformer.num_layers = 2
  config.transformer.num_heads = 2
  config.transformer.mlp_dim = 64
  return config


def get_config(arg: str = "ViT-B_16,256,cudnn") -> Any:
  """The run config of a train row, "model,batch,attention": AdamW, bf16, no dropout.

  Also a config file for the plan: ``python -m vit_jax.plan --topology=h100x1
  --config=benchmarks/gpu_check.py:ViT-B_16,256,cudnn``.
  """
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from speed_config import speed_config  # pylint: disable=g-import-not-at-top

  model, batch, attention = arg.split(",")
  config = speed_config(model, int(batch), RESOLUTION, dtype="bfloat16", attention=attention)
  config.optim.name = "adamw"
  config.optim.weight_decay = 0.05
  return config


# ---------------------------------------------------------------------------------------
# Rows (each runs in a child process: `--child=<row>`).


def _device_info() -> dict[str, Any]:
  import jax  # pylint: disable=g-import-not-at-top

  device = jax.devices()[0]
  return dict(platform=device.platform, device_kind=device.device_kind, count=jax.device_count())


def _rel(a: Any, b: Any) -> float:
  """||a - b|| / ||b|| over a whole tree (float64 on the host)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  la = [np.asarray(x, np.float64) for x in jax.tree.leaves(jax.device_get(a))]
  lb = [np.asarray(x, np.float64) for x in jax.tree.leaves(jax.device_get(b))]
  diff = sum(float(np.sum((x - y) ** 2)) for x, y in zip(la, lb))
  norm = sum(float(np.sum(y**2)) for y in lb)
  return (diff / max(norm, 1e-30)) ** 0.5


def _synthetic_batch(rng: Any, batch: int, resolution: int, num_classes: int) -> dict[str, Any]:
  import numpy as np  # pylint: disable=g-import-not-at-top

  images = rng.uniform(-1, 1, (batch, resolution, resolution, 3)).astype(np.float32)
  labels = np.eye(num_classes, dtype=np.float32)[rng.integers(0, num_classes, batch)]
  return {"image": images, "label": labels}


def row_correctness(smoke: bool) -> dict[str, Any]:
  """GPU vs CPU train steps in f32; cuDNN vs XLA attention in bf16."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from vit_jax import run, sharding  # pylint: disable=g-import-not-at-top

  accel = jax.devices()
  cpu = jax.devices("cpu")
  result: dict[str, Any] = dict(device=_device_info())
  resolution, batch, classes = 32, 8, 10
  config = get_config(f"ViT-Ti_16,{batch},einsum")
  config.model.dtype = "float32"
  config.pp.crop = resolution
  config.num_classes = classes
  config.lr.warmup_steps = 0  # full-size updates from the first step: differences show
  config.lr.base = 1e-3
  if smoke:
    smoke_model(config.model)
  meshes = {
    "accel": sharding.make_mesh(tuple(config.mesh), accel[:1]),
    "cpu": sharding.make_mesh(tuple(config.mesh), cpu[:1]),
  }
  steps = {k: run.build(config, mesh=m, open_data=False) for k, m in meshes.items()}
  init = steps["cpu"].init_state()
  host_state = jax.device_get(init)
  rng = np.random.default_rng(0)
  batches = [_synthetic_batch(rng, batch, resolution, classes) for _ in range(CORRECTNESS_STEPS)]

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
    param = _rel(params, ref_params)
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
  XLA's `dot_product_attention` against the model's einsum attention."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from vit_jax.models import create_model, get_model_config  # pylint: disable=g-import-not-at-top

  on_gpu = jax.devices()[0].platform == "gpu"
  test, reference = ("cudnn", "xla") if on_gpu else ("xla", "einsum")
  resolution = 224 if not smoke else SMOKE["resolution"]
  rng = np.random.default_rng(1)
  images = jnp.asarray(rng.uniform(-1, 1, (16, resolution, resolution, 3)), jnp.float32)
  weights = jnp.asarray(rng.standard_normal((16, NUM_CLASSES)), jnp.float32)
  outputs = {}
  params = None
  for impl in (reference, test):
    config = get_model_config("ViT-S_16")
    if smoke:
      smoke_model(config)
    config.dtype = "bfloat16"
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
  logits_rel = _rel(outputs[test][0], outputs[reference][0])
  grads_rel = _rel(outputs[test][1], outputs[reference][1])
  return dict(
    test=test,
    reference=reference,
    dtype="bfloat16",
    rtol=BF16_RTOL,
    logits_rel=logits_rel,
    grads_rel=grads_rel,
    ok=bool(max(logits_rel, grads_rel) <= BF16_RTOL),
  )


def _time(fn: Callable[[], Any], steps: int, warmup: int) -> list[float]:
  import jax  # pylint: disable=g-import-not-at-top

  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return times


def row_speed(speed: Speed, smoke: bool, profile: bool = False) -> dict[str, Any]:
  """Our train step or forward pass for ``speed``: img/s, MFU, memory, compile time; with
  ``profile``, where the device's time goes over `PROFILE_STEPS` more steps."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from vit_jax import run  # pylint: disable=g-import-not-at-top
  from vit_jax.run import step_cost  # pylint: disable=g-import-not-at-top

  attention = speed.attention
  if smoke and attention == "cudnn":
    attention = "xla"  # the CPU has no cuDNN: the same code path up to the kernel
  batch = SMOKE["batch"] if smoke else speed.batch
  config = get_config(f"{speed.model},{batch},{attention}")
  resolution = SMOKE["resolution"] if smoke else RESOLUTION
  config.pp.crop = resolution
  if smoke:
    smoke_model(config.model)
  steps_n, warmup = (SMOKE["steps"], SMOKE["warmup"]) if smoke else (TIMED_STEPS, WARMUP_STEPS)
  trainer = run.build(config, open_data=False)
  state = trainer.init_state()
  host = _synthetic_batch(np.random.default_rng(0), batch, resolution, NUM_CLASSES)
  device_batch = jax.device_put(host, trainer.batch_sharding)
  start = time.perf_counter()
  if speed.mode == "train":
    compiled = trainer.compile_train_step()
    holder = {"state": state}

    def step():
      holder["state"], metrics = compiled(holder["state"], device_batch)
      return metrics
  else:
    model = trainer.objective.model
    forward = jax.jit(lambda p, x: model.apply({"params": p}, x, train=False))
    compiled = forward.lower(state.params, device_batch["image"]).compile()

    def step():
      return compiled(state.params, device_batch["image"])

  compile_s = time.perf_counter() - start
  times = _time(step, steps_n, warmup)
  median = sorted(times)[len(times) // 2]
  flops_xla, _ = step_cost.step_flops(compiled, jax.device_count(), analytic=None)
  analytic = step_cost.vit_flops_per_image(
    config.model, resolution, NUM_CLASSES, train=speed.mode == "train"
  )
  device = jax.devices()[0]
  peak = step_cost.peak_flops(device, "bfloat16")
  img_s = batch / median
  stats = device.memory_stats() or {}
  final_loss = None
  if speed.mode == "train":
    final_loss = float(step()["train/loss"])
  summary = profile_steps(step, PROFILE_STEPS) if profile else None
  return dict(
    profile=summary,
    device=_device_info(),
    img_s=img_s,
    step_ms_median=1e3 * median,
    step_ms_min=1e3 * min(times),
    step_ms_max=1e3 * max(times),
    gflop_per_img_analytic=analytic / 1e9,
    gflop_per_img_xla=flops_xla / batch / 1e9 if flops_xla else None,
    tflop_s=analytic * img_s / 1e12,
    mfu=analytic * img_s / peak if peak else None,
    peak_tflop_s=peak / 1e12 if peak else None,
    compile_s=compile_s,
    peak_bytes_in_use=stats.get("peak_bytes_in_use"),
    bytes_limit=stats.get("bytes_limit"),
    compiled_peak_bytes=step_cost.peak_bytes(compiled),
    final_loss=final_loss,
    ok=final_loss is None or bool(np.isfinite(final_loss)),
  )


def row_timm(smoke: bool) -> dict[str, Any]:
  """timm's ViT-B/16 train step (bf16 autocast, fused AdamW, torch.compile) and inference."""
  import timm  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  cuda = torch.cuda.is_available() and not smoke
  device = torch.device("cuda" if cuda else "cpu")
  kwargs = dict(num_classes=NUM_CLASSES)
  resolution = SMOKE["resolution"] if smoke else RESOLUTION
  if smoke:
    kwargs.update(img_size=resolution, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)
  steps_n, warmup = (SMOKE["steps"], SMOKE["warmup"]) if smoke else (TIMED_STEPS, WARMUP_STEPS)
  results: dict[str, Any] = dict(
    device=torch.cuda.get_device_name() if cuda else "cpu",
    torch=torch.__version__,
    timm=timm.__version__,
    compile_backend="inductor" if cuda else "eager",  # inductor's CPU code needs a compiler
  )

  def sync():
    if cuda:
      torch.cuda.synchronize()

  def timed(fn: Callable[[], Any]) -> tuple[float, list[float]]:
    start = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - start  # the compile
    for _ in range(warmup):
      fn()
    sync()
    times = []
    for _ in range(steps_n):
      start = time.perf_counter()
      fn()
      sync()
      times.append(time.perf_counter() - start)
    return first, times

  for mode, batch in (("train", 256), ("infer", 512)):
    batch = SMOKE["batch"] if smoke else batch
    torch.manual_seed(0)
    net = timm.create_model(TIMM_MODEL, pretrained=False, **kwargs).to(device)
    images = torch.rand(batch, 3, resolution, resolution, device=device) * 2 - 1
    labels = torch.randint(0, NUM_CLASSES, (batch,), device=device)
    compiled = torch.compile(net, backend=results["compile_backend"])
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    if mode == "train":
      net.train()
      opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.05, fused=cuda)

      def step(compiled=compiled, opt=opt, images=images, labels=labels, autocast=autocast):
        opt.zero_grad(set_to_none=True)
        with autocast:
          loss = torch.nn.functional.cross_entropy(compiled(images), labels)
        loss.backward()
        opt.step()
    else:
      net.eval()

      def step(compiled=compiled, images=images, autocast=autocast):
        with torch.inference_mode(), autocast:
          compiled(images)

    if cuda:
      torch.cuda.reset_peak_memory_stats()
    compile_s, times = timed(step)
    median = sorted(times)[len(times) // 2]
    results[mode] = dict(
      batch=batch,
      img_s=batch / median,
      step_ms_median=1e3 * median,
      compile_s=compile_s,
      peak_bytes=torch.cuda.max_memory_allocated() if cuda else None,
    )
    del net, compiled
  results["ok"] = True
  return results


# Kernel families by name (lower case), first match wins: cuBLAS / CUTLASS / Triton matrix
# products, cuDNN's fused attention, XLA's own fused elementwise and reduction kernels.
KERNEL_KINDS = (
  ("attention (cuDNN)", ("fmha", "flash", "sdpa", "attention")),
  ("convolution", ("convolution", "fprop", "dgrad", "wgrad")),
  ("matmul", ("gemm", "xmma", "cutlass", "cublas", "matmul", "dot", "wgmma")),
  ("copy / memset", ("memcpy", "memset", "copy")),
  ("XLA fusion", ("fusion", "reduce", "loop", "input", "triton", "transpose", "broadcast")),
)


def _kernel_kind(name: str) -> str:
  lower = name.lower()
  return next((kind for kind, keys in KERNEL_KINDS if any(k in lower for k in keys)), "other")


def summarise_trace(events: list[dict[str, Any]], steps: int) -> dict[str, Any]:
  """Device time per step by kernel kind, the top kernels, and the share of the traced span
  in which the device ran nothing (launch gaps, host work). Device events are those of a
  ``/device:...`` process (a GPU's streams); without one (a CPU), XLA's op threads."""
  names = {}
  for e in events:
    if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name"):
      names[(e.get("pid"), e.get("tid") if e["name"] == "thread_name" else None)] = e["args"][
        "name"
      ]
  device_pids = {pid for (pid, tid), n in names.items() if tid is None and n.startswith("/device:")}
  if device_pids:
    on_device = lambda e: e.get("pid") in device_pids  # noqa: E731
  else:
    op_threads = {key for key, n in names.items() if key[1] is not None and n.startswith("tf_XLA")}
    on_device = lambda e: (e.get("pid"), e.get("tid")) in op_threads  # noqa: E731
  kernels = [
    e
    for e in events
    if e.get("ph") == "X" and on_device(e) and e.get("dur") and "Thunk" not in e["name"]
  ]  # a CPU's ThunkExecutor events wrap its kernels
  if not kernels:
    return dict(error="no device events in the trace")
  # Streams can overlap: busy time is the union of the kernels' intervals.
  spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in kernels)
  busy, end = 0.0, spans[0][0]
  for a, b in spans:
    busy += max(0.0, b - max(a, end))
    end = max(end, b)
  total = spans[-1][1] - spans[0][0]
  kinds: dict[str, float] = {}
  by_name: dict[str, list[float]] = {}
  for e in kernels:
    kinds[_kernel_kind(e["name"])] = kinds.get(_kernel_kind(e["name"]), 0.0) + float(e["dur"])
    by_name.setdefault(e["name"], []).append(float(e["dur"]))
  per_step = lambda us: us / 1e3 / steps  # noqa: E731  (microseconds -> ms per step)
  top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:12]
  return dict(
    span_ms=per_step(total),
    busy_ms=per_step(busy),
    idle_fraction=1.0 - busy / total if total else None,
    kernels_per_step=len(kernels) / steps,
    kinds_ms={k: per_step(v) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
    top=[dict(name=n[:90], kind=_kernel_kind(n), ms=per_step(sum(d)), calls=len(d) / steps)
         for n, d in top],
  )  # fmt: skip


def profile_steps(step: Callable[[], Any], steps: int) -> dict[str, Any]:
  """``steps`` blocked steps under `jax.profiler.trace` (a Perfetto JSON trace in a
  temporary folder), summarised by `summarise_trace`."""
  import glob  # pylint: disable=g-import-not-at-top
  import gzip  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top

  with tempfile.TemporaryDirectory() as folder:
    with jax.profiler.trace(folder, create_perfetto_trace=True):
      for _ in range(steps):
        jax.block_until_ready(step())
    found = glob.glob(os.path.join(folder, "**", "perfetto_trace.json.gz"), recursive=True)
    if not found:
      return dict(error="jax.profiler wrote no perfetto_trace.json.gz")
    with gzip.open(found[0]) as f:
      trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  return summarise_trace(events, steps)


def run_child(row: str, smoke: bool) -> dict[str, Any]:
  if row == "correctness":
    return row_correctness(smoke)
  if row == "profile":
    return row_speed(PROFILED, smoke, profile=True)
  if row == "timm":
    return row_timm(smoke)
  for speed in SPEEDS:
    if speed.name == row:
      return row_speed(speed, smoke)
  raise SystemExit(f"--child={row!r} is not a row; rows: {', '.join(ROWS)}")


# ---------------------------------------------------------------------------------------
# The parent: versions, the rows in children, the files.


def versions() -> dict[str, Any]:
  found: dict[str, Any] = {"python": sys.version.split()[0]}
  for name in VERSIONS:
    try:
      found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      found[name] = None
  try:
    smi = subprocess.run(
      ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
      capture_output=True,
      text=True,
      timeout=30,
    )
    found["nvidia_smi"] = smi.stdout.strip() or None
  except (OSError, subprocess.TimeoutExpired):
    found["nvidia_smi"] = None
  return found


def import_problem() -> Optional[str]:
  """The last line of the error when the package does not import here (another jax, a
  missing package), else None: one clear line before any row is tried."""
  proc = subprocess.run(
    [sys.executable, "-c", "import vit_jax.run, vit_jax.models, configs.common"],
    capture_output=True,
    text=True,
    cwd=REPO,
    check=False,
  )
  if proc.returncode == 0:
    return None
  lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
  return lines[-1] if lines else f"exit {proc.returncode}"


def load_plan() -> dict[str, Any]:
  """The plan's predictions by device kind and row (`--make-plan`); {} when absent."""
  if not os.path.exists(PLAN_FILE):
    return {}
  with open(PLAN_FILE) as f:
    return json.load(f)


def make_plan() -> None:
  """Compiles each train row for one H100 and one H200 (JAX's CUDA plugin, no GPU needed)
  and stores the plan's per-device memory in `PLAN_FILE`."""
  found: dict[str, Any] = {}
  for topology in ("h100x1", "h200x1"):
    for speed in SPEEDS:
      if speed.mode != "train":
        continue
      arg = f"{speed.model},{speed.batch},{speed.attention}"
      proc = subprocess.run(
        [sys.executable, "-m", "vit_jax.plan", f"--config={__file__}:{arg}",
         f"--topology={topology}", "--json"],
        capture_output=True, text=True, cwd=REPO, check=False,
      )  # fmt: skip
      if proc.returncode not in (0, 2):
        raise SystemExit(f"vit_jax.plan failed for {arg} on {topology}:\n{proc.stderr[-2000:]}")
      plan = json.loads(proc.stdout)
      found.setdefault(topology, {})[speed.name] = dict(
        needed_bytes=plan["train"]["needed_bytes"],
        memory=plan["train"]["memory"],
        bound_s=plan["time"]["bound_s"],
        fits=plan["fits"],
      )
      print(topology, speed.name, "ok", flush=True)
  with open(PLAN_FILE, "w") as f:
    json.dump(found, f, indent=1, sort_keys=True)
  print(f"wrote {PLAN_FILE}")


def run_rows(rows: list[str], smoke: bool, budget_s: float, log: Any) -> dict[str, Any]:
  """Each row in a child process, in order, while the budget lasts."""
  start = time.perf_counter()
  results: dict[str, Any] = {}
  for row in rows:
    left = budget_s - (time.perf_counter() - start)
    if left < 20:
      results[row] = dict(ok=False, error=f"not run: the budget of {budget_s:.0f} s was spent")
      continue
    cmd = [sys.executable, os.path.abspath(__file__), f"--child={row}"] + (
      ["--smoke"] if smoke else []
    )
    began = time.perf_counter()
    try:
      proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=left, cwd=REPO, check=False
      )
      output, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
      output = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
      code = "timeout"
    wall = time.perf_counter() - began
    log.write(f"===== {row} (exit {code}, {wall:.1f} s)\n{output}\n")
    log.flush()
    lines = [line for line in output.splitlines() if line.startswith(RESULT_PREFIX)]
    if lines:
      results[row] = json.loads(lines[-1][len(RESULT_PREFIX) :])
    else:
      tail = [line for line in output.strip().splitlines() if line.strip()][-3:]
      results[row] = dict(ok=False, error=f"exit {code}: " + " | ".join(tail)[-600:])
    results[row]["wall_s"] = wall
    print(f"{row}: {'ok' if results[row].get('ok') else 'FAILED'} ({wall:.0f} s)", flush=True)
  return results


def _f(value: Optional[float], spec: str, scale: float = 1.0) -> str:
  return "-" if value is None else format(value * scale, spec)


def table(report: dict[str, Any]) -> str:
  """The markdown report: versions, the checks, the speed rows with timm's ratios."""
  v, results = report["versions"], report["results"]
  kind = next(
    (
      r["device"]["device_kind"]
      for r in results.values()
      if "device" in r and isinstance(r["device"], dict)
    ),
    "?",
  )
  lines = [
    f"Device: {kind}; nvidia-smi: {v.get('nvidia_smi') or '-'}",
    "Versions: " + ", ".join(f"{k} {v[k]}" for k in ("python", *VERSIONS) if v.get(k)),
    f"Mode: {'smoke (CPU, tiny models)' if report['smoke'] else 'full'}; "
    f"{TIMED_STEPS if not report['smoke'] else SMOKE['steps']} timed steps per row (median)",
    "",
  ]
  correct = results.get("correctness", {})
  if "train_step_vs_cpu" in correct:
    lines.append("| check | tolerance | loss | grad norm | params after 3 steps | ok |")
    lines.append("|---|---|---|---|---|---|")
    for label in ("f32", "default"):
      c = correct["train_step_vs_cpu"][label]
      lines.append(
        f"| train step, accelerator vs CPU, {label} matmuls | {c['rtol']:.0e} | "
        f"{c['loss_rel']:.2e} | {c['grad_norm_rel']:.2e} | {c['params_rel']:.2e} | {c['ok']} |"
      )
    a = correct["attention"]
    lines.append(
      f"| {a['test']} vs {a['reference']} attention, bf16 (logits / grads) | {a['rtol']:.0e} | "
      f"{a['logits_rel']:.2e} | {a['grads_rel']:.2e} | - | {a['ok']} |"
    )
    lines.append("")
  elif correct:
    lines += [f"correctness: {correct.get('error')}", ""]
  timm = results.get("timm", {})
  plan = report.get("plan", {})
  topology = {"h100": "h100x1", "h200": "h200x1"}
  plan_rows = next((plan.get(t, {}) for k, t in topology.items() if k in kind.lower()), {})
  lines.append(
    "| row | img/s | step ms | MFU (bf16 peak) | GFLOP/img | peak mem GiB | plan GiB | "
    "compile s | timm img/s | ours / timm |"
  )
  lines.append("|---|---|---|---|---|---|---|---|---|---|")
  for speed in SPEEDS:
    r = results.get(speed.name)
    if r is None:
      continue
    if "img_s" not in r:
      lines.append(f"| {speed.name} | {r.get('error', 'failed')} |" + " |" * 8)
      continue
    theirs = timm.get(speed.mode, {}) if speed.model == "ViT-B_16" else {}
    planned = plan_rows.get(speed.name, {})
    planned_bytes = planned.get("needed_bytes")
    ratio = r["img_s"] / theirs["img_s"] if theirs.get("img_s") else None
    lines.append(
      f"| {speed.name} | {r['img_s']:.0f} | {r['step_ms_median']:.1f} | "
      f"{_f(r['mfu'], '.1%')} | {r['gflop_per_img_analytic']:.1f} | "
      f"{_f(r['peak_bytes_in_use'], '.2f', 2**-30)} | {_f(planned_bytes, '.2f', 2**-30)} | "
      f"{r['compile_s']:.0f} | {_f(theirs.get('img_s'), '.0f')} | {_f(ratio, '.2f')} |"
    )
  if timm:
    if "error" in timm:
      lines.append(f"\ntimm: {timm['error']}")
    else:
      lines.append(
        f"\ntimm {timm['timm']} / torch {timm['torch']} ({TIMM_MODEL}, torch.compile "
        f"{timm['compile_backend']}): train {_f(timm['train']['img_s'], '.0f')} img/s at batch "
        f"{timm['train']['batch']} (peak {_f(timm['train']['peak_bytes'], '.2f', 2**-30)} GiB), "
        f"inference {_f(timm['infer']['img_s'], '.0f')} img/s at batch {timm['infer']['batch']}."
      )
  summary = results.get("profile", {}).get("profile")
  if summary and "kinds_ms" in summary:
    lines.append(
      f"\nProfile of {PROFILED.name} ({PROFILE_STEPS} steps): per step {summary['span_ms']:.1f} ms "
      f"traced, the device busy {summary['busy_ms']:.1f} ms ({summary['idle_fraction']:.0%} idle), "
      f"{summary['kernels_per_step']:.0f} kernels."
    )
    lines.append("\n| kernel kind | ms per step |\n|---|---|")
    lines += [f"| {kind} | {ms:.2f} |" for kind, ms in summary["kinds_ms"].items()]
    lines.append("\n| top kernel | kind | ms per step | calls per step |\n|---|---|---|---|")
    lines += [
      f"| `{t['name']}` | {t['kind']} | {t['ms']:.2f} | {t['calls']:.0f} |" for t in summary["top"]
    ]
  failed = [k for k, r in results.items() if not r.get("ok")]
  lines.append("\nFailed rows: " + (", ".join(failed) if failed else "none"))
  return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", help="folder for gpu_check.json, .md and .log")
  parser.add_argument("--smoke", action="store_true", help="every row on the CPU, tiny models")
  parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting rows after")
  parser.add_argument("--only", default="", help="comma-separated rows (default: all)")
  parser.add_argument("--child", help=argparse.SUPPRESS)
  parser.add_argument("--make-plan", action="store_true", help=f"write {PLAN_FILE} (CPU)")
  args = parser.parse_args(argv)
  if args.smoke:
    os.environ["JAX_PLATFORMS"] = "cpu"
  if args.child:
    print(RESULT_PREFIX + json.dumps(run_child(args.child, args.smoke)), flush=True)
    return 0
  if args.make_plan:
    make_plan()
    return 0
  if not args.out:
    parser.error("--out=DIR is required")
  rows = [r for r in args.only.split(",") if r] or list(ROWS)
  unknown = [r for r in rows if r not in ROWS]
  if unknown:
    parser.error(f"--only: {', '.join(unknown)} not among the rows: {', '.join(ROWS)}")
  os.makedirs(args.out, exist_ok=True)
  report: dict[str, Any] = dict(smoke=args.smoke, versions=versions(), plan=load_plan())
  print(json.dumps(report["versions"]), flush=True)
  problem = import_problem()
  if problem:
    v = report["versions"]
    print(f"Error: vit_jax does not import with jax {v['jax']}, flax {v['flax']}: {problem}")
    return 2
  with open(os.path.join(args.out, "gpu_check.log"), "w") as log:
    report["results"] = run_rows(rows, args.smoke, args.budget_s, log)
  with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
    json.dump(report, f, indent=1)
  text = table(report)
  with open(os.path.join(args.out, "gpu_check.md"), "w") as f:
    f.write(text)
  print(text)
  return 0 if all(r.get("ok") for r in report["results"].values()) else 1


if __name__ == "__main__":
  sys.exit(main())
