r"""Pre-training a ViT from scratch with the paper's upstream recipe (Sec. 4.1, App. B.1).

    python -m vit_jax.main --config=configs/pretrain.py:b16,imagenet21k \
        --config.data_dir=/path/to/tfds --workdir=/tmp/b16_i21k

The argument is ``<model>,<dataset>[,<epochs>]``: a short model name of `configs/vit.py`
(``b16``, ``l16``, ``r50_b16``, ``bit_r50x1``, ...), ``imagenet21k`` (90 epochs), ``imagenet2012``
(300 epochs) or ``jft300m`` (7 epochs; the paper's Table 6 also has 14), and the epochs
when not the dataset's. imagenet21k is not in the tfds catalog: see
`vit_jax/data/presets.py`. JFT-300M (303M images, 18,291 classes) is not public:
``jft300m`` is a planning preset (``python -m vit_jax.plan
--config=configs/pretrain.py:l16,jft300m,14 --topology=v3-256``); training with it stops
with one error line before anything is written.

Recipe: Adam (b1 0.9, b2 0.999) with decoupled weight decay 0.1, batch 4096, linear warm-up
of 10k steps then linear decay to 0, gradient clipping at global norm 1, resolution 224,
inception crop and flip, and for a ViT dropout 0.1 and the pre-training head: a
representation layer (``representation_size`` = width, tanh) before the classifier (a BiT
ResNet has neither). Steps are the epochs over
the preset's train split at batch 4096 (`TRAIN_IMAGES`; a copy of another size needs
``--config.total_steps``). Learning rate: 1e-3 for ImageNet-21k and 3e-3 for ImageNet,
as we read the paper's Table 3 for ViT-B (``--config.lr.base`` to change it). Fine-tune
the result with `configs/vit.py`
(``--config.pretrained=<workdir>/checkpoints``); its representation layer is dropped there.
"""

from __future__ import annotations

import math

import ml_collections

from configs import common, vit
from vit_jax import models

# Images in each preset's train split: ImageNet-21k (fall 2011 release, 14,197,122 images)
# minus the 51,200 held out for evaluation; ImageNet train[:99%] of 1,281,167; JFT-300M's
# 303M images (the paper, Sec. 4.1).
TRAIN_IMAGES: dict[str, int] = {
  "imagenet21k": 14_197_122 - 51_200,
  "imagenet2012": 1_268_355,
  "jft300m": 303_000_000,
}
EPOCHS: dict[str, int] = {"imagenet21k": 90, "imagenet2012": 300, "jft300m": 7}
LEARNING_RATES: dict[str, float] = {"imagenet21k": 1e-3, "imagenet2012": 3e-3, "jft300m": 8e-4}
BATCH = 4096
WARMUP_STEPS = 10_000
CROP = 224


def steps_for(dataset: str, batch: int = BATCH, epochs: int | None = None) -> int:
  """Optimizer steps for ``epochs`` (default: the paper's) over ``dataset``'s train split
  at ``batch``."""
  return math.ceil((epochs or EPOCHS[dataset]) * TRAIN_IMAGES[dataset] / batch)


def _split_epochs(arg: str | None) -> tuple[str | None, int | None]:
  """``'l16,jft300m,14'`` -> (``'l16,jft300m'``, 14); no third part -> (arg, None)."""
  parts = (arg or "").split(",")
  if len(parts) != 3:
    return arg, None
  text = parts[2].strip()
  if not text.isdigit() or int(text) < 1:
    raise ValueError(
      f"Config argument {arg!r}: the epochs {text!r} must be a positive integer, e.g. "
      "--config=configs/pretrain.py:l16,jft300m,14."
    )
  return ",".join(parts[:2]), int(text)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The pre-training config for ``arg`` = ``'<model>,<dataset>[,<epochs>]'`` (e.g.
  ``'b16,imagenet21k'``, ``'l16,jft300m,14'``)."""
  arg, epochs = _split_epochs(arg)
  model_name, dataset, preset = vit.parse_arg(arg, list(EPOCHS), "b16,imagenet21k")
  config = common.get_config()

  config.dataset = dataset
  config.train_split = preset.train_split
  config.test_split = preset.test_split
  config.num_classes = preset.num_classes
  config.pp.crop = CROP
  config.batch = BATCH
  config.batch_eval = 1024

  config.model = models.get_model_config(model_name)
  if not models.is_bit(config.model):  # the ResNet baselines have neither
    config.model.representation_size = config.model.hidden_size
    config.model.transformer.dropout_rate = 0.1

  config.total_steps = steps_for(dataset, epochs=epochs)
  config.lr.base = LEARNING_RATES[dataset]
  config.lr.warmup_steps = WARMUP_STEPS
  config.lr.decay = "linear"
  config.optim.name = "adamw"
  config.optim.weight_decay = 0.1

  config.log_every = 100
  config.eval_every = 10_000
  config.checkpoint_every = 2_000
  return config
