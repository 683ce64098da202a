"""The gated MLP of the 2026 ViT families: SwiGLU, fused or split, with EVA-02's optional
LayerNorm inside.

    y = fc2(norm(silu(gate(x)) * value(x)))        # [B, N, D] -> [B, N, D]

Parameter names are timm's (`timm.layers.mlp`), so the timm tables map them one to one:
split (timm's ``SwiGLU``: DINOv3's S+/H+/7B, EVA-02): ``fc1_g`` (the gate), ``fc1_x`` (the
value), ``norm`` (with ``inner_norm``), ``fc2``; fused (timm's ``GluMlp`` with SiLU and the
gate in the second half, Naver's and timm's ``*_swiglu`` ViTs): ``fc1`` of width
2 * hidden_dim, ``norm``, ``fc2``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

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
    dense = lambda width, name: nn.Dense(  # noqa: E731
      width, use_bias=self.use_bias, dtype=ex.dtype, param_dtype=ex.param_dtype, name=name
    )
    if self.fused:
      value, gate = jnp.split(dense(2 * self.hidden_dim, "fc1")(x), 2, axis=-1)  # [B, N, H] x2
    else:
      gate, value = dense(self.hidden_dim, "fc1_g")(x), dense(self.hidden_dim, "fc1_x")(x)
    y = nn.silu(gate) * value  # [B, N, H]
    y = nn.Dropout(ex.dropout_rate)(y, deterministic=deterministic)
    if self.inner_norm:
      y = layers.layer_norm("norm", self.layer_norm_epsilon, ex.dtype, ex.param_dtype)(y)
    y = dense(x.shape[-1], "fc2")(y)  # [B, N, D]
    return nn.Dropout(ex.dropout_rate)(y, deterministic=deterministic)
