r"""The paper's recipes planned on the TPU slices it ran on, and on newer slices of as many chips.

    python benchmarks/plan_paper.py --out=/tmp/plan_paper.jsonl [--only=v3] [--slices=v4-8,v5p-8]

Each row compiles a recipe's own train and eval steps (`vit_jax.plan`) for a slice and
appends one JSON line to ``--out`` (rows already there are not compiled again, so an
interrupted run resumes); the markdown tables are printed from the file at the end.

Recipes: pre-training (configs/pretrain.py: B/16, L/16, H/14, batch 4096, 224) on a
v3-256 (128 chips; the paper does not name the slice of its JFT runs) and on a v3-8 for
L/16 on ImageNet-21k ("about 30 days on a TPUv3-8"); fine-tuning (configs/vit.py at 384,
batch 512) on a v3-8. Each v3 slice is also planned on the v4, v5e and v5p slices with
the same number of chips.

Utilisation implied by the paper's Table 2: FLOPs per step (this compile, v3) x steps /
(TPUv3-core-days x 86,400 s x the peak of one v3 TensorCore). Steps are epochs x images /
4096; the paper's Table 3 gives 7 or 14 epochs of JFT-300M (both shown) and 90 epochs of
ImageNet-21k (30 shown too).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

# `configs/` is a folder of the repository, not part of the installed package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import pretrain, vit  # noqa: E402
from vit_jax.infra import errors, hardware  # noqa: E402
from vit_jax.plan import planner, topology  # noqa: E402
from vit_jax.run import step_cost  # noqa: E402

GIB = 2**30
# Slices of equal chip count: the v3 slice's chips on v4, v5e and v5p.
SAME_CHIPS = {"v3-256": ("v4-256", "v5e-128", "v5p-256"), "v3-8": ("v4-8", "v5e-4", "v5p-8")}
# (recipe kind, config file argument, the paper's v3 slice)
# The pre-training rows that the utilisation table needs come first.
RECIPES: tuple[tuple[str, str, str], ...] = (
  ("pretrain", "l16,imagenet21k", "v3-256"),
  ("pretrain", "h14,imagenet21k", "v3-256"),
  ("pretrain", "b16,imagenet21k", "v3-256"),
  ("pretrain", "l16,imagenet21k", "v3-8"),
  ("finetune", "b16,imagenet2012", "v3-8"),
  ("finetune", "l16,imagenet2012", "v3-8"),
  ("finetune", "h14,imagenet2012", "v3-8"),
)
CONFIGS = {"pretrain": pretrain.get_config, "finetune": vit.get_config}
# The paper's Table 2: TPUv3-core-days of pre-training, and the data each run saw.
JFT_IMAGES = 300e6
PAPER_RUNS: tuple[tuple[str, str, float, float, tuple[int, ...]], ...] = (
  # (model, data, core-days, images per epoch, epochs to show)
  ("h14", "JFT-300M", 2500, JFT_IMAGES, (7, 14)),
  ("l16", "JFT-300M", 680, JFT_IMAGES, (7, 14)),
  ("l16", "ImageNet-21k", 230, pretrain.TRAIN_IMAGES["imagenet21k"], (30, 90)),
)


def rows(only: str, slices: str = "") -> list[tuple[str, str, str]]:
  """(kind, config argument, slice) in order: every v3 row first, then the others; only
  those on ``slices`` (comma-separated) when given."""
  v3 = [(kind, arg, name) for kind, arg, name in RECIPES]
  others = [(kind, arg, o) for kind, arg, name in RECIPES for o in SAME_CHIPS[name]]
  chosen = {"none": [], "v3": v3, "all": v3 + others}[only]
  wanted = set(filter(None, slices.split(",")))
  return [row for row in chosen if not wanted or row[2] in wanted]


def plan_row(kind: str, arg: str, slice_name: str) -> dict:
  """One plan as a dict; a recipe the resolver refuses before compiling (its activations
  alone exceed a device) is a row with ``refused`` set to the message."""
  config = CONFIGS[kind](arg)
  start = time.perf_counter()
  try:
    plan = planner.make_plan(config, topology.parse(slice_name))
  except errors.ConfigError as e:
    row = dict(topology=slice_name, refused=str(e), fits=False)
  else:
    row = dataclasses.asdict(plan)
    row.update(fits=plan.fits)
  row.update(kind=kind, recipe=arg, wall_seconds=time.perf_counter() - start)
  return row


def table(done: list[dict]) -> str:
  lines = [
    "| recipe | slice | batch / device | fits | train step / device (HBM) | FLOPs / step "
    "| step time >= (bound by) | MFU at bound | compile s |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for r in done:
    if "refused" in r:
      lines.append(
        f"| {r['kind']} {r['recipe']} | {r['topology']} | - | **no** "
        f"| refused before compiling: {r['refused'].split(': ', 1)[-1].split(' (')[0]} "
        "| - | - | - | - |"
      )
      continue
    train, t = r["train"], r["time"]
    # Fits against today's chip table: compiled sizes do not depend on it.
    chip = hardware.CHIPS[r["topology"].split("-")[0]]
    hbm = chip.per_device(chip.hbm_bytes)
    measures = (train, r["eval"])
    fits = all(
      m["memory"] and m["memory"]["total"] <= hbm * (1 - planner.HEADROOM) for m in measures
    )
    if train["memory"]:
      need = f"{train['memory']['total'] / GIB:.2f} GiB"
    else:
      need = f">= {train['needed_bytes'] / GIB:.1f} GiB (refused)"
    flops = f"{r['step_flops']:.3g}" if r["step_flops"] else "-"
    bound = f"{t['bound_s'] * 1e3:.0f} ms ({t['limited_by']}) | {t['mfu']:.0%}" if t else "- | -"
    lines.append(
      f"| {r['kind']} {r['recipe']} ({r['model']}, {r['crop']}) | {r['topology']} "
      f"| {r['batch_per_device']} | {'yes' if fits else '**no**'} "
      f"| {need} ({hbm / GIB:.1f}) | {flops} | {bound} "
      f"| {train['compile_seconds']:.0f} |"
    )
  return "\n".join(lines)


def utilisation(done: list[dict]) -> str:
  """The paper's runs: compiled FLOPs per step where a v3 row has them, else the analytic
  count (`step_cost.vit_flops_per_image`, matrix products only)."""
  v3_core_peak = hardware.CHIPS["v3"].per_device(hardware.CHIPS["v3"].peak_flops)
  lines = [
    "| run (Table 2) | core-days | FLOPs / step | epochs | steps | utilisation |",
    "|---|---|---|---|---|---|",
  ]
  for model, data, core_days, images, epochs in PAPER_RUNS:
    recipe = f"{model},imagenet21k"
    row = next(
      (
        r
        for r in done
        if r["recipe"] == recipe and r["topology"].startswith("v3") and r.get("step_flops")
      ),
      None,
    )
    if row:
      step_flops, source = row["step_flops"], "compiled"
    else:
      config = pretrain.get_config(recipe)
      per_image = step_cost.vit_flops_per_image(
        config.model, pretrain.CROP, config.num_classes, train=True
      )
      step_flops, source = per_image * pretrain.BATCH, "analytic"
    for e in epochs:
      steps = e * images / pretrain.BATCH
      used = step_flops * steps / (core_days * 86_400 * v3_core_peak)
      lines.append(
        f"| ViT-{model[0].upper()}/{model[1:]} {data} | {core_days:g} | {step_flops:.3g} "
        f"({source}) | {e} | {steps:,.0f} | {used:.0%} |"
      )
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", required=True, help="JSON lines file, appended to")
  parser.add_argument("--only", default="all", choices=("all", "v3", "none"))
  parser.add_argument("--slices", default="", help="comma-separated: only rows on these")
  args = parser.parse_args()
  topology.prepare_environment()
  done = []
  if os.path.exists(args.out):
    with open(args.out) as f:
      done = [json.loads(line) for line in f if line.strip()]
  seen = {(r["kind"], r["recipe"], r["topology"]) for r in done}
  for key in rows(args.only, args.slices):
    if key in seen:
      continue
    row = plan_row(*key)
    done.append(row)
    with open(args.out, "a") as f:
      f.write(json.dumps(row) + "\n")
    print(f"{key}: fits={row['fits']} in {row['wall_seconds']:.0f} s", flush=True)
  print(table(done))
  print()
  print(utilisation(done))


if __name__ == "__main__":
  main()
