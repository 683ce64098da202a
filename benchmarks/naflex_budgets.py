r"""Tokens per second of a NaFlex run that mixes sequence budgets against one budget, as a
table (the CPU rows of the NaFlex speed target; the GPU's are `gpu_check`'s NaFlex rows).

    python -m benchmarks.naflex_budgets [--model=ViT-Ti_16] [--budgets=64,128,256] \
        [--fixed=128] [--batch=32] [--rounds=3] [--steps=5] [--smoke]

Each budget gets its own compiled train step (`vit_jax.run.build`, AdamW, no dropout) with
the batch a run of ``--config.pp.train_seq_lens=BUDGETS --config.pp.seq_len=FIXED
--config.batch=BATCH`` gives it (`data.budget_mix.BudgetMix`: about ``--batch`` x
``--fixed`` tokens per step); the model's table is its 224 grid, resized to
each image's (bilinear), and the images are of aspect ratios from 1:4 to 4:1. In
``--rounds`` interleaved rounds, ``--steps`` steps at ``--fixed`` alone and as many at a
budget drawn at random each step; the table gives each budget's batch, median step and
tokens per second, then both runs' tokens per second and their ratio, with the load
average before and after (compare ratios on a shared machine, not figures). It runs on
the CPU unless JAX_PLATFORMS names another backend.
``--smoke``: the 1-layer, 32-wide model at budgets 4, 8 and 16 (seconds, for the tests).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Optional, Sequence

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before JAX starts: the CPU rows
BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCHMARKS)
sys.path.insert(0, os.path.dirname(BENCHMARKS))
from benchmarks.gpu_check import config as check_config  # noqa: E402
from benchmarks.gpu_check import naflex_rows  # noqa: E402
from vit_jax.data import budget_mix  # noqa: E402
from vit_jax.infra import errors  # noqa: E402

SMOKE = dict(model="ViT-Ti_16", budgets=(4, 8, 16), fixed=8, batch=16, rounds=1, steps=2)


def run_config(model: str, budget: int, batch: int, smoke: bool) -> Any:
  """``model``'s train row (`gpu_check.config.get_config`, its backend's attention and
  dtype) on NaFlex inputs of ``budget`` patches, ``batch`` images a step."""
  config = check_config.get_config(f"{model},{batch},{check_config.DEFAULT}")
  if smoke:
    check_config.smoke_model(config.model)
  patch = config.model.patches.size[0]
  side = (check_config.SMOKE["resolution"] if smoke else check_config.RESOLUTION) // patch
  config.model.posemb_grid = (side, side)
  config.model.posemb_resample = "bilinear"
  config.pp.seq_len = budget
  config.batch = config.batch_eval = batch
  return config


def table(result: dict[str, Any], load: tuple[float, float]) -> str:
  """The printed table of `naflex_rows.time_budget_mix`'s ``result``."""
  lines = ["| budget | batch | tokens/step | step (median) | tokens/s | compiled memory |"]
  lines.append("|---|---|---|---|---|---|")
  for budget, row in result["budgets"].items():
    memory = row["compiled_peak_bytes"]
    memory = "-" if memory is None else f"{memory / 2**20:,.1f} MiB"
    timed = "step_ms_median" in row  # a budget never drawn has no timed step
    step = f"{row['step_ms_median']:,.1f} ms" if timed else "-"
    rate = f"{row['tokens_s']:,.0f}" if timed else "-"
    lines.append(f"| {budget} | {row['batch']} | {row['tokens']:,} | {step} | {rate} | {memory} |")
  lines.append("")
  lines.append(f"one budget: {result['fixed_tokens_s']:,.0f} tokens/s")
  lines.append(f"mixed budgets: {result['mixed_tokens_s']:,.0f} tokens/s")
  lines.append(f"mixed / one: {result['mixed_over_fixed']:.3f}x")
  device = f"{result['device']['device_kind']} x{result['device']['count']}"
  lines.append(
    f"device: {device}; attention {result['attention']}, {result['dtype']}; "
    f"load average {load[0]:.2f} before, {load[1]:.2f} after"
  )
  return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="ViT-Ti_16")
  parser.add_argument("--budgets", default="64,128,256")
  parser.add_argument("--fixed", type=int, default=128)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--smoke", action="store_true")
  args = parser.parse_args(argv)
  if args.smoke:
    vars(args).update(SMOKE)
  budgets = args.budgets
  budgets = budgets if isinstance(budgets, tuple) else tuple(map(int, budgets.split(",")))
  if args.fixed not in budgets:
    parser.error(f"--fixed={args.fixed} is not one of --budgets={budgets}: add it to them.")
  try:
    mix = budget_mix.BudgetMix.make(budgets, args.batch, args.fixed)
  except errors.ConfigError as e:  # a budget whose batch would hold no image
    parser.error(f"{e} (here: --budgets, --batch and --fixed)")
  configs = {b: run_config(args.model, b, mix.batch(b), args.smoke) for b in budgets}
  before = os.getloadavg()[0]
  result = naflex_rows.time_budget_mix(configs, args.fixed, args.rounds, args.steps)
  print(table(result, (before, os.getloadavg()[0])))
  return 0


if __name__ == "__main__":
  sys.exit(main())
