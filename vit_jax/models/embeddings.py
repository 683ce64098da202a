"""The token sequence before the encoder: patch embeddings and the prefix tokens.

Functions called inside `VisionTransformer`'s compact ``__call__``, so the parameters they
declare sit at the model's top level with the official names (``embedding``, ``cls``)
and, for the later members of the family, ``registers``.

Prefix order, as timm's: [class token, registers..., patches...]. Register tokens
(Darcet et al. 2024) are learned tokens that take part in attention and are dropped at
pooling; whether the position embeddings cover the prefix tokens is the encoder's
business (`vit_jax.models.posemb.AddPositionEmbs`, ``embed_prefix``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.infra.sharding import EMBED
from vit_jax.models.layers import partitioned

CLASS_TOKEN = "cls"
REGISTERS = "registers"


def patch_embedding(
  x: jax.Array,
  hidden_size: int,
  patch_size: tuple[int, int],
  dtype: jnp.dtype,
  param_dtype: jnp.dtype,
  name: str = "embedding",
  use_bias: bool = True,
) -> jax.Array:
  """[B, H, W, C] -> [B, gh, gw, D]: the non-overlapping patches, linearly embedded
  (``name``: the ViT's ``embedding``, the Mixer's ``stem``)."""
  return nn.Conv(
    hidden_size,
    patch_size,
    strides=patch_size,
    padding="VALID",
    use_bias=use_bias,
    dtype=dtype,
    param_dtype=param_dtype,
    name=name,
    kernel_init=partitioned(nn.initializers.lecun_normal(), (None, None, None, EMBED)),
    bias_init=partitioned(nn.initializers.zeros, (EMBED,)),
  )(x)


def prepend_prefix_tokens(
  module: nn.Module,
  x: jax.Array,
  class_token: bool,
  num_registers: int,
  param_dtype: jnp.dtype,
) -> jax.Array:
  """[B, N, D] -> [B, P + N, D] with P = class token + registers, declared on ``module``.

  The class token starts at zero (the official init); registers at N(0, 0.02^2) so that
  they differ from each other from the first step.
  """
  b, _, d = x.shape
  prefix = []
  if class_token:
    axes = (None, None, EMBED)
    prefix.append(
      module.param(CLASS_TOKEN, partitioned(nn.initializers.zeros, axes), (1, 1, d), param_dtype)
    )
  if num_registers:
    init = partitioned(nn.initializers.normal(stddev=0.02), (None, None, EMBED))
    prefix.append(module.param(REGISTERS, init, (1, num_registers, d), param_dtype))
  if not prefix:
    return x
  tokens = [jnp.broadcast_to(p.astype(x.dtype), (b, *p.shape[1:])) for p in prefix]
  return jnp.concatenate([*tokens, x], axis=1)
