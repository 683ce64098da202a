"""VTAB-1k: the 19 tasks against the real tfds builders' features, their 1k splits, the
group means by hand, and the suite command on a tiny model over a tiny `dtd` made here
(ArrayRecord, without TensorFlow or network)."""

import copy
import io

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image
from tensorflow_datasets.proto import tf_example_pb2

from configs import vtab as vtab_config
from tests import tiny_tfds, train_fixtures
from vit_jax import vtab as command
from vit_jax.data import dataset, splits, vtab
from vit_jax.data import settings as data_settings
from vit_jax.infra import errors
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


def test_an_unknown_task_is_one_error_line():
  with pytest.raises(errors.ConfigError, match=r"Unknown VTAB task 'cifar10': use one of"):
    vtab.task("cifar10")


def _example(**features) -> dict:
  """A tf.train.Example's feature map from {key: int list or float list}."""
  example = tf_example_pb2.Example()
  for key, values in features.items():
    field = "float_list" if isinstance(values[0], float) else "int64_list"
    getattr(example.features.feature[key.replace("__", "/")], field).value.extend(values)
  return example.features.feature


def test_derived_classes_as_task_adaptation_computes_them_on_hand_made_examples():
  derive = vtab.DERIVED_LABELS
  assert derive["clevr_count"](_example(objects__size=[0, 1, 1, 0, 1])) == 2  # 5 objects
  # Depths 9.2 and 12.0 (the third of each x, y, depth): 9.2 is in bin [9.0, 9.5) -> 3.
  coords = [1.0, 2.0, 12.0, 3.0, 4.0, 9.2]
  assert derive["clevr_distance"](_example(objects__pixel_coords=coords)) == 3
  # A pedestrian (type 3) at 5 m, a car (type 0) at 15 m: the car counts, bin [8, 20) -> 1.
  location = [0.0, 0.0, 5.0, 1.0, 0.0, 15.0]
  assert derive["kitti_distance"](_example(objects__type=[3, 0], objects__location=location)) == 1
  assert (
    derive["kitti_distance"](_example(objects__type=[4], objects__location=[0.0, 0.0, 3.0])) == 3
  )
  assert derive["dsprites_location"](_example(label_x_position=[31])) == 15  # 32 -> 16 bins
  assert derive["dsprites_orientation"](_example(label_orientation=[39])) == 15  # 40 -> 16
  assert derive["dsprites_orientation"](_example(label_orientation=[5])) == 2  # 5 / 2.5
  binary = io.BytesIO()
  Image.fromarray(np.array([[0, 1], [1, 0]], np.uint8)).save(binary, format="PNG")  # dSprites'
  scaled = Image.open(io.BytesIO(vtab.scaled_png(binary.getvalue(), vtab.IMAGE_SCALES["dsprites"])))
  np.testing.assert_array_equal(np.asarray(scaled), [[0, 255], [255, 0]])
  config = vtab_config.get_config("b16,clevr_count")
  assert (config.dataset, config.label_key, config.num_classes) == ("clevr", "clevr_count", 8)


def _kitti_example(k: int, rng: np.random.Generator) -> dict:
  """A KITTI image with two objects: its class (the closest vehicle's distance bin) k % 4."""
  depth = (5.0, 10.0, 25.0, 1000.5)[k % 4]  # bins [-100, 8), [8, 20), [20, 999), [999, ...)
  objects = [
    dict(type=0, location=[0.0, 1.0, depth]),  # a car
    dict(type=3, location=[0.0, 1.0, 2.0]),  # a pedestrian, nearer, not counted
  ]
  if depth > 999:
    objects = objects[1:]  # no vehicle: the distance is 1000
  fill = dict(alpha=0.0, bbox=tfds.features.BBox(0.1, 0.1, 0.5, 0.5), dimensions=[1.0] * 3)
  fill.update(occluded=0, rotation_y=0.0, truncated=0.0)
  return {"image/file_name": f"{k}.png", "objects": [{**fill, **o} for o in objects]}


def test_the_suite_runs_the_present_tasks_and_lists_the_others(tmp_path):
  """KITTI's class, derived from its objects, read from the records of a tiny run; the
  table has its accuracy and lists the tasks not prepared."""
  data_dir = str(tmp_path / "tfds")
  sizes = {"train": 800, "validation": 200, "test": 16}
  tiny_tfds.prepare("kitti", data_dir, sizes, _kitti_example)
  config = vtab_config.get_config("ti16")
  config.model = get_model_config("testing")
  config.update(dict(data_dir=data_dir, batch=16, batch_eval=16, total_steps=2, decode_processes=0))
  config.update(dict(eval_every=2, checkpoint_every=2, log_every=1))
  config.pp.crop, config.lr.warmup_steps = 8, 1
  accuracies, skipped = command.run_suite(
    config, str(tmp_path / "vtab"), ["dtd", "kitti_distance", "clevr_count"]
  )
  assert list(accuracies) == ["kitti_distance"] and 0 <= accuracies["kitti_distance"] <= 100
  labels = dataset.Dataset(data_settings.Settings.from_config(config_for(config, "kitti_distance")))
  # tfds stores the examples in its own order: each class 4 times among the 16.
  np.testing.assert_array_equal(np.bincount(labels.split("test").read(0, 16)[1]), [4] * 4)
  assert skipped == dict.fromkeys(["dtd", "clevr_count"], f"not prepared in {data_dir}")
  text = command.table(accuracies, skipped, paper=command.PAPER["ViT-L_16"])
  assert f"| kitti_distance | Structured | {accuracies['kitti_distance']:.2f} | 79.9 |" in text
  assert "| dtd | Natural | — | 74.1 |" in text
  # Table 9's Specialized tasks: (82.5 + 95.6 + 85.2 + 75.3) / 4; the mean is Table 2's.
  assert "| **Specialized mean** (4 tasks) | | — | 84.65 |" in text
  assert "| **VTAB-1k mean** (19 tasks) | | — | 72.72 |" in text
  assert command.table(accuracies, skipped).splitlines()[2] == "| caltech101 | Natural | — |  |"
  assert text.splitlines()[-1] == f"- not prepared in {data_dir}: dtd, clevr_count"


def config_for(config, name: str):
  config = copy.deepcopy(config)
  vtab.apply_task(config, name)
  return config


def _gray_png(pixels: np.ndarray) -> io.BytesIO:
  out = io.BytesIO()
  Image.fromarray(pixels.astype(np.uint8)).save(out, format="PNG")
  out.seek(0)
  return out


def _read(data_dir: str, name: str) -> tuple[np.ndarray, np.ndarray]:
  """(encoded images, classes) of task ``name``'s whole tiny train split, as the run reads."""
  config = config_for(train_fixtures.common_config(data_dir=data_dir), name)
  config.train_split = config.test_split = "train"
  source = dataset.Dataset(data_settings.Settings.from_config(config)).split("train")
  return source.read(0, source.num_examples)


def test_derived_classes_from_the_real_builders_records(tmp_path):
  """CLEVR and dSprites prepared with their real features: the classes the run reads, and
  dSprites' 0/1 pixels read as 0/255."""
  data_dir = str(tmp_path)
  depths = (7.0, 8.2, 9.7)  # bins 0, 1 and 4 of CLEVR's closest distance

  def clevr(k, rng):
    objects = [
      {"3d_coords": [0.0] * 3, "color": 0, "material": 0, "rotation": 0.0, "shape": 0, "size": 1}
      for _ in range(3 + k)
    ]
    for i, o in enumerate(objects):
      o["pixel_coords"] = [1.0, 2.0, depths[k] + i]  # the first object the closest
    return {"file_name": f"{k}.png", "objects": objects, "question_answer": []}

  tiny_tfds.prepare("clevr", data_dir, {"train": 3}, clevr)
  _, count = _read(data_dir, "clevr_count")
  _, distance = _read(data_dir, "clevr_distance")
  assert sorted(zip(count.tolist(), distance.tolist())) == [(0, 0), (1, 1), (2, 4)]

  def dsprites(k, rng):
    values = dict.fromkeys(["value_orientation", "value_scale", "value_shape"], 0.0)
    values.update(value_x_position=0.0, value_y_position=0.0, label_scale=0, label_shape=0)
    values.update(label_y_position=0)
    image = _gray_png(rng.integers(0, 2, (64, 64)))  # dSprites' 0/1 pixels [64, 64]
    x, angle = (0, 10, 31)[k], (0, 20, 39)[k]
    return {**values, "image": image, "label_x_position": x, "label_orientation": angle}

  tiny_tfds.prepare("dsprites", data_dir, {"train": 3}, dsprites)
  images, location = _read(data_dir, "dsprites_location")
  _, orientation = _read(data_dir, "dsprites_orientation")
  assert sorted(zip(location.tolist(), orientation.tolist())) == [(0, 0), (5, 8), (15, 15)]
  assert set(np.unique(np.asarray(Image.open(io.BytesIO(images[0]))))) == {0, 255}


def test_every_tasks_classes_read_from_its_real_builders_features(tmp_path):
  """Each of the 16 builders prepared with its real features (every value random): each
  of the 19 tasks reads 4 classes below its count, a stored label's classes as stored."""
  data_dir, n = str(tmp_path), 4
  for tfds_name in dict.fromkeys(t.tfds_name for t in vtab.TASKS.values()):
    name, _, builder_config = tfds_name.partition("/")
    builder = tiny_tfds.prepare(name, data_dir, {"train": n}, config=builder_config or None)
    rng = np.random.default_rng(n)  # the examples `prepare` generated, in its order
    stored = [tiny_tfds.random_value(builder.info.features, rng) for _ in range(n)]
    for task_name, t in vtab.TASKS.items():
      if t.tfds_name != tfds_name:
        continue
      _, classes = _read(data_dir, task_name)
      assert len(classes) == n and 0 <= classes.min() <= classes.max() < t.num_classes, task_name
      if not t.derived:  # tfds stores the examples in its own order
        assert sorted(classes.tolist()) == sorted(e[t.label_key] for e in stored), task_name
