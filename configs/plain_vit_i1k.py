r"""ViT-S/16 from scratch on ImageNet-1k: "Better plain ViT baselines for ImageNet-1k".

    python -m vit_jax.main --config=configs/plain_vit_i1k.py:s16 \
        --config.data_dir=/path/to/tfds --workdir=/tmp/s16_i1k
    python -m vit_jax.main --config=configs/plain_vit_i1k.py:s16,300 ...   # 150 or 300 epochs
    python -m vit_jax.plan --config=configs/plain_vit_i1k.py:s16 --topology=v3-8

The argument is ``s16[,<epochs>]`` with epochs 90 (default), 150 or 300.

Source: Beyer, Zhai, Kolesnikov (2022), arXiv:2205.01580, and its config
``big_vision/configs/vit_s16_i1k.py``. Every hyper-parameter beside big_vision's:
docs/recipes.md. Recipe: batch 1024, inception crop 224 (5% minimum area), flip,
RandAugment(2, 10), Mixup p=0.2; ViT-S/16 with 2-D sin-cos position embeddings, global
average pooling and a tanh representation layer of the model's width; softmax
cross-entropy; Adam (b1 0.9, b2 0.999, first moment in bfloat16), learning rate 1e-3,
10k warm-up steps then cosine to 0, gradient clipping at global norm 1, decoupled weight
decay 1e-4 per step on the kernels (big_vision's ``wd``, not scaled by the learning rate:
``optim.weight_decay`` here is multiplied by it, hence 1e-4 / 1e-3 = 0.1).

Published (the paper, top-1 on the ImageNet validation set): 76.5% after
90 epochs, 78.5% after 150, 80.0% after 300; 90 epochs "in under seven hours on a
TPUv3-8" (big_vision's docstring: 6-7 h), 300 epochs under a day. Without RandAugment and
Mixup (``--config.pp.randaug=None --config.mixup.p=0``) 73.6% at 90 epochs. ImageNet ReaL
and ImageNet-V2 are evaluated beside the validation split, as big_vision's config does
(``real/accuracy``, ``v2/accuracy``; tfds ``imagenet2012_real`` and ``imagenet_v2`` prepared
in the same data_dir).
"""

from __future__ import annotations

import ml_collections

from configs import big_vision, common
from vit_jax import models
from vit_jax.data import presets

EPOCHS: tuple[int, ...] = (90, 150, 300)
BATCH = 1024
MODELS: dict[str, str] = {"s16": "ViT-S_16"}


def parse_arg(arg: str | None) -> tuple[str, int]:
  """``'s16[,90|150|300]'`` -> (official model name, epochs); one error otherwise."""
  parts = [p.strip().lower() for p in (arg or "s16").split(",")]
  model, epochs = parts[0], parts[1] if len(parts) > 1 else str(EPOCHS[0])
  if len(parts) > 2 or model not in MODELS or epochs not in {str(e) for e in EPOCHS}:
    raise ValueError(
      f"Config argument {arg!r} must be 's16[,<epochs>]' with epochs one of {EPOCHS}, e.g. "
      "--config=configs/plain_vit_i1k.py:s16,300."
    )
  return MODELS[model], int(epochs)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The plain-ViT ImageNet-1k config for ``arg`` = ``'s16[,<epochs>]'``."""
  model_name, epochs = parse_arg(arg)
  config = common.get_config()

  config.dataset = "imagenet2012"
  config.train_split = "train[:99%]"  # big_vision's; train[99%:] is its minival
  config.test_split = "validation"
  config.num_classes = 1000
  config.pp.randaug = (2, 10)
  config.evals.update(presets.IMAGENET_EVALS)  # ReaL and V2, as big_vision's config

  config.model = models.get_model_config(model_name)
  config.model.classifier = "gap"
  config.model.posemb = "sincos2d"
  config.model.representation_size = config.model.hidden_size

  config.loss = "softmax_xent"
  config.mixup.p = 0.2
  return big_vision.set_recipe(config, dataset="imagenet2012", epochs=epochs, batch=BATCH)
