"""The paper's Table 2 row for a checkpoint: the config file loaded per dataset with the same
overrides, the prepared datasets run (a stand-in for training), the others listed, the
VTAB-1k mean read from the suite's output, the paper's row beside it."""

import json
import os

from tests import fresh_python, tiny_tfds
from vit_jax import paper_row


def test_the_row_runs_the_prepared_datasets_and_lists_the_others(tmp_path):
  data_dir, workdir = str(tmp_path / "tfds"), str(tmp_path / "row")
  tiny_tfds.prepare(
    "cifar10", data_dir, {"train": 2, "test": 2}, lambda k, rng: {"id": f"{k}", "label": k}
  )
  os.makedirs(os.path.join(workdir, "vtab"))
  with open(os.path.join(workdir, "vtab", "vtab.json"), "w") as f:
    json.dump({"means": {"Natural": 80.0, "Mean": 70.5}}, f)
  config_file = os.path.join(fresh_python.REPO, "configs", "vit.py")
  argv = ["paper_row", f"--config={config_file}:ti16,imagenet2012"]
  argv += [f"--config.data_dir={data_dir}", f"--workdir={workdir}", "--config.lr.base=0.01"]
  runs = []

  def train(config, run_dir):
    runs.append((config.dataset, config.lr.base, config.test_split, run_dir))
    return {"eval/accuracy": 0.25, "eval/loss": 1.0}

  row, skipped = paper_row.run_row(lambda d: paper_row.config_for(argv, d), workdir, train)
  assert runs == [("cifar10", 0.01, "test", os.path.join(workdir, "cifar10"))]
  assert row == {"CIFAR-10": 25.0, paper_row.VTAB: 70.5}
  assert list(skipped) == ["imagenet2012", "cifar100", "oxford_iiit_pet", "oxford_flowers102"]
  text = paper_row.table(row, skipped, paper_row.PAPER_ROWS["ViT-L_16"])
  lines = text.splitlines()
  assert lines[2] == "| this checkpoint | — | — | 25.00 | — | — | — | 70.50 |"
  assert lines[3] == "| paper | 85.30 | 88.62 | 99.15 | 93.25 | 94.67 | 99.61 | 72.72 |"
  assert lines[-1] == f"- oxford_flowers102: not prepared in {data_dir}"
