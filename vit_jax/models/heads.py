"""What turns the encoder's tokens into logits: pooling, optional norm and representation
layer, the linear head.

Pooling (``classifier``):
  * ``token``: the class token (the official model);
  * ``gap``: the mean of the patch tokens (prefix tokens excluded, as timm);
  * ``map``: multi-head attention pooling with a learned probe (big_vision's and SigLIP's
    ``MAPHead``; parameters ``MAPHead_0/{probe, MultiHeadDotProductAttention_0/{query,
    key, value, out}, LayerNorm_0, MlpBlock_0}``, big_vision's names). As timm's ViT the
    probe attends to the patch tokens only; as timm's Eva (Perception Encoder,
    ``map_include_prefix``) to the class token too, with heads and MLP width of its own;
  * ``unpooled``: every token.
The encoder's final norm comes before pooling; with ``fc_norm`` (timm's) the encoder has
none and a LayerNorm named ``fc_norm`` follows the pooling instead; with ``final_norm``
False there is neither (Perception Encoder's spatial and language towers).

The functions declare their parameters on the calling module (`VisionTransformer`), so
``pre_logits``, ``head`` and ``fc_norm`` sit at its top level.
"""

from __future__ import annotations

import functools
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.infra import errors
from vit_jax.infra.sharding import EMBED, HEADS, KV
from vit_jax.models.execution import ExecutionOptions
from vit_jax.models.layers import MlpBlock, layer_norm, partitioned

TOKEN, GAP, MAP, UNPOOLED = "token", "gap", "map", "unpooled"
POOLINGS: tuple[str, ...] = (TOKEN, GAP, MAP)
CLASSIFIERS: tuple[str, ...] = (*POOLINGS, UNPOOLED)
FC_NORM = "fc_norm"
MAP_HEAD = "MAPHead_0"


class _ProbeAttention(nn.Module):
  """Multi-head attention of a few query tokens to [B, N, D] tokens, with flax's
  `nn.MultiHeadDotProductAttention` parameter layout (query/key/value [D, H, Dh], out
  [H, Dh, D]) and its 1/sqrt(Dh) scaling."""

  num_heads: int
  execution: ExecutionOptions

  @nn.compact
  def __call__(
    self, queries: jax.Array, x: jax.Array, mask: Optional[jax.Array] = None
  ) -> jax.Array:
    ex = self.execution
    d = x.shape[-1]
    h = self.num_heads
    dense = functools.partial(
      nn.DenseGeneral,
      dtype=ex.dtype,
      param_dtype=ex.param_dtype,
      kernel_init=partitioned(nn.initializers.xavier_uniform(), (EMBED, HEADS, KV)),
      bias_init=partitioned(nn.initializers.zeros, (HEADS, KV)),
    )
    q = dense((h, d // h), name="query")(queries)  # [B, Q, H, Dh]
    k = dense((h, d // h), name="key")(x)  # [B, N, H, Dh]
    v = dense((h, d // h), name="value")(x)  # [B, N, H, Dh]
    q = q / jnp.sqrt(d // h).astype(q.dtype)
    logits = jnp.einsum("bqhk,bnhk->bhqn", q, k).astype(jnp.float32)  # [B, H, Q, N]
    if mask is not None:  # [B, N]: the keys that may be attended to
      logits = jnp.where(mask[:, None, None, :], logits, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(logits, axis=-1).astype(ex.dtype)
    y = jnp.einsum("bhqn,bnhk->bqhk", weights, v)  # [B, Q, H, Dh]
    return nn.DenseGeneral(
      d,
      axis=(-2, -1),
      dtype=ex.dtype,
      param_dtype=ex.param_dtype,
      kernel_init=partitioned(nn.initializers.xavier_uniform(), (HEADS, KV, EMBED)),
      bias_init=partitioned(nn.initializers.zeros, (EMBED,)),
      name="out",
    )(y)  # [B, Q, D]


class MAPHead(nn.Module):
  """Multi-head attention pooling (Lee et al. 2019; big_vision's ``MAPHead``): a learned
  probe attends to the tokens, then a residual MLP on its LayerNorm. [B, N, D] -> [B, D]."""

  num_heads: int
  mlp_dim: int
  gelu_approximate: bool
  activation: str
  layer_norm_epsilon: float
  execution: ExecutionOptions

  @nn.compact
  def __call__(self, x: jax.Array, mask: Optional[jax.Array] = None) -> jax.Array:
    """``mask`` [B, N]: the tokens the probe may attend to (None: all)."""
    ex = self.execution
    b, _, d = x.shape
    init = partitioned(nn.initializers.xavier_uniform(), (None, None, EMBED))
    probe = self.param("probe", init, (1, 1, d), ex.param_dtype)
    probe = jnp.broadcast_to(probe.astype(ex.dtype), (b, 1, d))
    x = _ProbeAttention(self.num_heads, ex, name="MultiHeadDotProductAttention_0")(probe, x, mask)
    y = layer_norm("LayerNorm_0", self.layer_norm_epsilon, ex.dtype, ex.param_dtype)(x)
    mlp = MlpBlock(self.mlp_dim, self.gelu_approximate, ex, self.activation, name="MlpBlock_0")
    x = x + mlp(y, deterministic=True)  # [B, 1, D]
    return x[:, 0]  # [B, D]


def pool(
  x: jax.Array,
  classifier: str,
  num_prefix: int,
  map_head: Optional[MAPHead],
  map_skips: Optional[int] = None,
  mask: Optional[jax.Array] = None,
) -> jax.Array:
  """[B, P + N, D] -> [B, D] (``unpooled``: unchanged), P the prefix tokens; the MAP head
  attends to the tokens after the first ``map_skips`` (None: the patches, P skipped).
  ``mask`` [B, N]: the patches that are real (NaFlex padding left out of GAP and MAP)."""
  if classifier == TOKEN:
    return x[:, 0]
  if classifier == GAP:
    if mask is None:
      return jnp.mean(x[:, num_prefix:], axis=1)
    weights = mask[..., None].astype(x.dtype)  # [B, N, 1]
    return jnp.sum(x[:, num_prefix:] * weights, axis=1) / jnp.sum(weights, axis=1)
  if classifier == MAP:
    assert map_head is not None
    skipped = num_prefix if map_skips is None else map_skips
    if mask is not None:  # the prefix tokens the probe sees are real
      prefix = jnp.ones((mask.shape[0], num_prefix - skipped), bool)
      mask = jnp.concatenate([prefix, mask], axis=1)  # [B, P - skipped + N]
    return map_head(x[:, skipped:], mask)
  if classifier == UNPOOLED:
    return x
  raise errors.ConfigError(f"Unknown classifier {classifier!r}; choose one of {CLASSIFIERS}.")


def representation(x: jax.Array, size: int, dtype: jnp.dtype, param_dtype: jnp.dtype) -> jax.Array:
  """The official pre-training's tanh representation layer ``pre_logits``."""
  x = nn.Dense(
    size,
    dtype=dtype,
    param_dtype=param_dtype,
    kernel_init=partitioned(nn.initializers.lecun_normal(), (EMBED, None)),
    bias_init=partitioned(nn.initializers.zeros, (None,)),
    name="pre_logits",
  )(x)
  return jnp.tanh(x)


def linear_head(
  x: jax.Array, num_classes: int, bias_init: float, dtype: jnp.dtype, param_dtype: jnp.dtype
) -> jax.Array:
  """The zero-initialised classifier ``head`` (paper Sec. 3.2)."""
  return nn.Dense(
    num_classes,
    dtype=dtype,
    param_dtype=param_dtype,
    kernel_init=partitioned(nn.initializers.zeros, (EMBED, None)),
    bias_init=partitioned(nn.initializers.constant(bias_init), (None,)),
    name="head",
  )(x)


def pooled_logits(
  x: jax.Array, num_classes: Optional[int], bias_init: float, execution: ExecutionOptions
) -> jax.Array:
  """The `linear_head` on pooled features [B, D] when there are classes, else the features;
  float32 either way (an MLP-Mixer's and a BiT's output)."""
  if num_classes:
    x = linear_head(x, num_classes, bias_init, execution.dtype, execution.param_dtype)
  return x.astype(jnp.float32)
