r"""SigLIP: an image tower and a text tower trained from scratch with the sigmoid loss.

    python -m vit_jax.main --config=configs/siglip.py:digits --workdir=/tmp/siglip_digits
    python -m vit_jax.zeroshot --checkpoint=/tmp/siglip_digits --dataset=digits

``digits``: the quickstart's image model (configs/quickstart.py) and a 2-layer text tower
on the built-in digits captioned from their labels ("a photo of the digit seven.", 8
templates, `vit_jax.data.captions`), 1,000 steps, a few minutes on a CPU: zero-shot test
accuracy 98.15% (97.78-98.33% over seeds 0-2; docs/image_text.md).

``<image>,<text>,<dataset>`` (e.g. ``b16,B,cifar10``): a model of `configs/vit.py`'s
`MODELS`, a text tower size (S, B, L, So400m, g) and a dataset of
`vit_jax.data.presets.PRESETS`, captioned from its class names with CLIP's templates.

Recipe (big_vision's ``configs/proj/image_text/siglip_lit_coco.py`` and the SigLIP paper):
Adam with decoupled weight decay, lr 1e-3, weight decay 1e-4, cosine decay after a
warm-up of 3% of the steps (at least 100), gradient clipping at norm 1, 16 tokens per text,
temperature 10 and bias -10 at the start; batch 32k in the paper (here 4096 for
``<image>,<text>,<dataset>``, as big as a class-caption dataset makes sense of).
"""

from __future__ import annotations

import ml_collections

from configs import common, quickstart, vit
from vit_jax import models
from vit_jax.data import presets

TEXT_LEN = 16  # big_vision's token_len (64 for the multilingual and SigLIP 2 runs)


def _recipe(config: ml_collections.ConfigDict) -> None:
  config.objective = "contrastive"
  config.contrastive.loss = "sigmoid"
  config.optim.name = "adamw"
  config.optim.weight_decay = 1e-4
  config.optim.grad_clip_norm = 1.0
  config.lr.base = 1e-3
  config.lr.decay = "cosine"
  config.lr.warmup_steps = max(int(0.03 * config.total_steps), 100)


def digits_text() -> dict:
  """The digits runs' text tower: 2 layers of width 64 over the captions' few words."""
  return dict(width=64, depth=2, mlp_dim=128, num_heads=4, vocab_size=64, pool="gap")


def get_config(arg: str | None = "digits") -> ml_collections.ConfigDict:
  """``'digits'`` or ``'<image>,<text>,<dataset>'``."""
  if arg in (None, "digits"):
    config = quickstart.get_config()
    config.model = models.two_tower_config(
      config.model, text=digits_text(), text_len=TEXT_LEN, embed_dim=64, name="SigLIP-digits"
    )
    config.total_steps = 1_000
    _recipe(config)
    config.lr.base = 2e-3
    config.optim.weight_decay = 0.05  # the quickstart's, as the image tower is its model
    return config
  parts = [p.strip() for p in arg.split(",")]
  if len(parts) != 3:
    raise ValueError(f"Config argument {arg!r} must be 'digits' or '<image>,<text>,<dataset>'.")
  image, dataset, preset = vit.parse_arg(f"{parts[0]},{parts[2]}", list(presets.PRESETS), "")
  config = common.get_config()
  config.dataset, config.train_split, config.test_split = (
    dataset, preset.train_split, preset.test_split
  )  # fmt: skip
  config.num_classes = preset.num_classes  # the zero-shot classes (a plan reads no data)
  config.pp.crop = 224
  width = models.get_model_config(image).hidden_size
  config.model = models.two_tower_config(
    models.get_model_config(image), text=dict(size=parts[1]), text_len=TEXT_LEN,
    embed_dim=width, name=f"SigLIP-{image}-{parts[1]}",
  )  # fmt: skip
  config.contrastive.templates = "clip"
  config.batch = 4096
  config.total_steps = 10_000
  _recipe(config)
  return config
