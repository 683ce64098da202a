"""The ResNet root of the hybrid models (paper Sec. 3.1): BiT-style ResNet-v1.5 bottlenecks
with weight-standardised convolutions and GroupNorm(32).

Parameter names equal the official hybrid checkpoints: ``conv_root``, ``gn_root``,
``block{s}/unit{u}/{conv1,gn1,conv2,gn2,conv3,gn3,conv_proj,gn_proj}`` (1-based).
"""

from __future__ import annotations

from typing import Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class StdConv(nn.Conv):
  """A convolution whose kernel is standardised over its receptive field (per output), in
  float32 whatever the computation dtype.

  As the official hybrids: ``(w - mean) / (std + 1e-5)``, the epsilon added to the
  standard deviation. With ``variance_epsilon`` (the BiT ResNets, `models.bit`):
  ``(w - mean) / sqrt(var + variance_epsilon)``, as timm's ``StdConv2d``.
  """

  variance_epsilon: Optional[float] = None

  def param(self, name: str, *args, **kwargs):
    param = super().param(name, *args, **kwargs)
    if name == "kernel":
      kernel = param.astype(jnp.float32)  # [kh, kw, Cin, Cout]
      centred = kernel - jnp.mean(kernel, axis=(0, 1, 2), keepdims=True)
      if self.variance_epsilon is None:
        kernel = centred / (jnp.std(kernel, axis=(0, 1, 2), keepdims=True) + 1e-5)
      else:
        var = jnp.var(kernel, axis=(0, 1, 2), keepdims=True)
        kernel = centred * jax.lax.rsqrt(var + self.variance_epsilon)
      param = kernel.astype(param.dtype)
    return param


class BottleneckUnit(nn.Module):
  """1x1 -> 3x3 (strided) -> 1x1 bottleneck with a projected shortcut where shapes change."""

  features: int
  strides: int = 1
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    conv = lambda f, k, s, name: StdConv(
      f, (k, k), (s, s), use_bias=False, name=name, dtype=self.dtype, param_dtype=self.param_dtype
    )
    norm = lambda name, **kw: nn.GroupNorm(
      num_groups=32, name=name, dtype=self.dtype, param_dtype=self.param_dtype, **kw
    )
    out_features = 4 * self.features
    residual = x
    if x.shape[-1] != out_features or self.strides != 1:
      residual = conv(out_features, 1, self.strides, "conv_proj")(residual)
      residual = norm("gn_proj")(residual)
    y = nn.relu(norm("gn1")(conv(self.features, 1, 1, "conv1")(x)))
    y = nn.relu(norm("gn2")(conv(self.features, 3, self.strides, "conv2")(y)))
    # Zero-initialised last norm: every unit starts as the identity on its shortcut.
    y = norm("gn3", scale_init=nn.initializers.zeros)(conv(out_features, 1, 1, "conv3")(y))
    return nn.relu(residual + y)


class ResNetStage(nn.Module):
  """``num_units`` bottleneck units; the first one strides and projects."""

  num_units: int
  features: int
  first_strides: int
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    for u in range(self.num_units):
      x = BottleneckUnit(
        self.features,
        self.first_strides if u == 0 else 1,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name=f"unit{u + 1}",
      )(x)
    return x


def resnet_root(
  x: jax.Array,
  units_per_stage: Sequence[int],
  width_factor: float = 1.0,
  dtype: jnp.dtype = jnp.float32,
  param_dtype: jnp.dtype = jnp.float32,
) -> jax.Array:
  """Root conv (7x7, stride 2) + max-pool (stride 2) + stages of bottleneck units.

  Call it inside the hybrid model's compact ``__call__``: its modules are then created in
  that model's scope, so their parameters sit at the top level as in the official files.
  ``units_per_stage`` is e.g. (3, 4, 9) for R50 with stage 4 removed, (2, 2, 2, 2) for
  R26, or () for the root alone (R+Ti/16). x: [B, H, W, C] -> [B, H/s, W/s, C'] with
  s = 4 * 2^(stages - 1).
  """
  width = int(64 * width_factor)
  x = StdConv(
    width, (7, 7), (2, 2), use_bias=False, name="conv_root", dtype=dtype, param_dtype=param_dtype
  )(x)
  x = nn.GroupNorm(num_groups=32, name="gn_root", dtype=dtype, param_dtype=param_dtype)(x)
  x = nn.relu(x)
  x = nn.max_pool(x, window_shape=(3, 3), strides=(2, 2), padding="SAME")
  for s, num_units in enumerate(units_per_stage):
    x = ResNetStage(
      num_units,
      width * 2**s,
      first_strides=1 if s == 0 else 2,
      dtype=dtype,
      param_dtype=param_dtype,
      name=f"block{s + 1}",
    )(x)
  return x
