r"""Model throughput and MFU of the real train step and of inference, as a table.

    python benchmarks/throughput.py --models=ViT-S_16,ViT-B_16 --batch=16 \
        --dtype=float32,bfloat16 --mode=train,infer [--scan=false,true] [--compare=timm]

One row per combination: device kind and count, model, resolution, global batch, compute
dtype, attention implementation, scan/remat, img/s (median of ``--steps`` timed steps after
``--warmup``, each blocked on), GFLOPs per image from XLA's cost analysis of the compiled
step with the analytic count beside it, GB of memory traffic per image (XLA's count),
achieved TFLOP/s, MFU against the device's dense peak (`vit_jax.run.step_cost`), compile time
and the compiled step's peak device memory.

Train rows time the run's train step (`vit_jax.run.build`) (SGD with momentum, softmax
cross-entropy, the config's sharding); infer rows time the model's forward pass. Rows run
interleaved for ``--rounds`` rounds and each keeps its best round, so that load from other
processes on a shared machine hurts every row alike. ``--compare=timm`` adds timm's model
(PyTorch, f32 or bf16 autocast) on the same batch in the same run, and each framework's
f32 2048x2048 matmul (the ceiling of its matrix products on this machine); every round's
figures follow the table with the load average at the round's start and the jax / timm
ratio of each round.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from typing import Any, Callable, Optional

# PyTorch must load before TensorFlow (which the package imports): importing timm after it
# crashes the process (a segfault in triton's import with the CUDA wheels of torch).
if any(arg.startswith("--compare") and "timm" in arg for arg in sys.argv):
  import timm  # noqa: F401
  import torch  # noqa: F401

import jax
import numpy as np
from speed_config import NUM_CLASSES, speed_config  # noqa: E402  (this folder)

from vit_jax import run  # noqa: E402
from vit_jax.infra import sharding  # noqa: E402
from vit_jax.models import execution  # noqa: E402
from vit_jax.run import step_cost  # noqa: E402

TIMM_NAMES = {
  "ViT-Ti_16": "vit_tiny_patch16",
  "ViT-S_16": "vit_small_patch16",
  "ViT-B_16": "vit_base_patch16",
  "ViT-B_32": "vit_base_patch32",
  "ViT-L_16": "vit_large_patch16",
  "ViT-H_14": "vit_huge_patch14",
}


@dataclasses.dataclass
class Row:
  """One benchmarked combination; ``run`` does one blocked step and returns its seconds."""

  framework: str
  model: str
  mode: str
  resolution: int
  batch: int
  dtype: str
  attention: str
  scan_remat: str
  run: Callable[[], float]
  flops_xla: Optional[float] = None  # per image
  flops_analytic: Optional[float] = None  # per image
  bytes_xla: Optional[float] = None  # per image
  compile_s: Optional[float] = None
  peak_bytes: Optional[int] = None
  best_img_s: float = 0.0
  rounds: list[float] = dataclasses.field(default_factory=list)  # img/s of each round


def _bool_list(text: str) -> list[bool]:
  return [v.strip().lower() in ("1", "true", "yes") for v in text.split(",")]


def _timed(fn: Callable[[], Any]) -> Callable[[], float]:
  def run() -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start

  return run


def jax_row(
  model: str,
  mode: str,
  batch: int,
  resolution: int,
  dtype: str,
  attention: Optional[str],
  scan: bool,
  remat: bool,
) -> Row:
  """Compiles the project's train step or forward pass for one combination."""
  config = speed_config(
    model, batch, resolution, dtype=dtype, attention=attention, scan=scan, remat=remat
  )
  config.num_classes = NUM_CLASSES
  trainer = run.build(config, open_data=False)
  state = trainer.init_state()
  batch_sharding = sharding.batch_sharding(trainer.mesh)
  rng = np.random.default_rng(0)
  images = jax.device_put(
    rng.uniform(-1, 1, (batch, resolution, resolution, 3)).astype(np.float32), batch_sharding
  )
  labels = jax.device_put(
    np.eye(NUM_CLASSES, dtype=np.float32)[rng.integers(0, NUM_CLASSES, batch)], batch_sharding
  )
  start = time.perf_counter()
  if mode == "train":
    compiled = trainer.compile_train_step()
    holder = {"state": state}

    def step():
      holder["state"], metrics = compiled(holder["state"], {"image": images, "label": labels})
      return metrics
  else:
    forward = jax.jit(lambda p, x: trainer.objective.model.apply({"params": p}, x, train=False))
    compiled = forward.lower(state.params, images).compile()

    def step():
      return compiled(state.params, images)

  compile_s = time.perf_counter() - start
  flops, _ = step_cost.step_flops(compiled, jax.device_count(), analytic=None)
  analytic = step_cost.vit_flops_per_image(
    config.model, resolution, NUM_CLASSES, train=mode == "train"
  )
  return Row(
    "jax",
    model,
    mode,
    resolution,
    batch,
    dtype,
    attention or execution.EINSUM,
    f"{'scan' if scan else '-'}/{'remat' if remat else '-'}",
    _timed(step),
    flops_xla=flops / batch if flops else None,
    flops_analytic=analytic,
    bytes_xla=step_cost.compiled_bytes_accessed(compiled) / batch or None,
    compile_s=compile_s,
    peak_bytes=step_cost.peak_bytes(compiled),
  )


def timm_row(model: str, mode: str, batch: int, resolution: int, dtype: str) -> Row:
  """timm's ViT of the same size on the same batch: SGD step or forward pass (PyTorch)."""
  import timm  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(os.cpu_count() or 1)
  net = timm.create_model(
    f"{TIMM_NAMES[model]}_{resolution}",
    pretrained=False,
    num_classes=NUM_CLASSES,
    img_size=resolution,
  )
  rng = np.random.default_rng(0)
  images = torch.from_numpy(
    rng.uniform(-1, 1, (batch, 3, resolution, resolution)).astype(np.float32)
  )
  labels = torch.from_numpy(rng.integers(0, NUM_CLASSES, batch))
  autocast = lambda: torch.autocast("cpu", torch.bfloat16, enabled=dtype == "bfloat16")
  if mode == "train":
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    def step():
      opt.zero_grad(set_to_none=True)
      with autocast():
        loss = torch.nn.functional.cross_entropy(net(images), labels)
      loss.backward()
      opt.step()
  else:
    net.eval()

    def step():
      with torch.inference_mode(), autocast():
        net(images)

  def run() -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start

  return Row("timm", model, mode, resolution, batch, dtype, "torch", "-/-", run)


def matmul_row(framework: str, size: int = step_cost.CPU_MATMUL_SIZE) -> Row:
  """An f32 [size, size] x [size, size] product, the ceiling of each framework's matrix
  products on this machine (``batch`` = its FLOPs, so "img/s" reads as FLOP/s)."""
  rng = np.random.default_rng(0)
  a = rng.standard_normal((size, size), dtype=np.float32)
  if framework == "jax":
    x = jax.device_put(a)
    product = jax.jit(lambda x: x @ x)
    fn = _timed(lambda: product(x))
  else:
    import torch  # pylint: disable=g-import-not-at-top

    x = torch.from_numpy(a)
    fn = _timed(lambda: x @ x)
  return Row(framework, f"matmul {size}", "matmul", 0, 2 * size**3, "float32", "-", "-/-", fn)


def measure(rows: list[Row], steps: int, warmup: int, rounds: int) -> list[float]:
  """Interleaved rounds; each row keeps every round's median img/s and the best one.
  Returns the 1-minute load average at the start of each round."""
  for row in rows:
    for _ in range(warmup):
      row.run()
  loads = []
  for _ in range(rounds):
    loads.append(os.getloadavg()[0])
    for row in rows:
      median = statistics.median(row.run() for _ in range(steps))
      row.rounds.append(row.batch / median)
      row.best_img_s = max(row.best_img_s, row.batch / median)
  return loads


def print_rounds(rows: list[Row], loads: list[float]) -> None:
  """Each round's figures with the load it ran at, and timm's ratio to the jax row."""
  print("\nPer round (img/s; matmul rows: GFLOP/s), load average at the round's start:")
  for i, load in enumerate(loads):
    cells = []
    for row in rows:
      value = row.rounds[i] / (1e9 if row.mode == "matmul" else 1)
      cells.append(f"{row.framework} {row.model} {row.mode} {value:.4g}")
    print(f"round {i} (load {load:.2f}): " + "; ".join(cells))
  for row in rows:
    if row.framework != "timm":
      continue
    ours = next(
      r
      for r in rows
      if (r.framework, r.model, r.mode, r.dtype) == ("jax", row.model, row.mode, row.dtype)
    )
    ratios = ", ".join(f"{a / b:.2f}" for a, b in zip(ours.rounds, row.rounds))
    print(f"jax / timm {row.model} {row.mode} {row.dtype}, per round: {ratios}")


def _fmt(value: Optional[float], spec: str) -> str:
  return "-" if value is None else format(value, spec)


def print_table(rows: list[Row], device: Any, num_devices: int) -> None:
  peaks = {row.dtype: step_cost.peak_flops(device, row.dtype) for row in rows}
  print(
    f"\nDevice: {num_devices} x {device.device_kind} ({device.platform}); peak TFLOP/s: "
    + ", ".join(f"{k} {_fmt(v and v / 1e12, '.3g')}" for k, v in peaks.items())
  )
  header = (
    "framework",
    "device",
    "model",
    "mode",
    "res",
    "batch",
    "dtype",
    "attention",
    "scan/remat",
    "img/s",
    "GFLOP/img xla",
    "GFLOP/img analytic",
    "GB/img xla",
    "TFLOP/s",
    "MFU",
    "compile s",
    "peak mem GiB",
  )
  print("| " + " | ".join(header) + " |")
  print("|" + "---|" * len(header))
  first = {}
  for row in rows:
    if row.mode == "matmul":
      continue  # in the per-round lines
    flops = row.flops_xla or row.flops_analytic
    tflops = flops * row.best_img_s / 1e12 if flops else None
    peak = peaks[row.dtype]
    mfu = tflops * 1e12 / (peak * num_devices) if tflops and peak else None
    key = (row.model, row.mode, row.dtype)
    first.setdefault(key, row.best_img_s)
    cells = (
      row.framework,
      f"{num_devices}x {device.device_kind}",
      row.model,
      row.mode,
      str(row.resolution),
      str(row.batch),
      row.dtype,
      row.attention,
      row.scan_remat,
      f"{row.best_img_s:.2f}",
      _fmt(row.flops_xla and row.flops_xla / 1e9, ".4g"),
      _fmt(row.flops_analytic and row.flops_analytic / 1e9, ".4g"),
      _fmt(row.bytes_xla and row.bytes_xla / 1e9, ".4g"),
      _fmt(tflops, ".3g"),
      _fmt(mfu and 100 * mfu, ".1f") + ("%" if mfu else ""),
      _fmt(row.compile_s, ".1f"),
      _fmt(row.peak_bytes and row.peak_bytes / 2**30, ".3g"),
    )
    print("| " + " | ".join(cells) + " |")
  ratios = [
    (r, r.best_img_s / first[(r.model, r.mode, r.dtype)])
    for r in rows
    if r.mode != "matmul" and first[(r.model, r.mode, r.dtype)] != r.best_img_s
  ]
  for row, ratio in ratios:
    print(
      f"{row.framework} {row.model} {row.mode} {row.dtype} {row.attention} "
      f"{row.scan_remat}: {ratio:.2f}x the first row of its model/mode/dtype"
    )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="ViT-S_16")
  parser.add_argument("--batch", default="16", help="one per model, or one for all")
  parser.add_argument("--resolution", type=int, default=224)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--mode", default="train,infer")
  parser.add_argument(
    "--attention",
    default=execution.EINSUM,
    help="'einsum' (the model's default) or jax.nn.dot_product_attention's 'xla', 'cudnn'",
  )
  parser.add_argument("--scan", default="false")
  parser.add_argument("--remat", default="false")
  parser.add_argument("--steps", type=int, default=5, help="timed steps per round")
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--compare", default="", help="'timm': add timm's model")
  args = parser.parse_args()
  models = args.models.split(",")
  batches = [int(b) for b in args.batch.split(",")]
  batches = batches * len(models) if len(batches) == 1 else batches
  rows = []
  for model, batch in zip(models, batches):
    for mode in args.mode.split(","):
      for dtype in args.dtype.split(","):
        for attention in args.attention.split(","):
          for scan in _bool_list(args.scan):
            for remat in _bool_list(args.remat):
              rows.append(
                jax_row(
                  model,
                  mode,
                  batch,
                  args.resolution,
                  dtype,
                  attention,
                  scan,
                  remat,
                )
              )
        if args.compare == "timm":
          rows.append(timm_row(model, mode, batch, args.resolution, dtype))
  if args.compare == "timm":
    rows += [matmul_row("jax"), matmul_row("timm")]
  loads = measure(rows, args.steps, args.warmup, args.rounds)
  print_table(rows, jax.devices()[0], jax.device_count())
  print_rounds(rows, loads)


if __name__ == "__main__":
  main()
