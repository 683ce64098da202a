"""Where a step's device time goes: ``jax.profiler``'s trace of a few steps summarised as
device time per kernel kind, the idle share of the traced span and the top kernels."""

from __future__ import annotations

import json
import os
from typing import Any, Callable

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
