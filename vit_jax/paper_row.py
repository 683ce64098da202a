r"""`python -m vit_jax.paper_row`: a checkpoint's row of the ViT paper's Table 2.

    python -m vit_jax.paper_row --config=configs/vit.py:l16,imagenet2012 \
        --config.pretrained=ViT-L_16 --config.data_dir=/data/tfds --workdir=/tmp/row_l16

Fine-tunes the checkpoint on each dataset of Table 2 that is prepared in
``config.data_dir`` (ImageNet with ReaL, CIFAR-10, CIFAR-100, Oxford-IIIT Pets, Oxford
Flowers-102): the config file is loaded once per dataset with its argument's dataset
replaced (``l16,cifar10``, ...; ``configs/vit.py``'s recipe) and the same overrides, a run
in ``<workdir>/<dataset>`` (resumable). The VTAB-1k column is the mean that
`vit_jax.vtab` wrote to ``<workdir>/vtab/vtab.json``, when it did. The row, beside the
paper's for the model where the paper has one, is printed and written to
``<workdir>/row.md`` and ``<workdir>/row.json``; datasets not prepared are listed.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Mapping, Optional, Sequence

from absl import flags

from vit_jax import cli
from vit_jax.infra import errors

# Table 2's columns: (name, dataset of the run, its metric).
COLUMNS: tuple[tuple[str, str, str], ...] = (
  ("ImageNet", "imagenet2012", "eval/accuracy"),
  ("ReaL", "imagenet2012", "real/accuracy"),
  ("CIFAR-10", "cifar10", "eval/accuracy"),
  ("CIFAR-100", "cifar100", "eval/accuracy"),
  ("Pets", "oxford_iiit_pet", "eval/accuracy"),
  ("Flowers", "oxford_flowers102", "eval/accuracy"),
)
VTAB = "VTAB (19 tasks)"
# The paper's Table 2 for the public checkpoint it reports (ViT-L/16 pre-trained on
# ImageNet-21k), by official model name.
PAPER_ROWS: dict[str, dict[str, float]] = {
  "ViT-L_16": {
    "ImageNet": 85.30,
    "ReaL": 88.62,
    "CIFAR-10": 99.15,
    "CIFAR-100": 93.25,
    "Pets": 94.67,
    "Flowers": 99.61,
    VTAB: 72.72,
  },
}


def _parse(argv: Sequence[str]) -> dict[str, Any]:
  flag_values = cli.new_flag_values()
  holders = dict(
    config=cli.define_config_flags(flag_values, argv, "configs/vit.py:<model>,<dataset>."),
    workdir=flags.DEFINE_string(
      "workdir", None, "A run per dataset in <workdir>/<dataset>.", flag_values=flag_values
    ),
  )
  values = cli.parse_command_flags(flag_values, argv, holders, ("config", "workdir"), __doc__)
  file_arg = next((a[len("--config=") :] for a in argv if a.startswith("--config=")), "")
  if file_arg.count(":") != 1 or file_arg.split(":")[1].count(",") != 1:
    raise errors.CommandLineError(
      f"--config={file_arg}: give a config file whose argument is '<model>,<dataset>', "
      "e.g. --config=configs/vit.py:l16,imagenet2012."
    )
  values["argv"] = list(argv)
  return values


def config_for(argv: Sequence[str], dataset: str) -> Any:
  """The config of ``argv``'s ``--config=<file>:<model>,<dataset>`` for ``dataset``, with
  the same ``--config.<key>`` overrides."""
  changed = [argv[0]]
  for arg in argv[1:]:
    if not arg.startswith("--config"):
      continue  # the command's own flags
    if arg.startswith("--config="):
      head = arg.rsplit(",", 1)[0]
      arg = f"{head},{dataset}"
    changed.append(arg)
  flag_values = cli.new_flag_values()
  holder = cli.define_config_flags(flag_values, changed, "")
  cli.parse_config_flags(flag_values, changed)
  return holder.value


def prepared(name: str, data_dir: Optional[str]) -> bool:
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  return tfds.builder(name, data_dir=data_dir).is_prepared()


def run_row(
  configs: Callable[[str], Any],
  workdir: str,
  train: Optional[Callable[[Any, str], Mapping[str, float]]] = None,
) -> tuple[dict[str, float], dict[str, str]]:
  """({column: accuracy in %}, {dataset: why not run}) of Table 2's datasets
  (``configs(dataset)``: its run config; ``train``: default `run.train_and_evaluate`)."""
  if train is None:
    from vit_jax import run  # pylint: disable=g-import-not-at-top

    train = run.train_and_evaluate
  row: dict[str, float] = {}
  skipped: dict[str, str] = {}
  for dataset in dict.fromkeys(d for _, d, _ in COLUMNS):
    config = configs(dataset)
    if not prepared(config.dataset, config.data_dir):
      skipped[dataset] = f"not prepared in {config.data_dir or 'the tfds default data_dir'}"
      continue
    for name in list(config.evals):
      if not prepared(config.evals[name].dataset, config.data_dir):
        skipped[config.evals[name].dataset] = "not prepared: its column is left empty"
        del config.evals[name]
    metrics = train(config, os.path.join(workdir, dataset))
    for column, source, metric in COLUMNS:
      if source == dataset and metric in metrics:
        row[column] = 100.0 * metrics[metric]
  vtab_json = os.path.join(workdir, "vtab", "vtab.json")
  if os.path.exists(vtab_json):
    with open(vtab_json) as f:
      mean = json.load(f)["means"].get("Mean")
    if mean is not None:
      row[VTAB] = mean
  return row, skipped


def table(row: Mapping[str, float], skipped: Mapping[str, str], paper: Optional[dict]) -> str:
  """The row (and the paper's) as a Markdown table, then the datasets not run."""
  names = [c for c, _, _ in COLUMNS] + [VTAB]
  cell = lambda values, c: f"{values[c]:.2f}" if c in values else "—"  # noqa: E731
  lines = ["| | " + " | ".join(names) + " |", "|---" + "|---:" * len(names) + "|"]
  lines.append("| this checkpoint | " + " | ".join(cell(row, c) for c in names) + " |")
  if paper:
    lines.append("| paper | " + " | ".join(cell(paper, c) for c in names) + " |")
  lines += ["", "Not run:"] + [f"- {d}: {why}" for d, why in skipped.items()] if skipped else []
  return "\n".join(lines)


def _row(values: dict[str, Any]) -> int:
  argv, workdir = values["argv"], values["workdir"]
  row, skipped = run_row(lambda dataset: config_for(argv, dataset), workdir)
  if not row:
    raise errors.MissingError(
      f"No dataset of Table 2 is prepared in config.data_dir={values['config'].data_dir!r}: "
      "prepare them with `tfds build <name> --data_dir=<dir>`."
    )
  paper = PAPER_ROWS.get(values["config"].model.get("name", ""))
  cli.write_table(
    workdir, "row", table(row, skipped, paper), {"row": row, "paper": paper, "not_run": skipped}
  )
  return 0


def main(argv: Sequence[str]) -> int:
  """Parses ``argv``, fine-tunes on each prepared dataset and prints the row."""
  return cli.run_command(argv, _parse, _row, context=lambda v: (v["workdir"], v["config"]))


if __name__ == "__main__":
  cli.exit_with(main(sys.argv))
