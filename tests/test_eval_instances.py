"""Evaluations as named instances (config.evals): ImageNet ReaL and V2 beside the run's own
test split, on tiny tfds datasets with the real builders' features (ArrayRecord, made here
without TensorFlow or network); one run with three instances, stopped and resumed."""

import dataclasses
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from tests import tiny_tfds, train_fixtures
from vit_jax import data, run
from vit_jax.infra import errors, sharding
from vit_jax.run import defaults, progress
from vit_jax.run.evaluators import instances, real

_REAL_SETS = 12  # imagenet2012_real's validation examples; every third has an empty set


def _real_example(k: int, rng: np.random.Generator) -> dict:
  del rng
  labels = [] if k % 3 == 0 else sorted({k, (7 * k) % 1000})
  return {"original_label": k, "real_label": labels, "file_name": f"ILSVRC2012_val_{k}.JPEG"}


@pytest.fixture(scope="module")
def imagenet_dir(tmp_path_factory) -> str:
  """A data_dir with tiny imagenet2012_real (validation: 12) and imagenet_v2 (test: 40)."""
  data_dir = str(tmp_path_factory.mktemp("imagenet_tfds"))
  tiny_tfds.prepare("imagenet2012_real", data_dir, {"validation": _REAL_SETS}, _real_example)
  tiny_tfds.prepare(
    "imagenet_v2",
    data_dir,
    {"test": 40},
    lambda k, rng: {"label": int(rng.integers(3)), "file_name": f"{k}.jpeg"},
  )
  return data_dir


def _config(data_dir: str):
  """The tiny run on imagenet_v2 (1000 classes) with three named evaluations."""
  config = train_fixtures.tiny_config(
    data_dir, dataset="imagenet_v2", train_split="test", test_split="test[:8]", batch_eval=8
  )
  config.num_classes = None
  config.decode_processes = 0  # threads: no worker processes to start for each split
  config.evals.real = dict(
    kind="real", dataset="imagenet2012_real", split="validation", label_key="original_label"
  )
  config.evals.v2 = dict(split="test[8:24]", every=3)
  config.evals.original = dict(
    dataset="imagenet2012_real", split="validation", label_key="original_label", every=2
  )
  return config


def test_three_instances_evaluate_on_their_schedules_and_resume_exactly(
  imagenet_dir, tmp_path, monkeypatch
):
  config = _config(imagenet_dir)
  history = progress.History()
  built = run.build(config)
  straight = run.train(built, str(tmp_path / "straight"), history)
  steps = {
    name: [row["step"] for row in history.evaluations[:-1] if f"{name}/accuracy" in row]
    for name in ("eval", "real", "v2", "original")
  }
  # eval_every=4 for the run's split and for real (no `every`); v2 every 3, original every 2.
  assert steps == {"eval": [4], "real": [4], "v2": [3], "original": [2, 4]}
  assert straight["real/examples"] == 8  # the 12 images less the 4 with an empty set
  assert straight["original/examples"] == 12 and straight["v2/examples"] == 16
  assert straight["eval/examples"] == 8

  # Stopped after step 4 (step 3 saved) with the straight run's built steps (its compiled
  # programs); resumed as a new process resumes: built afresh from the config.
  real_iterator = data.train_iterator

  def preempted(*args, **kwargs):
    it = real_iterator(*args, **kwargs)
    for _ in range(4):
      yield next(it)
    raise RuntimeError("preempted")

  with monkeypatch.context() as patch:
    patch.setattr(data, "train_iterator", preempted)
    with pytest.raises(RuntimeError, match="preempted"):
      run.train(built, str(tmp_path / "resumed"))
  assert sorted(os.listdir(tmp_path / "resumed" / "checkpoints")) == ["3"]
  resumed = run.train_and_evaluate(config, str(tmp_path / "resumed"))
  named = {k: v for k, v in straight.items() if k.split("/")[0] in steps}
  assert len(named) == 11 and {k: resumed[k] for k in named} == named


def test_real_counts_a_top1_in_the_set_and_leaves_out_empty_sets():
  sets = [np.array([3, 7]), np.array([], np.int64), np.array([5]), np.array([0, 1, 2])]
  predictions = np.array([7, 4, 6, 2])
  assert real.real_accuracy(predictions, sets) == (2, 3)  # 7 in {3,7}, 6 not in {5}, 2 in ...


def test_real_evaluator_maps_rows_to_examples_past_padding_and_skipped_images():
  """Two hand-made eval batches of 4 over 6 images: padding (mask 0) and a skipped image
  are not counted; each row's prediction meets its own image's set."""
  labels = [np.array([k]) for k in range(6)]
  labels[4] = np.array([], np.int64)  # an image without ReaL labels
  batches = [
    {"pred": np.array([0, 9, 2, 3]), "mask": np.array([1.0, 0.0, 1.0, 1.0])},  # row 1 skipped
    {"pred": np.array([4, 0, 0, 0]), "mask": np.array([1.0, 1.0, 0.0, 0.0])},  # rows 6, 7 pad
  ]
  evaluator = real.Real(1, lambda params, batch: batch["pred"], batches, labels, "r")
  assert evaluator(None) == {"r/accuracy": 3 / 4, "r/examples": 4}  # images 0, 2, 3, 5
  # Two processes of 2 rows over 6 examples: shards [0, 3) and [3, 6).
  np.testing.assert_array_equal(real.row_indices(0, 4, 2, 6), [0, 1, 3, 4])
  np.testing.assert_array_equal(real.row_indices(1, 4, 2, 6), [2, -1, 5, -1])


def test_real_and_v2_use_imagenet2012s_class_indices(tmp_path):
  """ReaL's label sets and V2's labels index the same 1000 classes, in the same order, as
  the ImageNet the model was fine-tuned on (tfds' class names: WordNet ids)."""
  names = {
    name: tfds.builder(name, data_dir=str(tmp_path)).info.features[key]
    for name, key in (
      ("imagenet2012", "label"),
      ("imagenet2012_real", "real_label"),
      ("imagenet_v2", "label"),
    )
  }
  names["imagenet2012_real"] = names["imagenet2012_real"].feature  # Sequence(ClassLabel)
  reference = names.pop("imagenet2012").names
  assert len(reference) == 1000 and reference[:2] == ["n01440764", "n01443537"]
  assert all(label.names == reference for label in names.values())


@pytest.mark.parametrize(
  "evals, message",
  [
    ({"eval": {"split": "test"}}, r"config\.evals\.eval: the name 'eval' must be"),
    ({"v2": {"split": "test", "kind": "top5"}}, r"config\.evals\.v2\.kind='top5' is not one of"),
    ({"v2": {"dataset": "imagenet_v2"}}, r"config\.evals\.v2\.split=None: name the split"),
    ({"v2": {"split": "test", "every": 0}}, r"config\.evals\.v2\.every=0 must be an integer"),
    ({"v2": {"split": "test", "pq": "x"}}, r"config\.evals\.v2 has unknown fields \['pq'\]"),
    ({"v2": {"split": "test", "pp": "x"}}, r"config\.evals\.v2\.pp='x' must be a dict"),
  ],
)
def test_a_bad_instance_is_one_error_line_naming_it(evals, message):
  config = defaults.get_config()
  config.evals.update(evals)
  with pytest.raises(errors.ConfigError, match=message):
    instances.read(config.evals)


def test_an_instances_pp_changes_only_how_its_images_are_prepared(imagenet_dir):
  """big_vision's per-evaluator pp: the run's crop, mean and std, the instance's resize."""
  config = _config(imagenet_dir)
  config.evals.v2.pp = dict(crop_pct=0.875, interpolation="bicubic")
  found = {i.name: i for i in instances.read(config.evals)}
  settings = data.Settings.from_config(config)
  prepared = instances.data_settings(settings, found["v2"]).eval_data_config()
  run_pp = settings.eval_data_config()
  assert prepared == dataclasses.replace(
    run_pp, crop_pct=0.875, interpolation="bicubic", resizer="pil"
  )
  assert instances.data_settings(settings, found["real"]).eval_data_config() == run_pp
  mesh = sharding.make_mesh((("data", -1), ("model", 1)))
  plain = dataclasses.replace(found["v2"], pp={})
  images = [
    next(iter(data.eval_iterator(instances.data_settings(settings, i), mesh)))["image"]
    for i in (found["v2"], plain)
  ]
  assert images[0].shape == images[1].shape and not np.allclose(images[0], images[1])
  bad = instances.Instance("v2", "accuracy", "test", pp={"crop_mode": "zoom"})
  with pytest.raises(errors.ConfigError, match=r"^config\.evals\.v2\.pp: .*crop_mode='zoom'"):
    instances.data_settings(settings, bad)


def test_a_config_written_before_evals_reads_as_none():
  config = defaults.get_config()
  del config["evals"]
  defaults.check_complete(config)
  assert instances.read(config.get("evals")) == ()


def test_an_instance_of_other_classes_or_without_its_label_is_refused(imagenet_dir, tmp_path):
  """Checked when the run is resolved (`instances.check_data`; the run above passes it)."""
  settings = data.Settings.from_config(_config(imagenet_dir))
  tiny_tfds.prepare("cifar10", str(tmp_path), {"test": 2}, lambda k, rng: {"id": "", "label": k})
  cifar = instances.Instance("cifar", "accuracy", "test", "cifar10", data_dir=str(tmp_path))
  with pytest.raises(errors.ConfigError, match=r"config\.evals\.cifar\.dataset='cifar10' has 10"):
    instances.check_data([cifar], settings, 1000)
  no_label = instances.Instance("a", "accuracy", "validation", "imagenet2012_real")
  with pytest.raises(errors.ConfigError, match=r"^config\.evals\.a: tfds dataset 'imagenet2"):
    instances.check_data([no_label], settings, 1000)
