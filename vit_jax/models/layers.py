"""Small pieces every part of the ViT shares: partitioned initializers, the LayerNorm, the
MLP's activation, LayerScale.

The defaults are the official model's (LayerNorm epsilon 1e-6, tanh GELU); the other
values exist for the later members of the family loaded from timm and transformers
(CLIP's epsilon 1e-5 and QuickGELU, transformers' 1e-12, DINOv2's LayerScale).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax import errors
from vit_jax.sharding import EMBED, MLP

GELU = "gelu"  # tanh or exact, as `gelu_approximate` says
QUICK_GELU = "quick_gelu"  # x * sigmoid(1.702 x), OpenAI CLIP's
ACTIVATIONS: tuple[str, ...] = (GELU, QUICK_GELU)
_normal_init = nn.initializers.normal(stddev=1e-6)
LAYER_NORM_EPSILON = 1e-6  # the official models' (Flax's default)


def partitioned(init, names: tuple[Optional[str], ...]):
  """``init`` with logical axis names (`vit_jax.sharding`) on the parameter it makes."""
  return nn.with_logical_partitioning(init, names)


def layer_norm(name: str, epsilon: float, dtype: jnp.dtype, param_dtype: jnp.dtype) -> nn.LayerNorm:
  return nn.LayerNorm(
    epsilon=epsilon,
    name=name,
    dtype=dtype,
    param_dtype=param_dtype,
    scale_init=partitioned(nn.initializers.ones, (EMBED,)),
    bias_init=partitioned(nn.initializers.zeros, (EMBED,)),
  )


def quick_gelu(x: jax.Array) -> jax.Array:
  """OpenAI CLIP's GELU approximation: x * sigmoid(1.702 x)."""
  return x * jax.nn.sigmoid(1.702 * x)


def activation(name: str, gelu_approximate: bool) -> Callable[[jax.Array], jax.Array]:
  """The MLP's nonlinearity: GELU (tanh or exact by ``gelu_approximate``) or QuickGELU."""
  if name == GELU:
    return lambda x: nn.gelu(x, approximate=gelu_approximate)
  if name == QUICK_GELU:
    return quick_gelu
  raise errors.ConfigError(f"Unknown activation {name!r}; choose one of {ACTIVATIONS}.")


class LayerScale(nn.Module):
  """A learned per-channel scale of a residual branch (Touvron et al. 2021, timm's
  ``ls1``/``ls2`` ``gamma``), initialised to ``init_value``."""

  init_value: float
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    init = partitioned(nn.initializers.constant(self.init_value), (EMBED,))
    scale = self.param("scale", init, (x.shape[-1],), self.param_dtype)
    return x * scale.astype(x.dtype)  # [B, N, D]


class MlpBlock(nn.Module):
  """Dense -> activation -> dropout -> Dense -> dropout.

  ``gelu_approximate``: the tanh approximation (Flax's default, what the official model
  and its checkpoints use) or the exact erf GELU (what timm and Hugging Face compute);
  ``activation`` `QUICK_GELU` replaces the GELU by OpenAI CLIP's.
  """

  mlp_dim: int
  gelu_approximate: bool
  execution: Any  # `vit_jax.models.vit.ExecutionOptions`
  activation: str = GELU

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    d = x.shape[-1]
    rate = self.execution.dropout_rate
    dense = functools.partial(
      nn.Dense, dtype=self.execution.dtype, param_dtype=self.execution.param_dtype
    )
    x = dense(
      self.mlp_dim,
      name="Dense_0",
      kernel_init=partitioned(nn.initializers.xavier_uniform(), (EMBED, MLP)),
      bias_init=partitioned(_normal_init, (MLP,)),
    )(x)  # [B, N, M]
    x = activation(self.activation, self.gelu_approximate)(x)
    x = nn.Dropout(rate)(x, deterministic=deterministic)
    x = dense(
      d,
      name="Dense_1",
      kernel_init=partitioned(nn.initializers.xavier_uniform(), (MLP, EMBED)),
      bias_init=partitioned(_normal_init, (EMBED,)),
    )(x)  # [B, N, D]
    return nn.Dropout(rate)(x, deterministic=deterministic)
