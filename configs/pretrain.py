r"""Pre-training a ViT from scratch with the paper's upstream recipe (Sec. 4.1, App. B.1).

    python -m vit_jax.main --config=configs/pretrain.py:b16,imagenet21k \
        --config.data_dir=/path/to/tfds --workdir=/tmp/b16_i21k

The argument is ``<model>,<dataset>``: a short model name of `configs/vit.py` (``b16``,
``l16``, ``r50_b16``, ``bit_r50x1``, ...) and ``imagenet21k`` (90 epochs) or ``imagenet2012``
(300 epochs). imagenet21k is not in the tfds catalog: see `vit_jax/data/presets.py`.

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
# minus the 51,200 held out for evaluation; ImageNet train[:99%] of 1,281,167.
TRAIN_IMAGES: dict[str, int] = {"imagenet21k": 14_197_122 - 51_200, "imagenet2012": 1_268_355}
EPOCHS: dict[str, int] = {"imagenet21k": 90, "imagenet2012": 300}
LEARNING_RATES: dict[str, float] = {"imagenet21k": 1e-3, "imagenet2012": 3e-3}
BATCH = 4096
WARMUP_STEPS = 10_000
CROP = 224


def steps_for(dataset: str, batch: int = BATCH) -> int:
  """Optimizer steps for the paper's epochs over ``dataset``'s train split at ``batch``."""
  return math.ceil(EPOCHS[dataset] * TRAIN_IMAGES[dataset] / batch)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The pre-training config for ``arg`` = ``'<model>,<dataset>'`` (e.g. ``'b16,imagenet21k'``)."""
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

  config.total_steps = steps_for(dataset)
  config.lr.base = LEARNING_RATES[dataset]
  config.lr.warmup_steps = WARMUP_STEPS
  config.lr.decay = "linear"
  config.optim.name = "adamw"
  config.optim.weight_decay = 0.1

  config.log_every = 100
  config.eval_every = 10_000
  config.checkpoint_every = 2_000
  return config
