r"""AugReg pre-training: "How to train your ViT? Data, Augmentation, and Regularization".

    python -m vit_jax.main --config=configs/augreg.py:b16,imagenet2012 \
        --config.data_dir=/path/to/tfds --workdir=/tmp/augreg_b16_i1k
    python -m vit_jax.main --config=configs/augreg.py:s16,imagenet21k,light1 ...
    python -m vit_jax.plan --config=configs/augreg.py:b16,imagenet2012 --topology=v3-32

The argument is ``<model>,<dataset>[,<setting>]``: a model AugReg trained (``ti16``,
``s32``, ``s16``, ``b32``, ``b16``, ``l16``), ``imagenet2012`` or ``imagenet21k``, and an
augmentation setting of `SETTINGS` (RandAugment layers and magnitude, Mixup p):

  none (-, 0), light1 ((2, 0), 0), light2 ((2, 10), 0.2), medium1 ((2, 15), 0.2),
  medium2 ((2, 15), 0.5), strong1 ((2, 20), 0.5), strong2 ((2, 20), 0.8).

Without a setting, big_vision's per-model default for the dataset (`DEFAULT_SETTINGS`).
Dropout and stochastic depth are 0, as big_vision's files; the paper also trained with
both at 0.1 (the ``do_0.1-sd_0.1`` checkpoints): ``--config.model.transformer.dropout_rate=0.1
--config.model.stoch_depth=0.1``.

Source: Steiner et al. (2021), arXiv:2106.10270, and its configs
``big_vision/configs/vit_i1k.py`` and ``vit_i21k.py``: batch 4096, 300 epochs, inception
crop 224 and flip, Adam (first moment in bfloat16), learning rate 1e-3 with 10k warm-up
steps then cosine to 0, gradient clipping at 1, decoupled weight decay 1e-4 per step on
the kernels (the checkpoints' ``wd_0.1``: big_vision does not scale it by the learning
rate, ``optim.weight_decay`` here is scaled, hence 0.1), sigmoid cross-entropy with the
head bias initialised to about -ln(classes), so that every class starts near probability
1/classes: -6.9 on ImageNet-1k, -10 on ImageNet-21k. ImageNet-1k: class token and a tanh
representation layer of the model's width; ImageNet-21k: global average pooling, no
representation layer.

Published: the paper's figures (accuracy per model, setting and epochs), and each run's
final accuracy in the released index of its checkpoints (the ``gs://vit_models/augreg``
bucket, e.g. ``S_16-i1k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0``).
docs/recipes.md plans them.
"""

from __future__ import annotations

import ml_collections

from configs import big_vision, common, vit
from vit_jax import models
from vit_jax.data import presets

# setting -> (RandAugment (layers, magnitude) or None, Mixup p): the paper's Table / big_vision.
SETTINGS: dict[str, tuple[tuple[int, int] | None, float]] = {
  "none": (None, 0.0),
  "light1": ((2, 0), 0.0),
  "light2": ((2, 10), 0.2),
  "medium1": ((2, 15), 0.2),
  "medium2": ((2, 15), 0.5),
  "strong1": ((2, 20), 0.5),
  "strong2": ((2, 20), 0.8),
}
# big_vision's default setting per model and dataset (vit_i1k.py, vit_i21k.py).
DEFAULT_SETTINGS: dict[str, dict[str, str]] = {
  "imagenet2012": dict(
    ti16="light1", s32="medium1", s16="medium2", b32="medium2", b16="medium2", l16="medium2"
  ),
  "imagenet21k": dict(
    ti16="none", s32="none", s16="light1", b32="light2", b16="light2", l16="medium2"
  ),
}
EPOCHS = 300
BATCH = 4096
HEAD_BIAS = {"imagenet2012": -6.9, "imagenet21k": -10.0}  # about -ln(classes)


def parse_arg(arg: str | None) -> tuple[str, str, str]:
  """``'b16,imagenet2012[,medium2]'`` -> (short model, dataset, setting); one error otherwise."""
  parts = [p.strip().lower() for p in (arg or "").split(",")]
  datasets = list(DEFAULT_SETTINGS)
  models_ = list(DEFAULT_SETTINGS["imagenet2012"])
  usage = (
    f"must be '<model>,<dataset>[,<setting>]', e.g. --config=configs/augreg.py:b16,imagenet2012. "
    f"Models: {', '.join(models_)}. Datasets: {', '.join(datasets)}. Settings: "
    f"{', '.join(SETTINGS)}."
  )
  if len(parts) not in (2, 3) or parts[0] not in models_ or parts[1] not in datasets:
    raise ValueError(f"Config argument {arg!r} {usage}")
  setting = parts[2] if len(parts) == 3 else DEFAULT_SETTINGS[parts[1]][parts[0]]
  if setting not in SETTINGS:
    raise ValueError(f"Config argument {arg!r}: unknown setting {setting!r}; it {usage}")
  return parts[0], parts[1], setting


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The AugReg config for ``arg`` = ``'<model>,<dataset>[,<setting>]'``."""
  short, dataset, setting = parse_arg(arg)
  preset = presets.PRESETS[dataset]
  config = common.get_config()

  config.dataset = dataset
  config.train_split = preset.train_split
  config.test_split = preset.test_split
  config.num_classes = preset.num_classes
  config.pp.randaug, config.mixup.p = SETTINGS[setting]

  config.model = models.get_model_config(vit.MODELS[short])
  config.loss = "sigmoid_xent"
  config.model.head_bias_init = HEAD_BIAS[dataset]
  if dataset == "imagenet2012":
    config.model.representation_size = config.model.hidden_size
  else:
    config.model.classifier = "gap"

  return big_vision.set_recipe(config, dataset=dataset, epochs=EPOCHS, batch=BATCH)
