r"""The regularizers at the scale of the built-in digits (docs/recipes.md, "Evidence").

    PYTHONPATH=. python docs/recipes_experiment.py --out=/tmp/recipes_digits \
        [--settings=none,mixup0.2,sd0.1] [--seeds=0,1,2] [--train_split='train[:20%]'] \
        [--steps=2000]

The quickstart (configs/quickstart.py: batch 128, by default its 2,000 steps) trained on a fifth of
the train split (287 digits), once per seed and setting, evaluated on all 360 test digits.
Writes one JSON line per run to <out>/results.jsonl and prints the table (mean and range
of test accuracy over the seeds). A setting is a set of config overrides (`SETTINGS`).
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
from absl import app, flags

from configs import quickstart
from vit_jax import run

SETTINGS: dict[str, dict[str, object]] = {
  "none": {},
  "mixup0.2": {"mixup.p": 0.2},
  "sd0.1": {"model.stoch_depth": 0.1},
  "mixup0.2+sd0.1": {"mixup.p": 0.2, "model.stoch_depth": 0.1},
  # AugReg's settings (configs/augreg.py SETTINGS): RandAugment (layers, magnitude) + Mixup.
  "light2": {"pp.randaug": (2, 10), "mixup.p": 0.2},
  "medium2": {"pp.randaug": (2, 15), "mixup.p": 0.5},
}

_OUT = flags.DEFINE_string("out", "/tmp/recipes_digits", "Where the runs and results go.")
_SETTINGS = flags.DEFINE_list("settings", ["none", "mixup0.2", "sd0.1"], "Keys of SETTINGS.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of the runs.")
_SPLIT = flags.DEFINE_string("train_split", "train[:20%]", "The train split each run reads.")
_STEPS = flags.DEFINE_integer("steps", 2_000, "Training steps of each run (the quickstart's).")


def train(setting: str, seed: int) -> dict[str, float]:
  config = quickstart.get_config()
  config.train_split, config.seed, config.total_steps = _SPLIT.value, seed, _STEPS.value
  config.lr.warmup_steps = min(config.lr.warmup_steps, _STEPS.value // 10)
  config.eval_every = config.checkpoint_every = config.total_steps
  config.update_from_flattened_dict(SETTINGS[setting])
  start = time.time()
  metrics = run.train_and_evaluate(config, os.path.join(_OUT.value, f"{setting}_s{seed}"))
  return {"accuracy": float(metrics["eval/accuracy"]), "seconds": time.time() - start}


def main(argv):
  del argv
  os.makedirs(_OUT.value, exist_ok=True)
  results: dict[str, list[float]] = {}
  for seed in [int(s) for s in _SEEDS.value]:
    for setting in _SETTINGS.value:
      row = {"setting": setting, "seed": seed, **train(setting, seed)}
      with open(os.path.join(_OUT.value, "results.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
      results.setdefault(setting, []).append(row["accuracy"])
  print(f"| setting (seeds {', '.join(_SEEDS.value)}) | test accuracy: mean | range |")
  print("|---|---|---|")
  for setting, values in results.items():
    v = 100 * np.asarray(values)
    print(f"| {setting} | {v.mean():.2f}% | {v.min():.2f}-{v.max():.2f}% |")


if __name__ == "__main__":
  app.run(main)
