"""A GPU train step's time estimated from its compiled program, beside the plan's bound.

The bound (`report.step_time`) puts every unit at its published peak with nothing
waiting; a GPU step measures about 2.7x it. The estimate counts the optimized HLO the
plan compiles (`counts`) and prices each part at what a GPU measured it doing
(`FITTED`), one after another as one stream runs them:

    step = product FLOPs / matrix rate + convolution FLOPs / its rate
         + attention FLOPs / cuDNN attention's rate + fusion bytes / fusion rate
         + kernels x gap per kernel + conditionals x host round trip

Products are the cuBLAS calls (their FLOPs from shapes and contracting dimensions, as
XLA:GPU's cost analysis leaves them out), convolutions and attention the cuDNN calls,
fusions every kernel XLA generates itself (its operands and results; an operand it only
slices at the slice's size, one it updates in place at the update's). Loop bodies count
trip-count times; a conditional (RandAugment's drawn op) counts at the mean of its
branches, plus a round trip to the host to read which branch runs.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Optional

from vit_jax.infra import hardware
from vit_jax.infra.hardware import Chip
from vit_jax.plan import hlo

_FREE = {
  "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
  "partition-id", "replica-id", "opt-barrier", "add-dependency",
}  # fmt: skip
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_OPERANDS = re.compile(r"\(([^()]*)\)")
_CONTRACTING = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')
_DIM_LABELS = re.compile(r"dim_labels=[^_]+_([^-]+)->")
_ATTENTION_SHAPE = re.compile(
  r'"intermediate_tensor_shape":\s*\{[^}]*?"dimensions":\s*\[([^\]]*)\]'
)
_BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
_CALLS = re.compile(r"\b(?:to_apply|calls)=(%[^\s,]+)")


@dataclasses.dataclass(frozen=True)
class Counts:
  """One device's step as the estimate prices it (loops multiplied out)."""

  product_flops: float  # cuBLAS matrix products
  convolution_flops: float  # cuDNN convolutions (the patch embedding)
  attention_flops: float  # cuDNN fused attention: 2 products forward, 5 backward
  fusion_bytes: float  # HBM bytes of the kernels XLA generates itself
  kernels: float  # launches: fusions, library calls, copies
  conditionals: float  # conditionals run (each reads its branch index on the host)


@dataclasses.dataclass(frozen=True)
class Rates:
  """What one GPU measured each part of a step doing."""

  product_flop_s: float
  convolution_flop_s: float
  attention_flop_s: float
  fusion_bytes_s: float
  kernel_s: float  # the device's idle gap per kernel launched
  conditional_s: float  # one conditional's host round trip
  source: str


# Fitted to the H200 checks in docs/gpu_check/ (jax 0.10.2; the plan's compile, Triton
# GEMMs off): all but the conditional from h200_2026-11-28.json's "profile" row (the
# default ViT-B/16 train step, batch 256; per step: cuBLAS ("other" + "matmul") 34.84 ms,
# "XLA fusion" + "copy / memset" 24.45 ms, cuDNN attention 8.06 ms, convolution 2.14 ms,
# idle 4.43 ms of a 73.74 ms span), each divided by the same step's counts from its
# compile for one H200 (25.70 TFLOP of products, 0.118 TFLOP of convolution, 1.295 TFLOP
# of attention, 70.52 GB of fusion traffic, 1,311 kernels); the conditional's host round
# trip from the same file's "randaug/ViT-B_16/256" row (106.48 ms), the only row with
# conditionals: what it measured beyond its estimate without them (90.45 ms: 6,068
# kernels), over its 672 conditionals.
FITTED: dict[str, Rates] = {
  "h200": Rates(
    product_flop_s=737.7e12,
    convolution_flop_s=55.3e12,
    attention_flop_s=160.7e12,
    fusion_bytes_s=2.884e12,
    kernel_s=3.378e-6,
    conditional_s=23.9e-6,
    source="rates fitted to the H200 checks (docs/gpu_check/)",
  )
}


def rates_for(chip: Chip) -> Optional[Rates]:
  """`FITTED` for ``chip``; another GPU's from the H200's scaled by the published peaks'
  ratio (products, convolution, attention) and HBM bandwidths' (fusions); None on TPUs."""
  if chip.platform != "cuda":
    return None
  if chip.name in FITTED:
    return FITTED[chip.name]
  base, reference = FITTED["h200"], hardware.GPUS["h200"]
  compute = chip.peak_flops_for("bfloat16") / reference.peak_flops_for("bfloat16")
  memory = chip.hbm_bytes_per_s / reference.hbm_bytes_per_s
  return dataclasses.replace(
    base,
    product_flop_s=base.product_flop_s * compute,
    convolution_flop_s=base.convolution_flop_s * compute,
    attention_flop_s=base.attention_flop_s * compute,
    fusion_bytes_s=base.fusion_bytes_s * memory,
    source=f"the H200's fit scaled by {chip.name}'s published peaks (not measured)",
  )


@dataclasses.dataclass(frozen=True)
class Estimate:
  """The estimated step and its parts, in seconds."""

  step_s: float
  products_s: float
  convolution_s: float
  attention_s: float
  fusions_s: float
  kernels_s: float
  conditionals_s: float
  collectives_s: float
  counts: Counts
  source: str


def of_compiled(compiled: Any, chip: Chip, bound: Any = None) -> Optional[Estimate]:
  """The estimate of ``compiled`` (a `jax.stages.Compiled` for ``chip``, or None) with
  the collectives' time of its ``bound`` (`report.StepTime`); None where the chip has no
  rates (TPUs) or nothing compiled."""
  rates = rates_for(chip)
  if compiled is None or rates is None:
    return None
  collectives = bound.ici_s + bound.network_s if bound else 0.0
  return estimate(counts(compiled.as_text()), rates, collectives)


def estimate(counts: Counts, rates: Rates, collectives_s: float = 0.0) -> Estimate:
  """``counts`` priced at ``rates``, the parts one after another; ``collectives_s``: the
  bound's time of the collectives (several GPUs), added as not overlapped."""
  parts = (
    counts.product_flops / rates.product_flop_s,
    counts.convolution_flops / rates.convolution_flop_s,
    counts.attention_flops / rates.attention_flop_s,
    counts.fusion_bytes / rates.fusion_bytes_s,
    counts.kernels * rates.kernel_s,
    counts.conditionals * rates.conditional_s,
  )
  return Estimate(sum(parts) + collectives_s, *parts, collectives_s, counts, rates.source)


def _dims(shape: str) -> list[list[int]]:
  """The dimensions of each array of an HLO shape text."""
  return [[int(d) for d in dims.split(",") if d] for _, dims in hlo._ARRAY.findall(shape)]


def _operands(rest: str) -> list[str]:
  match = _OPERANDS.search(rest)
  names = re.sub(r"/\*[^*]*\*/", "", match.group(1)) if match else ""
  return [n.strip() for n in names.split(",") if n.strip().startswith("%")]


def _library_flops(target: str, shape: str, rest: str, shapes: dict[str, str]) -> tuple[str, float]:
  """(kind, FLOPs) of a library call: 'product', 'convolution', 'attention' or 'other'."""
  out = (_dims(shape) or [[]])[0]
  operands = _operands(rest)
  lhs = _dims(shapes.get(operands[0], "")) if operands else []
  if target.startswith("__cublas"):
    contracting = _CONTRACTING.search(rest)
    axes = [int(a.strip('"')) for a in contracting.group(1).split(",")] if contracting else []
    k = math.prod(lhs[0][a] for a in axes) if lhs and axes else 0
    return "product", 2.0 * math.prod(out) * k
  if target.startswith("__cudnn$conv"):
    labels = _DIM_LABELS.search(rest)
    rhs = _dims(shapes.get(operands[1], "")) if len(operands) > 1 else []
    if labels and rhs:
      kernel = rhs[0]
      per_output = math.prod(kernel) // kernel[labels.group(1).index("o")]
      return "convolution", 2.0 * math.prod(out) * per_output
    return "convolution", 0.0
  if target.startswith("__cudnn$fmha"):
    scores = _ATTENTION_SHAPE.search(rest)
    if scores:
      b_h_q_k = math.prod(int(d.strip(' "')) for d in scores.group(1).split(","))
      products = 5 if "Backward" in target else 2
      return "attention", products * 2.0 * b_h_q_k * (out[-1] if out else 0)
  return "other", 0.0


def _fused_bytes(
  lines: list[str], shapes: dict[str, str]
) -> tuple[dict[int, float], Optional[float]]:
  """What a fused computation reads of each parameter it only slices (by parameter
  number), and what it writes when its root updates a parameter in place (None: its
  whole result)."""
  params: dict[str, int] = {}
  users: dict[str, list[tuple[str, float, int]]] = {}
  root: Optional[tuple[str, list[str]]] = None
  for line in lines:
    parsed = hlo._split_instruction(line)
    if parsed is None:
      continue
    name, shape, opcode, rest = parsed
    if opcode == "parameter":
      params[name] = int(_OPERANDS.search(rest).group(1))
      continue
    operands = _operands(rest)
    for position, operand in enumerate(operands):
      users.setdefault(operand, []).append((opcode, sum(hlo._shape_bytes(shape)), position))
    if line.lstrip().startswith("ROOT"):
      root = (opcode, operands)
  sliced: dict[int, float] = {}
  for name, number in params.items():
    uses = users.get(name, [])
    if uses and all(op in ("dynamic-slice", "slice") and pos == 0 for op, _, pos in uses):
      sliced[number] = sum(size for _, size, _ in uses)
  written = None
  if root and root[0] == "dynamic-update-slice" and root[1] and root[1][0] in params:
    update = sum(hlo._shape_bytes(shapes.get(root[1][1], ""))) if len(root[1]) > 1 else 0.0
    sliced[params[root[1][0]]] = 0.0  # updated in place: only the update is written
    written = update
  return sliced, written


def counts(hlo_text: str) -> Counts:
  """`Counts` of a GPU program's optimized HLO (``Compiled.as_text()``)."""
  comps = hlo.computations(hlo_text)
  shapes: dict[str, str] = {}
  for lines in comps.values():
    for line in lines:
      parsed = hlo._split_instruction(line)
      if parsed:
        shapes[parsed[0]] = parsed[1]
  total = dict(product=0.0, convolution=0.0, attention=0.0, fusion_bytes=0.0)
  launched = dict(kernels=0.0, conditionals=0.0)
  fused: dict[str, tuple[dict[int, float], Optional[float]]] = {}

  def kernel_bytes(shape: str, rest: str, opcode: str) -> float:
    """Bytes an XLA kernel reads and writes: its operands and results, a fusion's sliced
    operands at the slices' size."""
    sliced: dict[int, float] = {}
    written: Optional[float] = None
    called = _CALLS.search(rest) if opcode == "fusion" else None
    if called and called.group(1) in comps:
      if called.group(1) not in fused:
        fused[called.group(1)] = _fused_bytes(comps[called.group(1)], shapes)
      sliced, written = fused[called.group(1)]
    reads = sum(
      sliced.get(i, sum(hlo._shape_bytes(shapes.get(o, "")))) for i, o in enumerate(_operands(rest))
    )
    return reads + (sum(hlo._shape_bytes(shape)) if written is None else written)

  def walk(name: str, weight: float, stack: tuple[str, ...]) -> None:
    for line in comps.get(name, []):
      parsed = hlo._split_instruction(line)
      if parsed is None:
        continue
      _, shape, opcode, rest = parsed
      if opcode in _FREE or opcode.endswith("-done"):
        continue
      callees: list[tuple[str, float]] = []
      if opcode == "while":
        body, condition = hlo._BODY.search(rest), hlo._CONDITION.search(rest)
        known = hlo.KNOWN_TRIPS.search(rest)
        trips = int(known.group(1)) if known else None
        if trips is None and condition:
          trips = hlo.trip_count(comps.get(condition.group(1), []))
        callees.append((body.group(1) if body else "", weight * (trips or 1)))
      elif opcode == "conditional":
        match = _BRANCHES.search(rest)
        branches = [b.strip() for b in match.group(1).split(",")] if match else []
        launched["conditionals"] += weight
        callees += [(b, weight / len(branches)) for b in branches]
      elif opcode == "call":
        callees += [(c, weight) for c in _CALLS.findall(rest)]
      else:
        launched["kernels"] += weight
        target = _TARGET.search(rest) if opcode == "custom-call" else None
        kind, flops = _library_flops(target.group(1), shape, rest, shapes) if target else ("", 0)
        if kind in ("product", "convolution", "attention"):
          total[kind] += weight * flops
        else:
          total["fusion_bytes"] += weight * kernel_bytes(shape, rest, opcode)
      for callee, runs in callees:
        if callee in comps and callee not in stack:
          walk(callee, runs, stack + (callee,))

  walk("ENTRY", 1.0, ("ENTRY",))
  return Counts(
    product_flops=total["product"],
    convolution_flops=total["convolution"],
    attention_flops=total["attention"],
    fusion_bytes=total["fusion_bytes"],
    kernels=launched["kernels"],
    conditionals=launched["conditionals"],
  )


def describe(found: Estimate) -> str:
  """One line: the estimate and its parts."""
  parts = [
    ("products", found.products_s),
    ("attention", found.attention_s),
    ("convolution", found.convolution_s),
    ("fusions", found.fusions_s),
    ("kernel gaps", found.kernels_s),
    ("conditionals", found.conditionals_s),
    ("collectives", found.collectives_s),
  ]
  text = ", ".join(f"{name} {s * 1e3:.1f} ms" for name, s in parts if s)
  return (
    f"step time ~ {found.step_s * 1e3:.1f} ms estimated ({text}; "
    f"{found.counts.kernels:.0f} kernels; {found.source})"
  )
