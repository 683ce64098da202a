"""The gated MLP of the 2026 ViT families: SwiGLU, fused or split, with EVA-02's optional
LayerNorm inside.

    y = fc2(norm(silu(gate(x)) * value(x)))        # [B, N, D] -> [B, N, D]

Parameter names are timm's (`timm.layers.mlp`), so the timm tables map them one to one:
split (timm's ``SwiGLU``: DINOv3's S+/H+/7B, EVA-02): ``fc1_g`` (the gate), ``fc1_x`` (the
value), ``norm`` (with ``inner_norm``), ``fc2``; fused (timm's ``GluMlp`` with SiLU and the
gate in the first half, ``gate_last=False``: EVA-02-Ti/S and timm's ``SwiGLUPacked``
ViTs): ``fc1`` of width 2 * hidden_dim, ``fc2``. Kernels carry the MLP's logical axes
(`vit_jax.infra.sharding`), so tensor parallelism shards the hidden units as in the GELU MLP.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.infra.sharding import EMBED, MLP
from vit_jax.models import layers
from vit_jax.models.execution import ExecutionOptions


class SwiGLU(nn.Module):
  hidden_dim: int
  execution: ExecutionOptions = ExecutionOptions()
  fused: bool = False
  inner_norm: bool = False  # EVA-02's LayerNorm on the gated hidden units
  layer_norm_epsilon: float = layers.LAYER_NORM_EPSILON
  use_bias: bool = True

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    ex = self.execution

    def dense(width: int, axes: tuple[str, str], name: str) -> nn.Dense:
      return nn.Dense(
        width,
        use_bias=self.use_bias,
        dtype=ex.dtype,
        param_dtype=ex.param_dtype,
        kernel_init=layers.partitioned(nn.initializers.xavier_uniform(), axes),
        bias_init=layers.partitioned(nn.initializers.zeros, axes[1:]),
        name=name,
      )

    if self.fused:
      fc1 = dense(2 * self.hidden_dim, (EMBED, MLP), "fc1")(x)  # [B, N, 2H]
      gate, value = jnp.split(fc1, 2, axis=-1)  # [B, N, H] x2
    else:
      gate = dense(self.hidden_dim, (EMBED, MLP), "fc1_g")(x)
      value = dense(self.hidden_dim, (EMBED, MLP), "fc1_x")(x)
    y = nn.silu(gate) * value  # [B, N, H]
    y = nn.Dropout(ex.dropout_rate)(y, deterministic=deterministic)
    if self.inner_norm:
      y = nn.LayerNorm(
        epsilon=self.layer_norm_epsilon,
        dtype=ex.dtype,
        param_dtype=ex.param_dtype,
        scale_init=layers.partitioned(nn.initializers.ones, (MLP,)),
        bias_init=layers.partitioned(nn.initializers.zeros, (MLP,)),
        name="norm",
      )(y)
    y = dense(x.shape[-1], (MLP, EMBED), "fc2")(y)  # [B, N, D]
    return nn.Dropout(ex.dropout_rate)(y, deterministic=deterministic)
