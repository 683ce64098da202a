"""The run configs the check times, and its shapes; also a config file for the plan:

    python -m vit_jax.plan --topology=h100x1 \
        --config=benchmarks/gpu_check/config.py:ViT-B_16,256,default
    python -m vit_jax.plan --topology=h200x1 --config=benchmarks/gpu_check/config.py:randaug

``default`` leaves ``config.model.attention_impl`` and ``config.model.dtype`` unset, as a
user's config does: the run takes its backend's choice (`vit_jax.models.backend_defaults`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(BENCHMARKS)
sys.path.insert(0, BENCHMARKS)
from speed_config import speed_config  # noqa: E402  (a script of `benchmarks/`)

DEFAULT = "default"  # an attention (and dtype) left unset
RESOLUTION = 224
NUM_CLASSES = 1000
TIMED_STEPS = 20
WARMUP_STEPS = 3
# --smoke: every row on the CPU with a 1-layer, 32-wide model at 32x32 (`smoke_model`).
SMOKE = dict(resolution=32, batch=4, steps=2, warmup=1)
RANDAUG = (2, 10)  # the RandAugment row's config.pp.randaug (layers, magnitude)
MIXUP_P = 0.8  # and its config.mixup.p
# `get_config`'s names of the rows that are not "model,batch,attention".
RANDAUG_ROW, SIGLIP_ROW = "randaug", "siglip"


def smoke_model(model: Any) -> Any:
  """A tiny model of the same family: a ViT of 1 layer, width 32, 2 heads of 16, patches
  16; a two-tower model's text tower of 1 layer, width 32, 100 tokens."""
  image = model.image if "image" in model else model
  image.hidden_size = 32
  image.transformer.num_layers = 1
  image.transformer.num_heads = 2
  image.transformer.mlp_dim = 64
  if "text" in model:
    model.text = dict(width=32, depth=1, mlp_dim=64, num_heads=2, vocab_size=100)
    model.embed_dim = 32
  return model


def get_config(arg: str = "ViT-B_16,256,default") -> Any:
  """The run config of a train row, "model,batch,attention": AdamW, no dropout; a named
  attention ('einsum', 'xla', 'cudnn') computes in bf16, `DEFAULT` leaves both unset.
  `RANDAUG_ROW` and `SIGLIP_ROW` name those rows' configs at batch 256."""
  if arg in (RANDAUG_ROW, SIGLIP_ROW):
    return randaug_config(256) if arg == RANDAUG_ROW else siglip_config(256)
  model, batch, attention = arg.split(",")
  unset = attention == DEFAULT
  config = speed_config(
    model,
    int(batch),
    RESOLUTION,
    dtype=None if unset else "bfloat16",
    attention=None if unset else attention,
  )
  config.optim.name = "adamw"
  config.optim.weight_decay = 0.05
  return config


def randaug_config(batch: int) -> Any:
  """ViT-B/16's default train row with RandAugment `RANDAUG` and Mixup `MIXUP_P`: the
  same step otherwise (the images come as 0..255 values; the step augments them)."""
  config = get_config(f"ViT-B_16,{batch},{DEFAULT}")
  config.pp.randaug = RANDAUG
  config.mixup.p = MIXUP_P
  return config


def siglip_config(batch: int) -> Any:
  """SigLIP B/16 (`configs/siglip.py`: both towers, sigmoid loss) at ``batch``, the
  attention and dtype unset."""
  from configs import siglip  # pylint: disable=g-import-not-at-top

  config = siglip.get_config("b16,B,imagenet2012")
  config.batch = config.batch_eval = batch
  config.model.image.transformer.dropout_rate = 0.0
  return config
