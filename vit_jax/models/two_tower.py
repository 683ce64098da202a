"""An image-text model: any image model of the package beside a text tower, both projected
to a shared width and L2-normalised, with a learned temperature and (SigLIP) bias.

Follows big_vision's ``proj/image_text/two_towers.py``: parameters ``img`` (the image
model's own tree), ``txt`` (`vit_jax.models.text`), ``t`` (the log temperature, [1]) and,
with a bias, ``b`` ([1]); outputs ``t = exp(t)``. SigLIP initialises t = log 10, b = -10;
CLIP t = log(1 / 0.07) and no bias (`SIGLIP_INIT`, `CLIP_INIT`). Where big_vision builds
the image model with its classifier as the projection (initialised non-zero), here the
image model stays a feature extractor of any family (``num_classes=None``) and the
projection is this model's own ``img_head`` (LeCun normal, as big_vision's non-zero
heads): a zero projection would give zero embeddings, whose normalisation has no gradient.

    model = TwoTower(img=create_model(image_config, num_classes=None), txt=TextTransformer(
        TextSettings.named("B", vocab_size=32_000), num_classes=E), embed_dim=E)
    zimg, ztxt, out = model.apply(variables, images, ids)   # [B, E], [B, E], {'t', 'b'}

``image_head`` says what projects the image features: 'dense' (``img_head``, the default),
'linear' (``img_head`` without bias: CLIP's ``visual_projection``) or 'none' (the features
are the embedding, their width ``embed_dim``: transformers' SigLIP, whose image tower ends
in its attention pooling, and big_vision's ``out_dim=(None, E)``).

Either input may be None (image features alone for few-shot, text alone for class
prompts); the other embedding is then None. ``image_features`` [B, D] in place of images
skips the image model (a LiT run's cached features of its locked tower: `run.feature_cache`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models.text import TextTransformer

_EPSILON = 1e-8  # big_vision's, in the normalisation's denominator
IMAGE_HEADS = ("dense", "linear", "none")


@dataclasses.dataclass(frozen=True)
class ContrastiveInit:
  """The initial temperature and bias (None: no bias parameter)."""

  temperature: float
  bias: Optional[float]


SIGLIP_INIT = ContrastiveInit(temperature=10.0, bias=-10.0)
CLIP_INIT = ContrastiveInit(temperature=1 / 0.07, bias=None)
# A contrastive loss's name (config.contrastive.loss) -> the values its models start from.
LOSS_INIT: dict[str, ContrastiveInit] = {"sigmoid": SIGLIP_INIT, "softmax": CLIP_INIT}


def normalize(z: jax.Array) -> jax.Array:
  """Rows of [B, E] to unit length."""
  return z / (jnp.linalg.norm(z, axis=-1, keepdims=True) + _EPSILON)


class TwoTower(nn.Module):
  """``img``: an image model giving features [B, D] (built with ``num_classes=None``);
  ``txt``: a `TextTransformer` with ``num_classes=embed_dim``; ``embed_dim``: the shared
  width E. (The fields' names are the parameter trees'.)"""

  img: nn.Module
  txt: TextTransformer
  embed_dim: int
  contrastive_init: ContrastiveInit = SIGLIP_INIT
  image_head: str = "dense"  # `IMAGE_HEADS`

  @nn.compact
  def __call__(
    self,
    images: Optional[jax.Array],
    ids: Optional[jax.Array],
    *,
    train: bool = False,
    image_features: Optional[jax.Array] = None,
  ) -> tuple[Optional[jax.Array], Optional[jax.Array], dict[str, jax.Array]]:
    zimg = ztxt = None
    if images is not None or image_features is not None:
      features = self.img(images, train=train) if image_features is None else image_features
      zimg = features.astype(jnp.float32)  # [B, D]
      if self.image_head != "none":
        head = nn.Dense(self.embed_dim, use_bias=self.image_head == "dense", name="img_head")
        zimg = head(zimg)
      zimg = normalize(zimg)  # [B, E]
    if ids is not None:
      ztxt = normalize(self.txt(ids, train=train)[0])
    log_t = math.log(self.contrastive_init.temperature)
    t = self.param("t", lambda _, shape: jnp.full(shape, log_t, jnp.float32), (1,))
    out = {"t": jnp.exp(t[0])}
    if self.contrastive_init.bias is not None:
      bias = self.contrastive_init.bias
      out["b"] = self.param("b", lambda _, shape: jnp.full(shape, bias, jnp.float32), (1,))[0]
    return zimg, ztxt, out


def zero_shot_logits(zimg: jax.Array, zclasses: jax.Array, temperature: jax.Array) -> jax.Array:
  """[B, E] image embeddings against [K, E] class embeddings (each the normalised mean of
  its prompts' text embeddings) -> [B, K] logits."""
  return temperature * zimg @ normalize(zclasses).T


def image_text_logits(zimg: jax.Array, ztxt: jax.Array, out: dict[str, jax.Array]) -> jax.Array:
  """[B, E] image and [T, E] text embeddings -> [B, T] logits, t * zimg . ztxt + b
  (transformers' ``logits_per_image``): SigLIP's probabilities are their sigmoid, CLIP's
  the softmax over the texts."""
  logits = out["t"] * zimg @ ztxt.T
  return logits + out["b"] if "b" in out else logits
