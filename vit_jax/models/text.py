"""The text tower of an image-text model: token embeddings, learned positions, the ViT's
encoder blocks, a pooling and an optional projection.

Follows big_vision's ``proj/image_text/text_transformer.py`` (the SigLIP and LiT text
towers): parameter names ``Embed_0``, ``pos_embedding``, ``Encoder_0/encoderblock_<i>`` and
``Encoder_0/encoder_norm``, ``MAPHead_0``, ``head``; no attention mask (big_vision's towers
have none; padding tokens are attended like any other). Pooling, ``pool``:
- 'last': the last position (with big_vision's sticky end token, the end token);
- 'first': the first position; 'gap': the mean over positions;
- 'map': attention pooling with a learned probe (SigLIP's so400m text tower).

    tower = TextTransformer(TextSettings(width=64, depth=2, num_heads=2, mlp_dim=128,
                                         vocab_size=1000), num_classes=32)
    z, out = tower.apply(variables, ids)   # ids: int32 [B, L] -> z: [B, 32]
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import errors
from vit_jax.models import heads, layers, variants
from vit_jax.models.execution import ExecutionOptions
from vit_jax.models.settings import ModelSettings
from vit_jax.models.vit import Encoder1DBlock

POOLS = ("last", "first", "gap", "map")
# big_vision's text tower sizes (`vit.decode_variant`), (width, depth, mlp_dim, heads).
SIZES: dict[str, tuple[int, int, int, int]] = {
  "S": (384, 12, 1536, 6),
  "B": (768, 12, 3072, 12),
  "L": (1024, 24, 4096, 16),
  "So400m": (1152, 27, 4304, 16),
  "g": (1536, 40, 6144, 16),
}


@dataclasses.dataclass(frozen=True)
class TextSettings:
  """A text tower's architecture; every default is big_vision's."""

  width: int = 768
  depth: int = 12
  mlp_dim: int = 3072
  num_heads: int = 12
  vocab_size: int = 32_000
  pool: str = "last"
  gelu_approximate: bool = True  # big_vision's nn.gelu is the tanh form
  layer_norm_epsilon: float = layers.LAYER_NORM_EPSILON

  def __post_init__(self):
    if self.pool not in POOLS:
      raise errors.ConfigError(f"text pool={self.pool!r}; choose one of {POOLS}.")
    if self.width % self.num_heads:
      raise errors.ConfigError(
        f"text width={self.width} does not split into num_heads={self.num_heads} heads."
      )
    for name in ("width", "depth", "mlp_dim", "vocab_size"):
      if getattr(self, name) <= 0:
        raise errors.ConfigError(f"text {name}={getattr(self, name)} must be positive.")

  @classmethod
  def named(cls, size: str, **changes: Any) -> "TextSettings":
    """big_vision's size names: S, B, L, So400m, g."""
    if size not in SIZES:
      raise errors.ConfigError(f"Unknown text tower size {size!r}; choose one of {tuple(SIZES)}.")
    width, depth, mlp_dim, num_heads = SIZES[size]
    return cls(width=width, depth=depth, mlp_dim=mlp_dim, num_heads=num_heads, **changes)

  def block_settings(self) -> ModelSettings:
    """The ViT settings whose encoder blocks these are (the blocks read their width, heads,
    MLP, GELU and LayerNorm from `ModelSettings`, the one declaration of each option)."""
    base = ModelSettings.from_config(variants.get_model_config("ViT-B_16"))
    transformer = dataclasses.replace(
      base.transformer, num_layers=self.depth, mlp_dim=self.mlp_dim, num_heads=self.num_heads
    )
    return dataclasses.replace(
      base, name="text", hidden_size=self.width, transformer=transformer,
      gelu_approximate=self.gelu_approximate, layer_norm_epsilon=self.layer_norm_epsilon,
    )  # fmt: skip


class _TextEncoder(nn.Module):
  settings: TextSettings
  execution: ExecutionOptions

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    s, ex = self.settings, self.execution
    blocks = s.block_settings()
    for i in range(s.depth):
      x, _ = Encoder1DBlock(blocks, ex, name=f"encoderblock_{i}")(x, not train)
    norm = layers.layer_norm("encoder_norm", s.layer_norm_epsilon, ex.dtype, ex.param_dtype)
    return norm(x)


class TextTransformer(nn.Module):
  """int32 [B, L] token ids -> ([B, num_classes or width] features, intermediates)."""

  settings: TextSettings
  num_classes: Optional[int] = None  # the projection's width; None or 0: none
  execution: ExecutionOptions = ExecutionOptions()

  @nn.compact
  def __call__(self, ids: jax.Array, *, train: bool = False) -> tuple[jax.Array, dict]:
    s, ex = self.settings, self.execution
    embed = nn.Embed(s.vocab_size, s.width, dtype=ex.dtype, param_dtype=ex.param_dtype)
    x = embed(ids)  # [B, L, D]
    length = x.shape[1]
    init = nn.initializers.normal(stddev=1 / np.sqrt(s.width))
    x = x + self.param("pos_embedding", init, (1, length, s.width), ex.param_dtype)
    x = _TextEncoder(s, ex, name="Encoder_0")(x.astype(ex.dtype), train)  # [B, L, D]
    out = {"transformed": x}
    if s.pool == "last":
      x = x[:, -1]
    elif s.pool == "first":
      x = x[:, 0]
    elif s.pool == "gap":
      x = jnp.mean(x, axis=1)
    else:
      x = heads.MAPHead(
        s.num_heads, s.mlp_dim, s.gelu_approximate, layers.GELU, s.layer_norm_epsilon, ex,
        name="MAPHead_0",
      )(x)  # fmt: skip
    out["pre_logits"] = x  # [B, D]
    if self.num_classes:
      x = nn.Dense(self.num_classes, dtype=ex.dtype, param_dtype=ex.param_dtype, name="head")(x)
    return x.astype(jnp.float32), out
