r"""The quickstart's accuracy over seeds: the figure the README states (docs/results.md).

    PYTHONPATH=. python docs/quickstart_seeds.py --out=/tmp/quickstart_seeds \
        [--seeds=0,1,2,3,4,5,6,7,8,9] [--set=label_smoothing=0.1]

Runs the README's quickstart command, `python -m vit_jax.main --config=configs/quickstart.py`,
once per seed (`--config.seed=<seed>`), each in its own workdir `<out>/seed<seed>`, one
after the other (a run uses every core). `--set=key=value` adds `--config.key=value` to every
run. Reads each run's final test accuracy from its TensorBoard events (`eval/accuracy` at
the last step), appends one JSON line per run to `<out>/results.jsonl` and prints a table
and the mean and min-max over the seeds. A workdir that already holds a finished run is
read, not trained again (the command resumes it and stops at once).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

_OUT = flags.DEFINE_string("out", None, "Where the runs and results go (default: a new temp dir).")
_SEEDS = flags.DEFINE_list("seeds", [str(s) for s in range(10)], "Seeds of the runs.")
_SET = flags.DEFINE_multi_string("set", [], "key=value: adds --config.key=value to every run.")
_CONFIG = flags.DEFINE_string("config", "configs/quickstart.py", "The config file each run uses.")


def final_accuracy(workdir: str) -> tuple[int, float]:
  """(step, eval/accuracy) of the last evaluation in the run's TensorBoard events."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  last: tuple[int, float] | None = None
  for path in sorted(
    glob.glob(os.path.join(workdir, "tensorboard", "**", "events.*"), recursive=True)
  ):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == "eval/accuracy" and (last is None or event.step >= last[0]):
          last = (event.step, float(tf.make_ndarray(value.tensor)))
  if last is None:
    raise RuntimeError(f"no eval/accuracy in the TensorBoard events under {workdir}")
  return last


def train(seed: int, workdir: str) -> float:
  """Runs the quickstart command for `seed` in `workdir`; its wall time in seconds."""
  command = [sys.executable, "-m", "vit_jax.main", f"--config={_CONFIG.value}"]
  command += [f"--workdir={workdir}", f"--config.seed={seed}"]
  command += [f"--config.{override}" for override in _SET.value]
  print("$", " ".join(command[1:]), flush=True)
  start = time.time()
  subprocess.run(command, check=True)
  return time.time() - start


def main(argv):
  del argv
  out = _OUT.value or tempfile.mkdtemp(prefix="quickstart_seeds_")
  os.makedirs(out, exist_ok=True)
  rows = []
  for seed in [int(s) for s in _SEEDS.value]:
    workdir = os.path.join(out, f"seed{seed}")
    seconds = train(seed, workdir)
    step, accuracy = final_accuracy(workdir)
    row = {"seed": seed, "step": step, "accuracy": accuracy, "seconds": round(seconds, 1)}
    row["overrides"] = _SET.value
    with open(os.path.join(out, "results.jsonl"), "a") as f:
      f.write(json.dumps(row) + "\n")
    rows.append(row)
  print(f"\n{_CONFIG.value} {' '.join(_SET.value)} (runs under {out})")
  print("| seed | test accuracy | wall time |")
  print("|---|---|---|")
  for row in rows:
    print(f"| {row['seed']} | {100 * row['accuracy']:.2f}% | {row['seconds']:.0f} s |")
  accuracies = 100 * np.asarray([row["accuracy"] for row in rows])
  print(
    f"mean {accuracies.mean():.2f}%, range {accuracies.min():.2f}-{accuracies.max():.2f}% "
    f"over seeds {_SEEDS.value[0]}-{_SEEDS.value[-1]} ({len(rows)} runs)"
  )


if __name__ == "__main__":
  app.run(main)
