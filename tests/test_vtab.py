"""VTAB-1k: the 19 tasks against the real tfds builders' features, their 1k splits, the
group means by hand, and the suite command on a tiny model over a tiny `dtd` made here
(ArrayRecord, without TensorFlow or network)."""

import numpy as np
import pytest
import tensorflow_datasets as tfds

from configs import vtab as vtab_config
from tests import tiny_tfds
from vit_jax import errors
from vit_jax import vtab as command
from vit_jax.data import splits, vtab
from vit_jax.models import get_model_config


def test_the_19_tasks_in_the_papers_order_and_groups():
  groups = [t.group for t in vtab.TASKS.values()]
  assert len(groups) == 19 and groups == ["Natural"] * 7 + ["Specialized"] * 4 + ["Structured"] * 8
  assert list(vtab.TASKS)[:3] == ["caltech101", "cifar100", "dtd"]


def test_each_task_reads_a_feature_of_its_real_tfds_builder(tmp_path):
  """The tfds name (and config) builds; the label feature is there with the task's class
  count (a derived class: its source feature is there)."""
  for name, t in vtab.TASKS.items():
    features = tfds.builder(t.tfds_name, data_dir=str(tmp_path)).info.features
    assert t.label_key in features, name
    if not t.derived:
      assert features[t.label_key].num_classes == t.num_classes, name


def test_the_1k_splits_are_vtabs_slices_of_the_tfds_splits():
  expected_val200 = {
    "caltech101": "train[2754:2954]",  # 90 * 3060 // 100
    "cifar100": "train[45000:45200]",
    "oxford_iiit_pet": "train[2944:3144]",  # 80%
    "svhn": "train[65931:66131]",  # 90 * 73257 // 100
    "eurosat": "train[16200:16400]",  # 60%
    "resisc45": "train[18900:19100]",
    "dsprites_location": "train[589824:590024]",  # 80 * 737280 // 100
    "smallnorb_azimuth": "test[:200]",
    "dtd": "validation[:200]",
  }
  for name, val200 in expected_val200.items():
    assert vtab.TASKS[name].split("val200") == val200, name
    assert vtab.TASKS[name].split("train800val200") == f"train[:800]+{val200}"
  assert vtab.TASKS["eurosat"].split("test") == "train[21600:]"  # after train and val: 80%
  assert vtab.TASKS["clevr_count"].split("test") == "validation"
  sizes = {"train": 27_000}
  counts = [
    sum(map(len, splits.resolve(vtab.TASKS["eurosat"].split(s), sizes))) for s in vtab.SPLITS
  ]
  assert counts == [800, 200, 1000, 5400]


def test_group_means_by_hand_on_made_up_accuracies():
  names = list(vtab.TASKS)
  made_up = dict(zip(names, [10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 70, *range(10, 90, 10)]))
  means = vtab.group_means(made_up)
  assert means["Natural"] == pytest.approx(40.0)  # (10 + ... + 70) / 7
  assert means["Specialized"] == pytest.approx(85.0)  # (80 + 90 + 100 + 70) / 4
  assert means["Structured"] == pytest.approx(45.0)  # (10 + ... + 80) / 8
  assert means["Mean"] == pytest.approx(980 / 19)  # of the 19 tasks, not of the 3 groups
  del made_up["dmlab"]
  assert set(vtab.group_means(made_up)) == {"Natural", "Specialized"}  # no partial mean


def test_a_derived_task_or_an_unknown_one_is_one_error_line():
  with pytest.raises(errors.ConfigError, match=r"'clevr_count' derives its class from"):
    vtab_config.get_config("b16,clevr_count")
  with pytest.raises(errors.ConfigError, match=r"Unknown VTAB task 'cifar10': use one of"):
    vtab.task("cifar10")


def test_the_suite_runs_the_present_tasks_and_lists_the_others(tmp_path):
  data_dir = str(tmp_path / "tfds")
  tiny_tfds.prepare(
    "dtd",
    data_dir,
    {"train": 800, "validation": 200, "test": 16},
    lambda k, rng: {"label": k % 47, "file_name": f"{k}.jpg"},
  )
  config = vtab_config.get_config("ti16")
  config.model = get_model_config("testing")
  config.update(dict(data_dir=data_dir, batch=16, batch_eval=16, total_steps=2, decode_processes=0))
  config.update(dict(eval_every=2, checkpoint_every=2, log_every=1))
  config.pp.crop, config.lr.warmup_steps = 8, 1
  accuracies, skipped = command.run_suite(
    config, str(tmp_path / "vtab"), ["dtd", "sun397", "clevr_count"]
  )
  assert list(accuracies) == ["dtd"] and 0 <= accuracies["dtd"] <= 100
  assert skipped["sun397"].startswith("sun397/tfds is not prepared in ")
  assert "objects/size" in skipped["clevr_count"]
  text = command.table(accuracies, skipped, paper=72.72)
  assert f"| dtd | Natural | {accuracies['dtd']:.2f} | |" in text
  assert "| **VTAB-1k mean** (19 tasks) | | — | 72.72 |" in text
  assert text.splitlines()[-2:] == [
    f"- sun397: {skipped['sun397']}",
    f"- clevr_count: {skipped['clevr_count']}",
  ]
  assert np.isfinite(accuracies["dtd"])
