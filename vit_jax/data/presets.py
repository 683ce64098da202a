"""Per-dataset defaults for fine-tuning and pre-training, as in the ViT paper.

Plain values, read by the experiment configs; the pipeline itself never looks here.
Why in the package and not in `configs/` (which holds this repository's experiment files):
what a user of the installed package needs without the checkout belongs in the package,
and a user's own config or notebook needs a dataset's class count, official splits and
resolution as much as our experiment files do.

  * Splits: the official evaluation splits, with a small slice of train held out
    for model selection where the paper does (CIFAR 2%, ImageNet 1%, Pets 10%).
  * crop: 384 for fine-tuning (the paper fine-tunes at higher resolution than it
    pre-trains), 224 for ImageNet-21k pre-training, 32 for the built-in digits.
  * total_steps: the paper's fine-tuning schedules at batch 512 (ImageNet 20k steps,
    CIFAR 10k, Pets and Flowers 500); ImageNet-21k: 90 epochs of pre-training at
    batch 4096 (14.1M images / 4096 * 90 ~ 310k steps).
  * imagenet21k is not in the tfds catalog: provide a tfds builder named
    'imagenet21k' with one 'full' split (the first 51,200 examples are held out for
    evaluation, as in big_vision), or an image folder with the same slicing.
  * jft300m (303M images, 18,291 classes; the paper's main pre-training data) is not
    public: its preset plans the paper's runs (`python -m vit_jax.plan`) and is in
    `PLANNING_ONLY`, so a run that would read it stops before anything is written.
    total_steps: 7 epochs at batch 4096.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Preset:
  num_classes: int
  train_split: str
  test_split: str
  crop: int
  total_steps: int


PRESETS: dict[str, Preset] = {
  "cifar10": Preset(10, "train[:98%]", "test", 384, 10_000),
  "cifar100": Preset(100, "train[:98%]", "test", 384, 10_000),
  "imagenet2012": Preset(1000, "train[:99%]", "validation", 384, 20_000),
  "imagenet21k": Preset(21843, "full[51200:]", "full[:51200]", 224, 310_000),
  "jft300m": Preset(18291, "train", "test", 224, 517_823),
  "oxford_iiit_pet": Preset(37, "train[:90%]", "test", 384, 500),
  "oxford_flowers102": Preset(102, "train", "test", 384, 500),
  "digits": Preset(10, "train", "test", 32, 1_000),
}

# ImageNet's other test sets, as evaluation instances (config.evals,
# `vit_jax.run.evaluators.instances`) of a run with ImageNet's 1000 classes: ReaL (the
# validation images' re-assessed label sets; tfds imagenet2012_real) and ImageNet-V2
# (tfds imagenet_v2, its default matched-frequency test set), as big_vision's ImageNet
# configs evaluate them beside the validation split.
IMAGENET_EVALS: dict[str, dict[str, str]] = {
  "real": dict(
    kind="real", dataset="imagenet2012_real", split="validation", label_key="original_label"
  ),
  "v2": dict(dataset="imagenet_v2", split="test"),
}

# Presets of data that is not public: they size a plan, never a run (`data.dataset`).
PLANNING_ONLY: frozenset[str] = frozenset({"jft300m"})
