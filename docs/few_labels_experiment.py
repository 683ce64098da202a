r"""The paper's two other methods at the scale of the built-in digits (docs/evaluation.md table).

    PYTHONPATH=. python docs/few_labels_experiment.py --out=/tmp/few_labels [--shots=10]

On the same 360 test digits:
  (a) the quickstart model trained from scratch on N labelled digits per class;
  (b) the same, after masked patch prediction on all 1,437 train digits without labels;
  (c) the quickstart model trained on all labels, then few-shot linear evaluation at
      1/5/10 shots of its frozen features.
(a) and (b) draw the N labelled digits per class anew for each seed. Prints a table.
"""

from __future__ import annotations

import os

import numpy as np
from absl import app, flags
from PIL import Image

from configs import mpp, quickstart
from vit_jax import run
from vit_jax.data import digits

_OUT = flags.DEFINE_string("out", "/tmp/few_labels", "Where the folders and runs go.")
_SHOTS = flags.DEFINE_integer("shots", 10, "Labelled train digits per class for (a) and (b).")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of the labelled sample and runs.")
_STEPS = flags.DEFINE_integer("steps", 300, "Training steps of each supervised run.")


def write_folder(root: str, shots: int, seed: int) -> str:
  """`root/{train,test}/<class>/<i>.png`: `shots` train digits per class, every test digit."""
  images, labels = digits.digits_arrays()  # [1797, 8, 8, 1] uint8, [1797]
  split = digits.split_indices()
  rng = np.random.default_rng(seed)
  train_idx = split["train"]
  picked = np.concatenate(
    [rng.choice(train_idx[labels[train_idx] == c], shots, replace=False) for c in range(10)]
  )
  for name, indices in (("train", picked), ("test", split["test"])):
    for i in indices:
      folder = os.path.join(root, name, str(labels[i]))
      os.makedirs(folder, exist_ok=True)
      Image.fromarray(images[i, :, :, 0]).save(os.path.join(folder, f"{i}.png"))
  return root


def supervised(workdir: str, seed: int, dataset: str | None = None, pretrained: str | None = None):
  config = quickstart.get_config()
  config.total_steps, config.seed = _STEPS.value, seed
  config.eval_every = config.checkpoint_every = _STEPS.value
  if dataset is not None:  # the few-label folder: a batch of 50 digits (of 10 x shots)
    config.dataset, config.train_split, config.test_split = dataset, "train", "test"
    config.batch = 50
  if pretrained is not None:
    config.pretrained = pretrained
  return run.train_and_evaluate(config, workdir)


def main(argv):
  del argv
  out, seeds = _OUT.value, [int(s) for s in _SEEDS.value]
  mpp_dir = os.path.join(out, "mpp")
  run.train_and_evaluate(mpp.get_config("digits"), mpp_dir)
  rows = {"scratch": [], "mpp": []}
  for seed in seeds:
    folder = write_folder(os.path.join(out, f"digits{_SHOTS.value}_s{seed}"), _SHOTS.value, seed)
    for kind, source in (("scratch", None), ("mpp", os.path.join(mpp_dir, "checkpoints"))):
      workdir = os.path.join(out, f"{kind}_s{seed}")
      metrics = supervised(workdir, seed, dataset=f"folder:{folder}", pretrained=source)
      rows[kind].append(metrics["eval/accuracy"])

  config = quickstart.get_config()
  config.total_steps = config.eval_every = config.checkpoint_every = _STEPS.value
  config.fewshot.datasets, config.fewshot.shots = ("digits",), (1, 5, 10)
  config.fewshot.every = _STEPS.value
  fewshot = run.train_and_evaluate(config, os.path.join(out, "supervised"))

  def cell(values):
    return f"{100 * np.mean(values):.1f} ± {100 * np.std(values):.1f}%"

  n = _SHOTS.value
  print(f"| setting (seeds {seeds}, {_STEPS.value} steps) | test accuracy |")
  print("|---|---|")
  print(f"| (a) from scratch, {n} labels per class | {cell(rows['scratch'])} |")
  print(
    f"| (b) MPP on the unlabelled train split, then {n} labels per class | {cell(rows['mpp'])} |"
  )
  shots = " / ".join(
    f"{100 * fewshot[f'fewshot/digits_{s}shot']:.1f}"
    f" ± {100 * fewshot[f'fewshot/digits_{s}shot_spread']:.1f}"
    for s in (1, 5, 10)
  )
  print(f"| (c) supervised on all labels, then linear 1 / 5 / 10-shot | {shots}% |")


if __name__ == "__main__":
  app.run(main)
