"""The check's markdown report from its results (`gpu_check.json`): versions, the
correctness checks, the speed rows with timm's ratios and the plan's memory, the
augmentation, input-pipeline and image-text rows, the profile's kernel table."""

from __future__ import annotations

from typing import Any, Optional

from benchmarks.gpu_check import rows, timm_rows
from benchmarks.gpu_check.config import SMOKE, TIMED_STEPS

VERSIONS = (
  "jax", "jaxlib", "jax-cuda13-plugin", "flax", "optax", "orbax-checkpoint", "torch", "timm",
)  # fmt: skip
GIB = 2**-30


def _f(value: Optional[float], spec: str, scale: float = 1.0) -> str:
  return "-" if value is None else format(value * scale, spec)


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
  return a / b if a and b else None


def _planned(row: dict[str, Any]) -> str:
  """The plan's estimate of the row's step; where the plan file has none for this GPU, the
  same estimate of the program the GPU compiled, marked *."""
  if row.get("plan_step_ms"):
    return f"{row['plan_step_ms']:.1f}"
  return f"{row['hlo_step_ms']:.1f}*" if row.get("hlo_step_ms") else "-"


def _device_kind(results: dict[str, Any]) -> str:
  devices = (r.get("device") for r in results.values())
  return next((d["device_kind"] for d in devices if isinstance(d, dict)), "?")


def _correctness(correct: dict[str, Any]) -> list[str]:
  if "train_step_vs_cpu" not in correct:
    return [f"correctness: {correct.get('error') or correct.get('skipped')}", ""]
  lines = [
    "| check | tolerance | loss | grad norm | params after 3 steps | ok |",
    "|---|---|---|---|---|---|",
  ]
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
  return lines + [""]


def _speed_rows(results: dict[str, Any], plan_rows: dict[str, Any]) -> list[str]:
  timm = results.get("timm", {})
  base = results.get(rows.TRAIN_DEFAULT.name, {}).get("img_s")
  lines = [
    "| row | attention, dtype | img/s | step ms | plan step ms | MFU | GFLOP/img | peak mem GiB | "
    "plan GiB | compile s | timm img/s | ours / timm |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  named = [(s.name, s.mode if s.model == "ViT-B_16" else None) for s in rows.SPEEDS]
  named += [(rows.RECIPE, None), (rows.RECIPE_ARRAY_RECORD, None), (rows.RANDAUG, None)]
  named += [(rows.PIPELINE, None), (rows.SIGLIP, None)]
  for name, mode in named:
    r = results.get(name)
    if r is None:
      continue
    if "img_s" not in r:
      lines.append(f"| {name} | {r.get('error') or r.get('skipped') or 'failed'} |" + " |" * 10)
      continue
    theirs = timm.get(mode, {}).get("img_s") if mode else None
    planned = plan_rows.get(name, {}).get("needed_bytes")
    lines.append(
      f"| {name} | {r.get('attention')}, {r.get('dtype')} | {r['img_s']:.0f} | "
      f"{r['step_ms_median']:.1f} | {_planned(r)} | {_f(r['mfu'], '.1%')} | "
      f"{_f(r['gflop_per_img_analytic'], '.1f')} | {_f(r['peak_bytes_in_use'], '.2f', GIB)} | "
      f"{_f(planned, '.2f', GIB)} | {r['compile_s']:.0f} | {_f(theirs, '.0f')} | "
      f"{_f(_ratio(r['img_s'], theirs), '.2f')} |"
    )
  notes = _recipe_notes(results, base)
  if any(not r.get("plan_step_ms") and r.get("hlo_step_ms") for r in results.values()):
    notes.append("* The estimate of the program this GPU compiled: the plan file has none.")
  randaug = results.get(rows.RANDAUG, {}).get("img_s")
  if randaug and base:
    notes.append(f"RandAugment and Mixup in the step: {randaug / base:.2f}x the plain step.")
  pipe = results.get(rows.PIPELINE, {})
  if pipe.get("img_s"):
    notes.append(
      f"Fed from JPEG files by the package's pipeline: {pipe['img_s']:.0f} img/s end to end "
      f"({_f(_ratio(pipe['img_s'], base), '.2f')}x the synthetic-batch row); the pipeline "
      f"alone {pipe['pipeline_img_s']:.0f} img/s in worker processes (one per core), "
      f"{pipe.get('pipeline_threads_img_s', 0):.0f} img/s in the main process's threads."
    )
  loader = results.get("timm_loader", {})
  if loader.get("img_s"):
    notes.append(
      f"timm's DataLoader ({loader['workers']} workers) on the same files: "
      f"{loader['img_s']:.0f} img/s."
    )
  return lines + ([""] + notes if notes else [])


def _recipe_notes(results: dict[str, Any], base: Optional[float]) -> list[str]:
  """The recipe from JPEGs against the synthetic plain step and timm's loader-fed step."""
  theirs = results.get("timm_recipe", {})
  notes = []
  for name in (rows.RECIPE, rows.RECIPE_ARRAY_RECORD):
    r = results.get(name, {})
    if r.get("img_s"):
      notes.append(
        f"The recipe from JPEGs ({r.get('dataset')}, RandAugment {r.get('randaug')}, "
        f"Mixup {r.get('mixup')}, decoding in worker processes on {r.get('cores')} "
        f"cores): {r['img_s']:.0f} img/s, {_f(_ratio(r['img_s'], base), '.2f')}x the "
        f"synthetic plain step, {_f(_ratio(r['img_s'], theirs.get('img_s')), '.2f')}x timm's "
        "loader-fed step on the same recipe."
      )
  if theirs.get("img_s"):
    notes.append(
      f"timm's DataLoader ({theirs['workers']} workers, {theirs['auto_augment']} and "
      f"Mixup in the workers) feeding timm's compiled step: {theirs['img_s']:.0f} img/s."
    )
  return notes


def _naflex(results: dict[str, Any]) -> list[str]:
  """NaFlex's padded attention (fused against einsum) and its budgets' tokens per second."""
  lines = []
  a = results.get(rows.NAFLEX_ATTENTION)
  if a and "features_rel_diff" in a:
    cudnn = a.get(f"{a['fused']}_calls_cudnn_attention")
    lines += [
      f"NaFlex padded attention, {a['fused']} vs einsum (bf16): features "
      f"{a['features_rel_diff']:.2e}, gradients {a['grad_rel_diff']:.2e} relative; "
      f"cuDNN's fused attention in the program: {cudnn}",
      "",
    ]
  m = results.get(rows.NAFLEX_MIXED)
  if m and "budgets" in m:
    lines += [
      f"NaFlex train step ({m['attention']}, {m['dtype']}), one compiled step per budget:",
      "",
      "| budget | batch | tokens/step | step ms | tokens/s | TFLOP/step | MFU | compiled GiB |",
      "|---|---|---|---|---|---|---|---|",
    ]
    for budget, b in m["budgets"].items():
      lines.append(
        f"| {budget} | {b['batch']} | {b['tokens']} | {_f(b.get('step_ms_median'), '.1f')} | "
        f"{_f(b.get('tokens_s'), ',.0f')} | {_f(b.get('tflop_per_step'), '.1f')} | "
        f"{_f(b.get('mfu'), '.1%')} | {_f(b['compiled_peak_bytes'], '.2f', GIB)} |"
      )
    lines += [
      "",
      f"Fixed budget {_f(m['fixed_tokens_s'], ',.0f')} tokens/s, mixed budgets "
      f"{_f(m['mixed_tokens_s'], ',.0f')} tokens/s: mixed / fixed {m['mixed_over_fixed']:.3f}",
      "",
    ]
  return lines


def _timm(timm: dict[str, Any]) -> list[str]:
  if not timm:
    return []
  if "error" in timm:
    return [f"\ntimm: {timm['error']}"]
  return [
    f"\ntimm {timm['timm']} / torch {timm['torch']} ({timm_rows.TIMM_MODEL}, torch.compile "
    f"{timm['compile_backend']}): train {_f(timm['train']['img_s'], '.0f')} img/s at batch "
    f"{timm['train']['batch']} (peak {_f(timm['train']['peak_bytes'], '.2f', GIB)} GiB), "
    f"inference {_f(timm['infer']['img_s'], '.0f')} img/s at batch {timm['infer']['batch']}."
  ]


def _profile(summary: Optional[dict[str, Any]]) -> list[str]:
  if not summary or "kinds_ms" not in summary:
    return []
  lines = [
    f"\nProfile of {rows.TRAIN_DEFAULT.name} ({rows.PROFILE_STEPS} steps): per step "
    f"{summary['span_ms']:.1f} ms traced, the device busy {summary['busy_ms']:.1f} ms "
    f"({summary['idle_fraction']:.0%} idle), {summary['kernels_per_step']:.0f} kernels.",
    "\n| kernel kind | ms per step |\n|---|---|",
  ]
  lines += [f"| {kind} | {ms:.2f} |" for kind, ms in summary["kinds_ms"].items()]
  lines.append("\n| top kernel | kind | ms per step | calls per step |\n|---|---|---|---|")
  lines += [
    f"| `{t['name']}` | {t['kind']} | {t['ms']:.2f} | {t['calls']:.0f} |" for t in summary["top"]
  ]
  return lines


def table(report: dict[str, Any]) -> str:
  """The markdown report of ``report`` (what `__main__` writes to ``gpu_check.json``)."""
  v, results = report["versions"], report["results"]
  kind = _device_kind(results)
  steps = SMOKE["steps"] if report["smoke"] else TIMED_STEPS
  lines = [
    f"Device: {kind}; nvidia-smi: {v.get('nvidia_smi') or '-'}",
    "Versions: " + ", ".join(f"{k} {v[k]}" for k in ("python", *VERSIONS) if v.get(k)),
    f"Mode: {'smoke (CPU, tiny models)' if report['smoke'] else 'full'}; "
    f"{steps} timed steps per row (median)",
    "",
  ]
  if "correctness" in results:
    lines += _correctness(results["correctness"])
  topology = {"h100": "h100x1", "h200": "h200x1"}
  plan = report.get("plan", {})
  plan_rows = next((plan.get(t, {}) for k, t in topology.items() if k in kind.lower()), {})
  lines += _speed_rows(results, plan_rows)
  lines += _naflex(results)
  lines += _timm(results.get("timm", {}))
  lines += _profile(results.get("profile", {}).get("profile"))
  skipped = [f"{k} ({r['skipped']})" for k, r in results.items() if r.get("skipped")]
  if skipped:
    lines.append("\nSkipped rows: " + "; ".join(skipped))
  failed = [k for k, r in results.items() if not r.get("ok")]
  lines.append("\nFailed rows: " + (", ".join(failed) if failed else "none"))
  return "\n".join(lines) + "\n"
