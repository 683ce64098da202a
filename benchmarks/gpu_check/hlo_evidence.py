"""CPU-side evidence before a GPU lease: the default-config ViT-B/16 train step compiled
for one H100 (compile-only devices of JAX's CUDA plugin, the `gpu-plan` extra, no GPU),
before and after the GPU defaults (`vit_jax.models.backend_defaults`): the kernels one
step launches, which run as library calls (cuBLAS, cuDNN custom calls) and which as XLA
fusions, and the predicted memory.

    python -m benchmarks.gpu_check --hlo-evidence          # the three cases
    python -m benchmarks.gpu_check --hlo-evidence=after    # the default step alone

With each case's proxy figures for a change to the step before a lease: the XLA fusions'
bytes (operands and results, sliced operands at the slice), the products' FLOPs and the
plan's estimate of the step (`vit_jax.plan.gpu_estimate`, the H200's rates scaled to the
H100's published peaks).

Compiled as the plan compiles (`vit_jax.plan.gpu_topology.COMPILER_OPTIONS`: Triton
GEMMs off, so every matrix product is a cuBLAS call); a GPU run with Triton GEMMs on may
move some products into Triton fusions.
"""

from __future__ import annotations

import collections
import re
from typing import Any

from benchmarks.gpu_check.config import DEFAULT, get_config

TOPOLOGY = "h100x1"
# (label, attention, dtype): "before" is the old default (the einsum attention in float32,
# what an unset config computed with), then the H200 table's einsum row (bf16 asked for),
# "after" the config left unset on a GPU.
CASES = (
  ("before: unset = einsum, float32", "einsum", "float32"),
  ("einsum, bfloat16 set", "einsum", "bfloat16"),
  ("after: unset on a GPU", DEFAULT, None),
)
BATCH = 256
# Instructions that launch nothing (layout-only or bookkeeping).
_FREE = {
  "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
  "partition-id", "replica-id", "opt-barrier",
}  # fmt: skip
_COMPUTATION = re.compile(r"^(ENTRY )?(%?[\w.\-]+) .*\{$")
_INSTRUCTION = re.compile(r"^\s+(ROOT )?%?[\w.\-]+ = [^=]*? ([a-z][a-z\-]*)\(")
_CALLED = re.compile(r"(?:calls|to_apply|body|condition|branch_computations)=\{?(%?[\w.\-,% ]+)\}?")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_FUSION_KIND = re.compile(r"kind=(k\w+)")


def kernel_counts(hlo: str) -> dict[str, Any]:
  """Kernels of one step from optimized HLO text: each launching instruction of the entry
  computation and of the computations it runs (loop bodies, branches), by kind: library
  calls by their target, fusions by XLA's fusion kind, other ops by opcode."""
  computations: dict[str, list[str]] = {}
  entry, current = None, None
  for line in hlo.splitlines():
    match = _COMPUTATION.match(line)
    if match:
      current = match.group(2).lstrip("%")
      computations[current] = []
      entry = current if match.group(1) else entry
    elif current is not None and line.strip() and line.strip() != "}":
      computations[current].append(line)
  launched: collections.Counter[str] = collections.Counter()
  pending, seen = [entry], set()
  while pending:
    name = pending.pop()
    if name in seen or name not in computations:
      continue
    seen.add(name)
    for line in computations[name]:
      match = _INSTRUCTION.match(line)
      if not match or match.group(2) in _FREE:
        continue
      op = match.group(2)
      if op in ("while", "conditional", "call"):  # their computations run as kernels
        for called in _CALLED.findall(line):
          pending += [c.strip().lstrip("%") for c in called.split(",")]
        continue
      if op == "custom-call":
        target = _TARGET.search(line)
        launched[f"library: {target.group(1) if target else '?'}"] += 1
      elif op == "fusion":
        kind = _FUSION_KIND.search(line)
        launched[f"fusion: {kind.group(1) if kind else '?'}"] += 1
      else:
        launched[f"op: {op}"] += 1
  library = sum(n for k, n in launched.items() if k.startswith("library"))
  fusions = sum(n for k, n in launched.items() if k.startswith("fusion"))
  return dict(
    kernels=sum(launched.values()),
    library_calls=library,
    fusions=fusions,
    by_kind=dict(launched.most_common()),
  )


def evidence(which: str = "all") -> list[dict[str, Any]]:
  """Each of `CASES` (``which='after'``: the last alone) compiled for `TOPOLOGY`: its
  choice, kernels, predicted memory and the estimate's counts."""
  from vit_jax import models, run  # pylint: disable=g-import-not-at-top
  from vit_jax.infra import sharding  # pylint: disable=g-import-not-at-top
  from vit_jax.plan import (  # pylint: disable=g-import-not-at-top
    gpu_estimate,
    gpu_topology,
    topology,
  )
  from vit_jax.run import step_cost  # pylint: disable=g-import-not-at-top

  nodes = topology.parse(TOPOLOGY)
  topology.prepare_environment(nodes)
  found = []
  for label, attention, dtype in CASES if which == "all" else CASES[-1:]:
    config = get_config(f"ViT-B_16,{BATCH},{attention}")
    config.model.dtype = dtype
    mesh = sharding.make_mesh(tuple(config.mesh), devices=nodes.devices())
    limit = int(nodes.device_memory_bytes)
    spec = run.resolve(config, mesh=mesh, memory_limit_bytes=limit, open_data=False)
    steps = run.build_steps(spec, mesh)
    lowered = steps.train_step.lower(steps.abstract_state, steps.abstract_train_batch())
    compiled = lowered.compile(compiler_options=gpu_topology.COMPILER_OPTIONS)
    image = models.image_settings(spec.model)
    estimate = gpu_estimate.of_compiled(compiled, nodes.chip)
    found.append(
      dict(
        label=label,
        attention=image.attention_impl,
        dtype=str(image.dtype),
        peak_bytes=step_cost.peak_bytes(compiled),
        fusion_gb=estimate.counts.fusion_bytes / 1e9,
        product_tflop=estimate.counts.product_flops / 1e12,
        estimate_ms=estimate.step_s * 1e3,
        **kernel_counts(compiled.as_text()),
      )
    )
  return found


def markdown(found: list[dict[str, Any]]) -> str:
  """The evidence as a table: one column per case, one row per figure and kernel kind."""
  kinds = sorted({k for case in found for k in case["by_kind"]})
  head = "| ViT-B/16 train step, batch 256, one H100 | " + " | ".join(c["label"] for c in found)
  lines = [head + " |", "|---|" + "---|" * len(found)]
  rows = [
    ("attention, compute dtype", lambda c: f"{c['attention']}, {c['dtype']}"),
    ("predicted memory (GiB)", lambda c: f"{c['peak_bytes'] / 2**30:.2f}"),
    ("kernels per step", lambda c: str(c["kernels"])),
    ("library calls", lambda c: str(c["library_calls"])),
    ("XLA fusions", lambda c: str(c["fusions"])),
    ("XLA kernels' bytes (GB)", lambda c: f"{c['fusion_gb']:.1f}"),
    ("cuBLAS products (TFLOP)", lambda c: f"{c['product_tflop']:.2f}"),
    ("plan's estimate (ms)", lambda c: f"{c['estimate_ms']:.1f}"),
  ]
  rows += [(f"&nbsp;&nbsp;{k}", lambda c, k=k: str(c["by_kind"].get(k, 0))) for k in kinds]
  for name, cell in rows:
    lines.append(f"| {name} | " + " | ".join(cell(c) for c in found) + " |")
  return "\n".join(lines)
