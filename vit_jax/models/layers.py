"""Layers the ViT and the MLP-Mixer build alike, with the official names, initializers and
logical axis names: the patch embedding, the LayerNorm and the zero-initialised head."""

from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.sharding import EMBED


def partitioned(init, names: tuple[Optional[str], ...]):
  """``init`` whose parameter carries the logical axis ``names`` (`vit_jax.sharding`)."""
  return nn.with_logical_partitioning(init, names)


def patch_embedding(
  width: int, patch_size: tuple[int, int], dtype: jnp.dtype, param_dtype: jnp.dtype, name: str
) -> nn.Conv:
  """The strided conv [B, H, W, C] -> [B, H/ph, W/pw, D] of non-overlapping patches."""
  return nn.Conv(
    width,
    patch_size,
    strides=patch_size,
    padding="VALID",
    dtype=dtype,
    param_dtype=param_dtype,
    name=name,
    kernel_init=partitioned(nn.initializers.lecun_normal(), (None, None, None, EMBED)),
    bias_init=partitioned(nn.initializers.zeros, (EMBED,)),
  )


def layer_norm(name: str, dtype: jnp.dtype, param_dtype: jnp.dtype) -> nn.LayerNorm:
  """LayerNorm over the width, epsilon 1e-6 (Flax's default, the official models')."""
  return nn.LayerNorm(
    epsilon=1e-6,
    name=name,
    dtype=dtype,
    param_dtype=param_dtype,
    scale_init=partitioned(nn.initializers.ones, (EMBED,)),
    bias_init=partitioned(nn.initializers.zeros, (EMBED,)),
  )


def head(num_classes: int, bias: float, dtype: jnp.dtype, param_dtype: jnp.dtype) -> nn.Dense:
  """The classification head, zero kernel and a constant bias (the official init)."""
  return nn.Dense(
    num_classes,
    dtype=dtype,
    param_dtype=param_dtype,
    kernel_init=partitioned(nn.initializers.zeros, (EMBED, None)),
    bias_init=partitioned(nn.initializers.constant(bias), (None,)),
    name="head",
  )
