"""Image-text probabilities of a two-tower model: each image against a list of texts.

    scores = TextScores(loaded, ["a dog", "a cat"])   # a `weights.LoadedModel`, its tokenizer
    probs = scores(images)                            # [B, H, W, 3] inputs -> [B, T]

As transformers' zero-shot image classification pipeline reports them: a model with a
logit bias (SigLIP) gives each text its own sigmoid probability, one without (CLIP) the
softmax over the texts. The texts are encoded once; every call runs one jitted function
over the images.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import models
from vit_jax.infra import errors
from vit_jax.models import two_tower
from vit_jax.models.naflex import NaFlexPatches

SIGMOID, SOFTMAX = "sigmoid", "softmax"


def texts_from(texts: str | None, texts_file: str | None) -> list[str]:
  """The texts of ``--texts`` ('a dog,a cat') and ``--texts_file`` (one per line)."""
  from vit_jax.infra import input_files  # pylint: disable=g-import-not-at-top

  found = [t.strip() for t in (texts or "").split(",") if t.strip()]
  if texts_file:
    text = input_files.read_text(texts_file, what="--texts_file")
    found += [line.strip() for line in text.splitlines() if line.strip()]
  return found


class TextScores:
  """[B, H, W, 3] model inputs (or NaFlex patches) -> [B, T] probabilities of ``texts``
  (module docstring)."""

  def __init__(self, loaded: Any, texts: Sequence[str]):
    if not models.is_two_tower(loaded.config):
      raise errors.CommandLineError(
        f"{loaded.source!r} is an image classifier, not an image-text model: texts score "
        "only with a two-tower checkpoint (a contrastive run, a SigLIP or CLIP folder)."
      )
    if loaded.tokenizer is None:
      raise errors.CheckpointError(
        f"{loaded.source!r} has no tokenizer: texts cannot be encoded for it."
      )
    if not texts:
      raise errors.CommandLineError("No texts to score: pass --texts='a dog,a cat'.")
    self.texts = list(texts)
    self.kind = SIGMOID if "b" in loaded.params else SOFTMAX
    module = loaded.module()
    params = jax.device_put(loaded.params)
    ids = jnp.asarray(loaded.tokenizer.encode(self.texts, loaded.config.text_len))  # [T, L]
    _, ztxt, _ = module.apply({"params": params}, None, ids)  # [T, E]
    normalize = jax.nn.sigmoid if self.kind == SIGMOID else jax.nn.softmax

    def probabilities(p: Any, x: jax.Array) -> jax.Array:
      zimg, _, out = module.apply({"params": p}, x, None)
      return normalize(two_tower.image_text_logits(zimg, ztxt, out))  # [B, T]

    self._params = params
    self._probabilities = jax.jit(probabilities)

  def __call__(self, images: np.ndarray | NaFlexPatches) -> np.ndarray:
    """[B, H, W, 3] model inputs, or the NaFlex patches of B images -> [B, T]."""
    if not isinstance(images, NaFlexPatches):
      images = jnp.asarray(images, jnp.float32)
    return np.asarray(self._probabilities(self._params, images))
