r"""LiT: a pre-trained image tower, locked, and a text tower trained from scratch to read it.

    python -m vit_jax.main --config=configs/quickstart.py --workdir=/tmp/vit_quickstart
    python -m vit_jax.main --config=configs/lit.py:digits --workdir=/tmp/lit_digits \
        --config.pretrained=/tmp/vit_quickstart/checkpoints
    python -m vit_jax.zeroshot --checkpoint=/tmp/lit_digits --dataset=digits

``digits``: the quickstart's trained encoder (its model, any run of `configs/quickstart.py`)
locked, and the 2-layer text tower of `configs/siglip.py`, on the built-in digits
captioned from their labels, 1,000 steps: zero-shot test accuracy 98.89% (seeds 0-2, on the
seed-0 quickstart encoder, itself 99.17% supervised; docs/image_text.md).

``<image>,<text>,<dataset>`` (e.g. ``b16,B,cifar10``): a model of
`configs/vit.py`'s `MODELS` whose weights ``--config.pretrained`` names (any weights source:
``ViT-B_16``, a timm or Hugging Face checkpoint, a run's checkpoints), a text tower size and
a dataset of `vit_jax.data.presets.PRESETS`.

The image tower gets no gradient and no optimizer state (``config.contrastive.lock_image``),
so it ends the run exactly as it started; its projection to the shared width is trained
(big_vision's LiT configs either freeze an image head or project the text tower to the
image's width instead). Recipe: big_vision's ``configs/proj/image_text/siglip_lit_coco.py``
(the sigmoid loss, Adam, lr 1e-3, weight decay 1e-4 here, cosine after a 3% warm-up,
gradient clipping at 1, 16 tokens, temperature 10, bias -2.71 at the start).
"""

from __future__ import annotations

import ml_collections

from configs import siglip

BIAS_INIT = -2.71  # big_vision's siglip_lit_coco.py


def get_config(arg: str | None = "digits") -> ml_collections.ConfigDict:
  """``'digits'`` or ``'<image>,<text>,<dataset>'``; the image weights in config.pretrained."""
  config = siglip.get_config(arg)
  config.model.name = config.model.name.replace("SigLIP", "LiT")
  config.model.bias_init = BIAS_INIT
  config.contrastive.lock_image = True
  config.optim.weight_decay = 1e-4
  config.lr.base = 1e-3
  return config
