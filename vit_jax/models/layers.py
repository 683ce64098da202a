"""Small pieces every part of the ViT shares: partitioned initializers, the LayerNorm, the
MLP's activation, LayerScale, the MLP block and stochastic depth (`DropPath`).

The defaults are the official model's (LayerNorm epsilon 1e-6, tanh GELU); the other
values exist for the later members of the family loaded from timm and transformers
(CLIP's epsilon 1e-5 and QuickGELU, transformers' 1e-12, DINOv2's LayerScale).
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.infra import errors
from vit_jax.infra.sharding import EMBED, MLP
from vit_jax.models.execution import ExecutionOptions

GELU = "gelu"  # tanh or exact, as `gelu_approximate` says
QUICK_GELU = "quick_gelu"  # x * sigmoid(1.702 x), OpenAI CLIP's
ACTIVATIONS: tuple[str, ...] = (GELU, QUICK_GELU)
_normal_init = nn.initializers.normal(stddev=1e-6)
LAYER_NORM_EPSILON = 1e-6  # the official models' (Flax's default)


def partitioned(init, names: tuple[Optional[str], ...]):
  """``init`` with logical axis names (`vit_jax.infra.sharding`) on the parameter it makes."""
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
  execution: ExecutionOptions
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


def drop_path_rates(num_layers: int, stoch_depth: float) -> tuple[float, ...]:
  """Each block's drop-path rate: linear from 0 at the first block to ``stoch_depth`` at
  the last, timm's schedule (``torch.linspace(0, rate, depth)``, in float32 as there)."""
  if not 0.0 <= stoch_depth < 1.0:
    raise errors.ConfigError(
      f"config.model.stoch_depth={stoch_depth} must be in [0, 1): the last block's "
      "drop-path rate (0: off; AugReg uses 0.1)."
    )
  rates = np.linspace(0.0, stoch_depth, num_layers, dtype=np.float32)
  return tuple(float(r) for r in rates)


class DropPath(nn.Module):
  """Stochastic depth (Huang et al., 2016) on a residual branch: per example, the whole
  branch is dropped with probability ``rate`` and kept scaled by 1 / (1 - rate), as
  timm's ``DropPath``, so its expectation is the branch. Identity in evaluation.

  ``rate`` is a Python float (0: no random key drawn) or, under `nn.scan`, a traced
  scalar of this layer.
  """

  @nn.compact
  def __call__(self, y: jax.Array, rate: float | jax.Array, deterministic: bool) -> jax.Array:
    if deterministic or (isinstance(rate, (int, float)) and rate == 0.0):
      return y
    keep = 1.0 - jnp.asarray(rate, jnp.float32)
    shape = (y.shape[0],) + (1,) * (y.ndim - 1)  # [B, 1, 1]: one draw per example
    kept = jax.random.bernoulli(self.make_rng("dropout"), keep, shape)
    return jnp.where(kept, y / keep.astype(y.dtype), jnp.zeros((), y.dtype))
