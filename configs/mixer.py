r"""Fine-tuning a pre-trained MLP-Mixer, as the official `mixer_base16_cifar10` config.

    python -m vit_jax.main --config=configs/mixer.py:b16,cifar10 \
        --config.pretrained=/path/to/Mixer-B_16.npz --workdir=/tmp/mixer_b16_cifar10

The argument is ``<model>,<dataset>``: ``b16``, ``b32`` or ``l16`` (`MODELS`) and a dataset
of `vit_jax.data.presets.PRESETS`. The recipe is `configs/vit.py`'s (the official common
one: SGD momentum 0.9, batch 512, clipping at norm 1, warm-up then cosine decay, lr 0.03,
the preset's steps: 10k for CIFAR-10, as the official config) at 224x224: the Mixer's
token-mixing MLP fixes the number of patches, so it fine-tunes at the resolution it was
pre-trained at (224 for every official Mixer checkpoint). ``--config.pretrained`` is an
official Mixer `.npz` (e.g. ``imagenet21k/Mixer-B_16.npz``), a timm ``mixer_*`` checkpoint
or ``hf-hub:timm/mixer_b16_224.goog_in21k``; the head is replaced by a zero one.
"""

from __future__ import annotations

import ml_collections

from configs import vit
from vit_jax import models

# Short name -> official name (vit_jax.models.MODEL_NAMES).
MODELS: dict[str, str] = {"b16": "Mixer-B_16", "b32": "Mixer-B_32", "l16": "Mixer-L_16"}
PRETRAINED_CROP = 224  # the official Mixer checkpoints' resolution (their token MLPs' size)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The fine-tuning config for ``arg`` = ``'<model>,<dataset>'`` (e.g. ``'b16,cifar10'``)."""
  short, _, dataset = (arg or "").partition(",")
  if short.strip().lower() not in MODELS:
    raise ValueError(
      f"Config argument {arg!r} must be '<model>,<dataset>' with a model of "
      f"{', '.join(MODELS)}, e.g. --config=configs/mixer.py:b16,cifar10."
    )
  config = vit.get_config(f"b16,{dataset}")  # the recipe, the dataset checked by name
  config.model = models.get_model_config(MODELS[short.strip().lower()])
  config.pp.crop = PRETRAINED_CROP
  return config
