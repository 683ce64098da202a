"""VTAB-1k (Zhai et al. 2019): its 19 tasks as tfds datasets, their 1k splits, and groups.

Each task as the benchmark's own code defines it (google-research/task_adaptation,
``task_adaptation/data/*.py`` and ``scripts/run_all_tasks.sh``): the tfds name and
config, the feature read as the label, the class count, and where its splits come from.
The 1k splits, as there: ``train800`` the first 800 examples of the train split,
``val200`` the first 200 of the validation split (for tasks without one, the examples of
train after the task's train share, e.g. ``train[2754:2954]`` of Caltech-101's 3,060),
``train800val200`` both (the final run's 1,000), ``test`` the task's test split. A share of
a split is VTAB's ``percent * size // 100`` of the tfds split's size (`Task.train_size`,
checked against the prepared data before a run).

Five tasks derive their class from other features (CLEVR's object count and closest
distance, KITTI's closest vehicle, dSprites' binned position and orientation), as
task_adaptation's preprocessing functions do: `DERIVED_LABELS`, read from the prepared
records' features by the pipeline (``config.label_key`` = the task's name).

dSprites' images are stored as 0/1 values, which task_adaptation multiplies by 255: the
pipeline reads them scaled alike (`IMAGE_SCALES`, `scaled_png`).
"""

from __future__ import annotations

import dataclasses
import io
import math
from typing import Any, Callable, Mapping, Optional

import ml_collections
import numpy as np

from vit_jax.infra import errors

NATURAL, SPECIALIZED, STRUCTURED = "Natural", "Specialized", "Structured"
GROUPS = (NATURAL, SPECIALIZED, STRUCTURED)
SPLITS = ("train800", "val200", "train800val200", "test")


@dataclasses.dataclass(frozen=True)
class Task:
  """One VTAB-1k task: where its data and labels are and how its 1k splits are cut."""

  tfds_name: str  # with the tfds config where the task uses one
  group: str  # NATURAL, SPECIALIZED or STRUCTURED
  num_classes: int
  label_key: str = "label"  # the ClassLabel feature read as the class (derived: its source)
  # The validation examples: a tfds split's name, or the percent of train where they start.
  val: str | int = "validation"
  test: str = "test"  # the test split string (absolute where VTAB cuts it from train)
  train_size: Optional[int] = None  # the train split's size where `val` is a percent
  derived: Optional[str] = None  # how the class is derived when no feature holds it

  def split(self, name: str) -> str:
    """The tfds split string of a 1k split (`SPLITS`)."""
    if isinstance(self.val, int):
      start = self.val * self.train_size // 100
      val200 = f"train[{start}:{start + 200}]"
    else:
      val200 = f"{self.val}[:200]"
    strings = {
      "train800": "train[:800]",
      "val200": val200,
      "train800val200": f"train[:800]+{val200}",
      "test": self.test,
    }
    if name not in strings:
      raise errors.ConfigError(f"VTAB split {name!r} is not one of {SPLITS}.")
    return strings[name]


Features = Mapping[str, Any]  # a serialized tf.train.Example's {key: Feature}


def _floats(features: Features, key: str) -> np.ndarray:
  return np.asarray(features[key].float_list.value if key in features else (), np.float32)


def _ints(features: Features, key: str) -> np.ndarray:
  return np.asarray(features[key].int64_list.value if key in features else (), np.int64)


def _bin(value: float, thresholds: tuple[float, ...]) -> int:
  """The last bin whose lower threshold is below ``value`` (task_adaptation's
  ``reduce_max(where(thresholds - value < 0))``)."""
  return int(np.flatnonzero(np.asarray(thresholds) < value).max())


def clevr_count(features: Features) -> int:
  """CLEVR count_all: the number of objects (3..10) less 3."""
  return len(_ints(features, "objects/size")) - 3


def clevr_distance(features: Features) -> int:
  """CLEVR closest_object_distance: the smallest depth of an object's pixel coordinates
  ([N, 3] flattened: x, y, depth), in 6 bins."""
  depth = _floats(features, "objects/pixel_coords")[2::3].min()
  return _bin(float(depth), (0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0))


def kitti_distance(features: Features) -> int:
  """KITTI closest_vehicle_distance: the smallest depth (location [N, 3], z) of a car, van
  or truck (types 0..2), 1000 without one, in 4 bins."""
  types, depth = _ints(features, "objects/type"), _floats(features, "objects/location")[2::3]
  nearest = min([1000.0, *depth[types < 3].tolist()])
  return _bin(nearest, (-100.0, 8.0, 20.0, 999.0))


def _dsprites(key: str, factor: float) -> Callable[[Features], int]:
  def label(features: Features) -> int:
    return int(math.floor(float(_ints(features, key)[0]) / factor))

  label.__doc__ = f"dSprites {key} // {factor} (16 bins)."
  return label


# tfds datasets whose stored pixel values are scaled before decoding: dSprites' 0/1 images.
IMAGE_SCALES: dict[str, int] = {"dsprites": 255}


def scaled_png(data: bytes, factor: int) -> bytes:
  """A PNG's pixel values times ``factor`` (clipped to 255), PNG-encoded again."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  pixels = np.asarray(Image.open(io.BytesIO(data)), np.uint16) * factor  # [H, W(, C)]
  out = io.BytesIO()
  Image.fromarray(np.minimum(pixels, 255).astype(np.uint8)).save(out, format="PNG")
  return out.getvalue()


# config.label_key of a task whose class is derived -> the class of an example's features.
DERIVED_LABELS: dict[str, Callable[[Features], int]] = {
  "clevr_count": clevr_count,
  "clevr_distance": clevr_distance,
  "kitti_distance": kitti_distance,
  "dsprites_location": _dsprites("label_x_position", 32 / 16),
  "dsprites_orientation": _dsprites("label_orientation", 40 / 16),
}


# In the paper's order (ViT, Table 9; VTAB's own): Natural, Specialized, Structured.
TASKS: dict[str, Task] = {
  "caltech101": Task("caltech101", NATURAL, 102, val=90, train_size=3060),
  "cifar100": Task("cifar100", NATURAL, 100, val=90, train_size=50_000),
  "dtd": Task("dtd", NATURAL, 47),
  "oxford_flowers102": Task("oxford_flowers102", NATURAL, 102),
  "oxford_iiit_pet": Task("oxford_iiit_pet", NATURAL, 37, val=80, train_size=3680),
  "sun397": Task("sun397/tfds", NATURAL, 397),
  "svhn": Task("svhn_cropped", NATURAL, 10, val=90, train_size=73_257),
  "patch_camelyon": Task("patch_camelyon", SPECIALIZED, 2),
  "eurosat": Task("eurosat/rgb", SPECIALIZED, 10, val=60, test="train[21600:]", train_size=27_000),
  "resisc45": Task("resisc45", SPECIALIZED, 45, val=60, test="train[25200:]", train_size=31_500),
  "diabetic_retinopathy": Task("diabetic_retinopathy_detection/btgraham-300", SPECIALIZED, 5),
  "clevr_count": Task(
    "clevr",
    STRUCTURED,
    8,
    "objects",
    val=90,
    test="validation",
    train_size=70_000,
    derived="the number of objects less 3 (objects/size)",
  ),
  "clevr_distance": Task(
    "clevr",
    STRUCTURED,
    6,
    "objects",
    val=90,
    test="validation",
    train_size=70_000,
    derived="the closest object's depth (objects/pixel_coords), in 6 bins",
  ),
  "dmlab": Task("dmlab", STRUCTURED, 6),
  "dsprites_location": Task(
    "dsprites",
    STRUCTURED,
    16,
    "label_x_position",
    val=80,
    test="train[663552:]",
    train_size=737_280,
    derived="label_x_position // 2 (32 positions in 16 bins)",
  ),
  "dsprites_orientation": Task(
    "dsprites",
    STRUCTURED,
    16,
    "label_orientation",
    val=80,
    test="train[663552:]",
    train_size=737_280,
    derived="label_orientation // 2.5 (40 angles in 16 bins)",
  ),
  "kitti_distance": Task(
    "kitti",
    STRUCTURED,
    4,
    "objects",
    derived="the closest vehicle's distance (objects/location), in 4 bins",
  ),
  "smallnorb_azimuth": Task(
    "smallnorb", STRUCTURED, 18, "label_azimuth", val="test", test="test[12150:]"
  ),
  "smallnorb_elevation": Task(
    "smallnorb", STRUCTURED, 9, "label_elevation", val="test", test="test[12150:]"
  ),
}


def task(name: str) -> Task:
  """The task of ``name``; one error line naming the 19 otherwise."""
  if name not in TASKS:
    raise errors.ConfigError(f"Unknown VTAB task {name!r}: use one of {', '.join(TASKS)}.")
  return TASKS[name]


def check_sizes(name: str, sizes: Mapping[str, int]) -> None:
  """The prepared train split has the size the task's shares were cut from."""
  expected = TASKS[name].train_size
  if expected is not None and sizes.get("train") != expected:
    raise errors.ConfigError(
      f"VTAB task {name!r}: the prepared {TASKS[name].tfds_name} has {sizes.get('train')} "
      f"train examples, not the {expected} its 1k splits are cut from: prepare the tfds "
      "version VTAB uses."
    )


def group_means(accuracies: Mapping[str, float]) -> dict[str, float]:
  """{group: mean over its tasks, 'Mean': mean over the 19} of per-task ``accuracies``; a
  mean is left out when a task of it is missing (a partial mean would not compare)."""
  out = {}
  for group in GROUPS:
    names = [n for n, t in TASKS.items() if t.group == group]
    if all(n in accuracies for n in names):
      out[group] = sum(accuracies[n] for n in names) / len(names)
  if all(n in accuracies for n in TASKS):
    out["Mean"] = sum(accuracies[n] for n in TASKS) / len(TASKS)
  return out


def apply_task(config: ml_collections.ConfigDict, name: str, sweep: bool = False) -> None:
  """Sets the data keys of a run ``config`` to task ``name``: trains on train800val200 and
  tests on the test split (``sweep``: trains on train800 and tests on val200, VTAB's
  hyper-parameter selection). No flip and no random crop: several structured tasks' labels
  are positions and orientations that they would change."""
  t = task(name)
  config.dataset = t.tfds_name
  config.label_key = name if t.derived else t.label_key  # derived: `DERIVED_LABELS`
  config.num_classes = t.num_classes
  config.train_split = t.split("train800" if sweep else "train800val200")
  config.test_split = t.split("val200" if sweep else "test")
  config.pp.flip = False
  config.pp.min_area = 1.0
