"""The text tower of an image-text model: token embeddings, learned positions, the ViT's
encoder blocks, a pooling and an optional projection.

Follows big_vision's ``proj/image_text/text_transformer.py`` (the SigLIP and LiT text
towers): parameter names ``Embed_0``, ``pos_embedding``, ``Encoder_0/encoderblock_<i>`` and
``Encoder_0/encoder_norm``, ``MAPHead_0``, ``head``; by default no attention mask (big_vision's
towers have none; padding tokens are attended like any other). Pooling, ``pool``:
- 'last': the last position (with big_vision's sticky end token, the end token);
- 'first': the first position; 'gap': the mean over positions;
- 'map': attention pooling with a learned probe (SigLIP's so400m text tower);
- 'eos': the first position holding ``eos_id`` (transformers' CLIP); 'argmax': the
  position of the largest id (CLIP configs whose eos_token_id is 2: the end token is the
  vocabulary's last).

The options transformers' text towers compute, each off by default: ``causal`` (CLIP's
causal mask), ``pad_id`` (the keys holding ``pad_id`` are masked, as the ``attention_mask``
transformers' tokenizers return, padding on either side; where ``pad_id == eos_id``,
SigLIP's tokenizer, only those after the first, the text's own end token: right padding),
``activation`` 'quick_gelu' (CLIP), ``head_bias`` False (CLIP's projection has none).

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

from vit_jax.infra import errors
from vit_jax.models import heads, layers, variants
from vit_jax.models.execution import ExecutionOptions
from vit_jax.models.settings import ModelSettings
from vit_jax.models.vit import Encoder1DBlock

POOLS = ("last", "first", "gap", "map", "eos", "argmax")
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
  activation: str = layers.GELU  # `layers.ACTIVATIONS`; 'quick_gelu': CLIP's
  causal: bool = False  # CLIP's causal attention mask
  pad_id: Optional[int] = None  # None: padding attended as any token (big_vision's)
  eos_id: Optional[int] = None  # the end token ('eos' pooling; see pad_id)
  head_bias: bool = True  # the projection's bias (CLIP's has none)

  def __post_init__(self):
    if self.pool not in POOLS:
      raise errors.ConfigError(f"text pool={self.pool!r}; choose one of {POOLS}.")
    if self.pool == "eos" and self.eos_id is None:
      raise errors.ConfigError("text pool='eos' needs eos_id, the end token's id.")
    if self.activation not in layers.ACTIVATIONS:
      raise errors.ConfigError(
        f"text activation={self.activation!r}; choose one of {layers.ACTIVATIONS}."
      )
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
      activation=self.activation,
    )  # fmt: skip

  def attention_mask(self, ids: jax.Array) -> Optional[jax.Array]:
    """bool [B, 1, L, L] (query, key) of ``causal`` and ``pad_id``; None: neither."""
    length = ids.shape[1]
    mask = None
    if self.pad_id is not None:
      is_pad = ids == self.pad_id  # [B, L]
      if self.pad_id == self.eos_id:  # right padding after the text's own end token
        is_pad = jnp.cumsum(is_pad, axis=1) - is_pad > 0
      mask = ~is_pad[:, None, None, :]  # [B, 1, 1, L]
    if self.causal:
      causal = jnp.tril(jnp.ones((length, length), bool))[None, None]  # [1, 1, L, L]
      mask = causal if mask is None else mask & causal
    return mask

  def pool_tokens(self, x: jax.Array, ids: jax.Array) -> jax.Array:
    """[B, L, D] -> [B, D] by 'last', 'first', 'gap', 'eos' or 'argmax' ('map' is a module)."""
    if self.pool == "last":
      return x[:, -1]
    if self.pool == "first":
      return x[:, 0]
    if self.pool == "gap":
      return jnp.mean(x, axis=1)
    at = jnp.argmax(ids == self.eos_id if self.pool == "eos" else ids, axis=1)  # [B]: first
    return jnp.take_along_axis(x, at[:, None, None], axis=1)[:, 0]


class _TextEncoder(nn.Module):
  settings: TextSettings
  execution: ExecutionOptions

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, mask: Optional[jax.Array]) -> jax.Array:
    s, ex = self.settings, self.execution
    blocks = s.block_settings()
    for i in range(s.depth):
      x, _ = Encoder1DBlock(blocks, ex, name=f"encoderblock_{i}")(x, not train, 0.0, mask)
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
    mask = s.attention_mask(ids)
    x = _TextEncoder(s, ex, name="Encoder_0")(x.astype(ex.dtype), train, mask)  # [B, L, D]
    out = {"transformed": x}
    if s.pool == "map":
      x = heads.MAPHead(
        s.num_heads, s.mlp_dim, s.gelu_approximate, s.activation, s.layer_norm_epsilon, ex,
        name="MAPHead_0",
      )(x)  # fmt: skip
    else:
      x = s.pool_tokens(x, ids)
    out["pre_logits"] = x  # [B, D]
    if self.num_classes:
      x = nn.Dense(
        self.num_classes, use_bias=s.head_bias, dtype=ex.dtype, param_dtype=ex.param_dtype,
        name="head",
      )(x)  # fmt: skip
    return x.astype(jnp.float32), out
