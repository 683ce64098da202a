r"""`python -m vit_jax.vtab`: fine-tunes a checkpoint on each VTAB-1k task and prints the table.

    python -m vit_jax.vtab --config=configs/vtab.py:b16 --config.pretrained=ViT-B_16 \
        --config.data_dir=/data/tfds --workdir=/tmp/vtab_b16 [--tasks=dtd,svhn] [--sweep]

Each task of `vit_jax.data.vtab.TASKS` whose tfds data is prepared in ``config.data_dir``
is a run of ``--config`` in ``<workdir>/<task>`` (`data.vtab.apply_task`: its dataset,
label feature and 1k splits; an interrupted suite resumes each run where it stopped, and
a finished one only evaluates); its test accuracy goes into the table, printed in the
paper's order with the Natural, Specialized and Structured means and the mean of the 19
(a mean only when all of its tasks ran), beside the paper's numbers for the model where
the paper has them (Table 9's tasks, Table 2's mean). Tasks not run are listed with the
reason (data not prepared, or prepared at another size than the task's splits are cut
from). The table is written to ``<workdir>/vtab.md`` and the accuracies to
``<workdir>/vtab.json``.
"""

from __future__ import annotations

import copy
import os
import sys
from typing import Any, Callable, Mapping, Optional, Sequence

from absl import flags

from vit_jax import cli
from vit_jax.data import vtab
from vit_jax.infra import errors

# The paper's VTAB-1k accuracies (%) of the public checkpoints it reports, by model name:
# each task from Table 9 (one decimal), the mean of the 19 from Table 2. ViT-L/16
# pre-trained on ImageNet-21k; Table 9's other rows (ViT-H/14 and ViT-L/16 on JFT-300M)
# have no public checkpoint.
PAPER: dict[str, dict[str, float]] = {
  "ViT-L_16": {
    **dict(caltech101=90.8, cifar100=84.1, dtd=74.1, oxford_flowers102=99.3),
    **dict(oxford_iiit_pet=92.7, sun397=61.0, svhn=80.9, patch_camelyon=82.5, eurosat=95.6),
    **dict(resisc45=85.2, diabetic_retinopathy=75.3, clevr_count=70.3, clevr_distance=56.1),
    **dict(dmlab=41.9, dsprites_location=74.7, dsprites_orientation=64.9, kitti_distance=79.9),
    **dict(smallnorb_azimuth=30.5, smallnorb_elevation=41.7, Mean=72.72),
  },
}


def _parse(argv: Sequence[str]) -> dict[str, Any]:
  flag_values = cli.new_flag_values()
  holders = dict(
    config=cli.define_config_flags(flag_values, argv, "configs/vtab.py:<model>, e.g. :b16."),
    workdir=flags.DEFINE_string(
      "workdir", None, "One run per task in <workdir>/<task>.", flag_values=flag_values
    ),
    tasks=flags.DEFINE_list(
      "tasks", list(vtab.TASKS), "The tasks to run (default: all 19).", flag_values=flag_values
    ),
    sweep=flags.DEFINE_bool(
      "sweep", False, "Train on train800, test on val200.", flag_values=flag_values
    ),
  )
  values = cli.parse_command_flags(flag_values, argv, holders, ("config", "workdir"), __doc__)
  for name in values["tasks"]:
    vtab.task(name)  # an unknown task: one error line naming the 19
  return values


def not_runnable(name: str, data_dir: Optional[str]) -> Optional[str]:
  """Why task ``name`` cannot run from ``data_dir`` (None: it can)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  t = vtab.TASKS[name]
  builder = tfds.builder(t.tfds_name, data_dir=data_dir)
  if not builder.is_prepared():
    return f"not prepared in {data_dir or 'the tfds default data_dir'}"
  try:
    vtab.check_sizes(name, {s: i.num_examples for s, i in builder.info.splits.items()})
  except errors.ConfigError as e:
    return str(e)
  return None


def run_suite(
  config: Any,
  workdir: str,
  tasks: Sequence[str],
  sweep: bool = False,
  train: Optional[Callable[[Any, str], Mapping[str, float]]] = None,
) -> tuple[dict[str, float], dict[str, str]]:
  """({task: accuracy in %}, {task: why it was not run}) of ``tasks`` (``train``: the run,
  default `vit_jax.run.train_and_evaluate`)."""
  if train is None:
    from vit_jax import run  # pylint: disable=g-import-not-at-top

    train = run.train_and_evaluate
  accuracies, skipped = {}, {}
  for name in tasks:
    why = not_runnable(name, config.data_dir)
    if why:
      skipped[name] = why
      continue
    task_config = copy.deepcopy(config)
    vtab.apply_task(task_config, name, sweep)
    metrics = train(task_config, os.path.join(workdir, name))
    accuracies[name] = 100.0 * metrics["eval/accuracy"]
  return accuracies, skipped


def table(
  accuracies: Mapping[str, float],
  skipped: Mapping[str, str],
  paper: Optional[Mapping[str, float]] = None,
) -> str:
  """The Markdown table: each task in the paper's order, the group means and the mean of
  the 19 (``paper``: the paper's numbers for this model, {task or 'Mean': %}; its group
  means are those of its tasks), then the tasks not run."""
  dash = "—"
  paper = {**vtab.group_means(paper), **paper} if paper else {}

  def cell(values: Mapping[str, float], key: str, missing: str, digits: int = 2) -> str:
    return f"{values[key]:.{digits}f}" if key in values else missing

  lines = ["| Task | Group | Accuracy (%) | Paper (%) |", "|---|---|---:|---:|"]
  for name, t in vtab.TASKS.items():
    lines.append(
      f"| {name} | {t.group} | {cell(accuracies, name, dash)} | {cell(paper, name, '', 1)} |"
    )
  means = vtab.group_means(accuracies)
  for group in (*vtab.GROUPS, "Mean"):
    count = sum(t.group == group for t in vtab.TASKS.values()) or len(vtab.TASKS)
    label = "VTAB-1k mean" if group == "Mean" else f"{group} mean"
    lines.append(
      f"| **{label}** ({count} tasks) | | {cell(means, group, dash)} | {cell(paper, group, '')} |"
    )
  reasons: dict[str, list[str]] = {}
  for name, why in skipped.items():
    reasons.setdefault(why, []).append(name)
  if reasons:
    lines += ["", "Not run:"] + [f"- {why}: {', '.join(names)}" for why, names in reasons.items()]
  return "\n".join(lines)


def _suite(values: dict[str, Any]) -> int:
  config, workdir = values["config"], values["workdir"]
  accuracies, skipped = run_suite(config, workdir, values["tasks"], values["sweep"])
  if not accuracies:
    raise errors.MissingError(
      f"No VTAB task ran from config.data_dir={config.data_dir!r} ({len(skipped)} "
      f"{next(iter(skipped.values()))}): prepare them with `tfds build <name> "
      "--data_dir=<dir>` (docs/evaluation.md lists the 19 and their tfds names)."
    )
  text = table(accuracies, skipped, PAPER.get(config.model.get("name", "")))
  results = {"accuracy": accuracies, "means": vtab.group_means(accuracies), "not_run": skipped}
  cli.write_table(workdir, "vtab", text, results)
  return 0


def main(argv: Sequence[str]) -> int:
  """Parses ``argv``, runs the suite and prints the table; the exit status."""
  return cli.run_command(argv, _parse, _suite, context=lambda v: (v["workdir"], v["config"]))


if __name__ == "__main__":
  cli.exit_with(main(sys.argv))
