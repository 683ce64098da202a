r"""Images of several aspect ratios, square crops against NaFlex: the figure in docs/models.md.

    PYTHONPATH=. python docs/naflex_aspect_experiment.py --out=/tmp/naflex_aspect \
        [--seeds=0] [--steps=1000]

Writes an image folder (`folder:<out>/data`, `{train,test}/<digit>/*.png`) of the built-in
digits, each 8x8 digit placed at a random spot of a black canvas of 8x24, 16x16 or 24x8
pixels (a third each), then trains the quickstart (`configs/quickstart.py`: 4x4 patches)
on it twice per seed: with square crops (`pp.crop=16`, every canvas resized to 16x16: a
wide or tall digit squeezed 3:1) and with NaFlex (`pp.seq_len=16`, the same 16 patches, each
canvas at its own aspect ratio). Prints a table of the final test accuracies and writes
`<out>/results.jsonl`.
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
from absl import app, flags

_OUT = flags.DEFINE_string("out", None, "Where the data, runs and results go.")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds of the runs.")
_STEPS = flags.DEFINE_integer("steps", 1000, "Train steps of each run.")
CANVASES = ((8, 24), (16, 16), (24, 8))  # (height, width) of the canvases, a third each
RUNS = {"square crops": {"crop": 16}, "NaFlex": {"crop": 16, "seq_len": 16}}  # config.pp


def write_folder(root: str, seed: int = 0) -> None:
  """The digits splits as PNGs on canvases of `CANVASES`, the digit at a random spot."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  from vit_jax.data import digits  # pylint: disable=g-import-not-at-top

  images, labels = digits.digits_arrays()
  rng = np.random.default_rng(seed)
  for split, indices in digits.split_indices().items():
    for i in indices:
      h, w = CANVASES[rng.integers(len(CANVASES))]
      canvas = np.zeros((h, w), np.uint8)
      y, x = rng.integers(0, h - 7), rng.integers(0, w - 7)
      canvas[y : y + 8, x : x + 8] = images[i, ..., 0]
      folder = os.path.join(root, split, str(labels[i]))
      os.makedirs(folder, exist_ok=True)
      Image.fromarray(canvas).save(os.path.join(folder, f"{i}.png"))


def main(argv):
  del argv
  from configs import quickstart  # pylint: disable=g-import-not-at-top
  from vit_jax import run  # pylint: disable=g-import-not-at-top

  out = _OUT.value or tempfile.mkdtemp(prefix="naflex_aspect_")
  data = os.path.join(out, "data")
  if not os.path.isdir(data):
    write_folder(data)
  rows = []
  for seed in map(int, _SEEDS.value):
    for name, overrides in RUNS.items():
      config = quickstart.get_config()
      config.dataset, config.train_split, config.test_split = f"folder:{data}", "train", "test"
      config.seed, config.total_steps = seed, _STEPS.value
      config.pp.update(overrides)
      workdir = os.path.join(out, f"{name.replace(' ', '_')}_seed{seed}")
      metrics = run.train_and_evaluate(config, workdir)
      rows.append({"run": name, "seed": seed, "accuracy": float(metrics["eval/accuracy"])})
      with open(os.path.join(out, "results.jsonl"), "a") as f:
        f.write(json.dumps(rows[-1]) + "\n")
  print("| run | seed | test accuracy |\n|---|---|---|")
  for row in rows:
    print(f"| {row['run']} | {row['seed']} | {100 * row['accuracy']:.2f}% |")


if __name__ == "__main__":
  app.run(main)
