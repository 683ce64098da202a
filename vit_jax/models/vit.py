"""The Vision Transformer (Dosovitskiy et al., 2021), Flax linen.

Parameter names equal the official checkpoints (docs/checkpoint_format.md), so an official `.npz`
loads without renaming. Every parameter carries logical axis names (`EMBED`, `MLP`,
`HEADS`, `KV`, `LAYERS` of `vit_jax.sharding`), which that module maps onto mesh axes.

Inspection: apply with ``mutable=['intermediates']`` and every block sows
``attention_weights`` [B, H, N, N] and its output ``tokens`` [B, N, D]; with
``scan=True`` these come stacked over a leading layer axis.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax import errors
from vit_jax.models import layers
from vit_jax.models import posemb as posemb_lib
from vit_jax.models.resnet import resnet_root
from vit_jax.sharding import EMBED, HEADS, KV, LAYERS, MLP

CLASSIFIERS: tuple[str, ...] = ("token", "gap", "unpooled")

EINSUM = "einsum"  # `ExecutionOptions.attention_impl` of the module's own einsum attention
_normal_init = nn.initializers.normal(stddev=1e-6)


def _partitioned(init, names: tuple[Optional[str], ...]):
  return nn.with_logical_partitioning(init, names)


@dataclasses.dataclass(frozen=True)
class ExecutionOptions:
  """How the model runs: declared once here and passed down the modules as one attribute.

  None of them changes the parameters or the function computed in evaluation; ``scan``
  stores the blocks' parameters stacked over a leading layer axis.
  """

  dropout_rate: float = 0.0  # on the embeddings, the attention output and the MLP
  attention_dropout_rate: float = 0.0  # on the attention weights
  # None or EINSUM: the einsum attention; else `jax.nn.dot_product_attention`'s
  # implementation ('xla', 'cudnn'). See `MultiHeadDotProductAttention`.
  attention_impl: Optional[str] = None
  scan: bool = False  # the encoder blocks as one `nn.scan` (faster to compile)
  remat: bool = False  # recompute each block's activations in the backward pass
  remat_policy: Optional[str] = None  # a name in `jax.checkpoint_policies`
  dtype: jnp.dtype = jnp.float32  # computation
  param_dtype: jnp.dtype = jnp.float32  # storage


def resolve_remat_policy(name: Optional[str]) -> Optional[Callable[..., bool]]:
  """The `jax.checkpoint_policies` entry ``name`` names (None: save nothing extra)."""
  if not name:
    return None
  if not hasattr(jax.checkpoint_policies, name):
    raise errors.ConfigError(
      f"Unknown remat_policy {name!r}: use a name from "
      "jax.checkpoint_policies, e.g. 'nothing_saveable'."
    )
  return getattr(jax.checkpoint_policies, name)


class _Projection(nn.Module):
  """A projection's ``kernel`` and ``bias`` with `nn.DenseGeneral`'s names and initializers.

  It only declares them (cast to the compute dtype): the attention applies them with the
  einsum that gives the layout it needs, with no transpose of its own. As in
  `nn.DenseGeneral`, the kernel is initialized as the matrix [prod(inputs), prod(outputs)]
  (its first ``num_inputs`` axes are the inputs), so the fans are those of the projection.
  """

  num_inputs: int
  kernel_shape: tuple[int, ...]
  kernel_axes: tuple[str, ...]
  bias_shape: tuple[int, ...]
  bias_axes: tuple[str, ...]
  execution: ExecutionOptions

  @nn.compact
  def __call__(self) -> tuple[jax.Array, jax.Array]:
    ex = self.execution

    def kernel_init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype) -> jax.Array:
      matrix = (math.prod(shape[: self.num_inputs]), math.prod(shape[self.num_inputs :]))
      return nn.initializers.xavier_uniform()(key, matrix, dtype).reshape(shape)

    kernel = self.param(
      "kernel", _partitioned(kernel_init, self.kernel_axes), self.kernel_shape, ex.param_dtype
    )
    bias = self.param(
      "bias", _partitioned(nn.initializers.zeros, self.bias_axes), self.bias_shape, ex.param_dtype
    )
    return kernel.astype(ex.dtype), bias.astype(ex.dtype)


class MultiHeadDotProductAttention(nn.Module):
  """Self-attention with the official `query/key/value/out` parameter layout.

  ``attention_impl`` chooses how the product runs, never the parameters or the function:
  `EINSUM` (the default): the projections write queries, keys and values head-major,
  [B, H, N, Dh], as the batched products need them, and the softmax's normalisation
  divides the [B, H, N, Dh] product rather than the [B, H, N, N] weights (the weights are
  formed only when sown or dropped out); any other
  value goes to `jax.nn.dot_product_attention` as its ``implementation`` ('xla', or a fused
  kernel such as 'cudnn' on GPU) with [B, N, H, Dh] inputs. On the CPU the einsum path
  compiled to less memory traffic and faster steps in training and inference (README,
  Performance). When the weights are needed (sown for inspection, or attention dropout in
  training) the einsum path runs whatever the choice.
  """

  num_heads: int
  execution: ExecutionOptions = ExecutionOptions()

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    ex = self.execution
    d = x.shape[-1]  # x: [B, N, D]
    if d % self.num_heads:
      raise errors.ConfigError(f"Width {d} is not divisible by num_heads={self.num_heads}.")
    h, dh = self.num_heads, d // self.num_heads
    qkv = [
      _Projection(1, (d, h, dh), (EMBED, HEADS, KV), (h, dh), (HEADS, KV), ex, name=name)()
      for name in ("query", "key", "value")
    ]
    w_out, b_out = _Projection(2, (h, dh, d), (HEADS, KV, EMBED), (d,), (EMBED,), ex, name="out")()

    use_dropout = not deterministic and ex.attention_dropout_rate > 0.0
    need_weights = use_dropout or self.is_mutable_collection("intermediates")
    if (ex.attention_impl or EINSUM) != EINSUM and not need_weights:
      q, k, v = (jnp.einsum("bnd,dhk->bnhk", x, w) + b for w, b in qkv)  # [B, N, H, Dh]
      y = jax.nn.dot_product_attention(q, k, v, implementation=ex.attention_impl)
      return jnp.einsum("bnhk,hkd->bnd", y, w_out) + b_out  # [B, N, D]
    q, k, v = (jnp.einsum("bnd,dhk->bhnk", x, w) + b[:, None] for w, b in qkv)  # [B, H, N, Dh]
    q = q / jnp.sqrt(dh).astype(ex.dtype)
    logits = jnp.einsum("bhqd,bhkd->bhqk", q, k).astype(jnp.float32)  # [B, H, N, N]
    if need_weights:
      weights = jax.nn.softmax(logits, axis=-1)
      self.sow("intermediates", "attention_weights", weights)
      weights = weights.astype(ex.dtype)
      if use_dropout:
        weights = nn.Dropout(ex.attention_dropout_rate)(weights, deterministic=False)
      y = jnp.einsum("bhqk,bhkd->bhqd", weights, v)  # [B, H, N, Dh]
    else:
      # softmax(logits) @ v with the normalisation applied to the [B, H, N, Dh] product
      # instead of the [B, H, N, N] weights: the same function, a smaller division.
      unnormalized = jnp.exp(logits - jax.lax.stop_gradient(logits.max(-1, keepdims=True)))
      y = jnp.einsum("bhqk,bhkd->bhqd", unnormalized.astype(ex.dtype), v)
      y = y / unnormalized.sum(-1, keepdims=True).astype(ex.dtype)
    return jnp.einsum("bhnk,hkd->bnd", y, w_out) + b_out  # [B, N, D]


class MlpBlock(nn.Module):
  """Dense -> GELU -> dropout -> Dense -> dropout.

  ``gelu_approximate``: the tanh approximation (Flax's default, what the official model
  and its checkpoints use) or the exact erf GELU (what timm and Hugging Face compute).
  """

  mlp_dim: int
  gelu_approximate: bool
  execution: ExecutionOptions = ExecutionOptions()

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
      kernel_init=_partitioned(nn.initializers.xavier_uniform(), (EMBED, MLP)),
      bias_init=_partitioned(_normal_init, (MLP,)),
    )(x)  # [B, N, M]
    x = nn.gelu(x, approximate=self.gelu_approximate)
    x = nn.Dropout(rate)(x, deterministic=deterministic)
    x = dense(
      d,
      name="Dense_1",
      kernel_init=_partitioned(nn.initializers.xavier_uniform(), (MLP, EMBED)),
      bias_init=_partitioned(_normal_init, (EMBED,)),
    )(x)  # [B, N, D]
    return nn.Dropout(rate)(x, deterministic=deterministic)


def _layer_norm(name: str, execution: ExecutionOptions) -> nn.LayerNorm:
  return layers.layer_norm(name, execution.dtype, execution.param_dtype)


class Encoder1DBlock(nn.Module):
  """Pre-LayerNorm block: x + MSA(LN(x)), then x + MLP(LN(x)).

  Returns ``(x, None)`` so that the same class serves as the body of `nn.scan`.
  """

  mlp_dim: int
  num_heads: int
  gelu_approximate: bool
  execution: ExecutionOptions = ExecutionOptions()

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> tuple[jax.Array, None]:
    ex = self.execution
    y = _layer_norm("LayerNorm_0", ex)(x)
    y = MultiHeadDotProductAttention(self.num_heads, ex, name="MultiHeadDotProductAttention_1")(
      y, deterministic
    )
    y = nn.Dropout(ex.dropout_rate)(y, deterministic=deterministic)
    x = x + y  # [B, N, D]
    y = _layer_norm("LayerNorm_2", ex)(x)
    y = MlpBlock(self.mlp_dim, self.gelu_approximate, ex, name="MlpBlock_3")(y, deterministic)
    x = x + y
    self.sow("intermediates", "tokens", x)
    return x, None


class Encoder(nn.Module):
  """Position embeddings, ``num_layers`` blocks (a Python loop or `nn.scan`), final LayerNorm."""

  num_layers: int
  mlp_dim: int
  num_heads: int
  grid_hw: tuple[int, int]
  num_prefix: int
  gelu_approximate: bool
  posemb: str = "learn"
  execution: ExecutionOptions = ExecutionOptions()

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    ex = self.execution
    deterministic = not train
    x = posemb_lib.AddPositionEmbs(
      self.posemb, self.grid_hw, self.num_prefix, param_dtype=ex.param_dtype, name="posembed_input"
    )(x)
    x = nn.Dropout(ex.dropout_rate)(x, deterministic=deterministic)

    block_cls = Encoder1DBlock
    if ex.remat:
      policy = resolve_remat_policy(ex.remat_policy)
      # Argument 2 (`deterministic`, counting self) is a Python bool: static.
      block_cls = nn.remat(block_cls, prevent_cse=not ex.scan, static_argnums=(2,), policy=policy)
    block_kwargs = dict(
      mlp_dim=self.mlp_dim,
      num_heads=self.num_heads,
      gelu_approximate=self.gelu_approximate,
      execution=ex,
    )
    if ex.scan:
      scanned = nn.scan(
        block_cls,
        variable_axes={"params": 0, "intermediates": 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=nn.broadcast,
        length=self.num_layers,
        metadata_params={nn.PARTITION_NAME: LAYERS},
      )
      x, _ = scanned(name="encoderblock", **block_kwargs)(x, deterministic)
    else:
      for i in range(self.num_layers):
        x, _ = block_cls(name=f"encoderblock_{i}", **block_kwargs)(x, deterministic)
    return _layer_norm("encoder_norm", ex)(x)


class VisionTransformer(nn.Module):
  """ViT and its ResNet hybrids. Input: [B, H, W, C] in [-1, 1]; output: logits [B, K].

  With ``classifier='unpooled'`` the output keeps every token, [B, N, K or D];
  with ``num_classes`` 0 or None there is no head and the output is the representation.
  Masked patch prediction (`vit_jax.models.mpp`) passes ``corrupt``, applied to the patch
  embeddings [B, N, D] before the class token and the position embeddings, and
  ``pool=False``: the output is then every token after the encoder, [B, N(+1), D].
  """

  num_classes: Optional[int]
  patch_size: tuple[int, int]
  hidden_size: int
  num_layers: int
  mlp_dim: int
  num_heads: int
  classifier: str = "token"
  posemb: str = "learn"
  representation_size: Optional[int] = None
  head_bias_init: float = 0.0
  gelu_approximate: bool = True  # tanh GELU as the official weights; False: exact (timm, HF)
  resnet_units: Optional[Sequence[int]] = None  # None: plain ViT; (): root only; (3, 4, 9): R50
  resnet_width_factor: float = 1.0
  execution: ExecutionOptions = ExecutionOptions()

  @property
  def input_stride(self) -> tuple[int, int]:
    """How many input pixels one token covers along H and W."""
    root = 1 if self.resnet_units is None else 4 * 2 ** max(len(self.resnet_units) - 1, 0)
    return root * self.patch_size[0], root * self.patch_size[1]

  def grid_hw(self, image_hw: tuple[int, int]) -> tuple[int, int]:
    """The token grid for an image size; raises if the size is not a multiple of the patch."""
    sh, sw = self.input_stride
    h, w = image_hw
    if h % sh or w % sw:
      what = "patch size" if self.resnet_units is None else "patch size times the ResNet stride"
      raise errors.ConfigError(
        f"Image size {h}x{w} is not a multiple of the {what} {sh}x{sw}: "
        f"resize the images to a multiple of {sh}x{sw}."
      )
    return h // sh, w // sw

  @nn.compact
  def __call__(
    self,
    images: jax.Array,
    *,
    train: bool = False,
    corrupt: Optional[Callable[[jax.Array], jax.Array]] = None,
    pool: bool = True,
  ) -> jax.Array:
    if self.classifier not in CLASSIFIERS:
      raise errors.ConfigError(
        f"Unknown classifier {self.classifier!r}; choose one of {CLASSIFIERS}."
      )
    ex = self.execution
    grid_hw = self.grid_hw(images.shape[1:3])
    x = images.astype(ex.dtype)  # [B, H, W, C]
    if self.resnet_units is not None:
      x = resnet_root(
        x, self.resnet_units, self.resnet_width_factor, dtype=ex.dtype, param_dtype=ex.param_dtype
      )  # [B, H/s, W/s, C']
    x = layers.patch_embedding(
      self.hidden_size, self.patch_size, ex.dtype, ex.param_dtype, "embedding"
    )(x)
    b, gh, gw, d = x.shape  # [B, gh, gw, D]
    assert (gh, gw) == grid_hw, ((gh, gw), grid_hw)
    x = x.reshape(b, gh * gw, d)  # [B, N, D]
    if corrupt is not None:
      x = corrupt(x)

    num_prefix = 0
    if self.classifier == "token":
      cls = self.param(
        "cls", _partitioned(nn.initializers.zeros, (None, None, EMBED)), (1, 1, d), ex.param_dtype
      )
      x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), (b, 1, d)), x], axis=1)
      num_prefix = 1

    x = Encoder(
      self.num_layers,
      self.mlp_dim,
      self.num_heads,
      grid_hw,
      num_prefix,
      self.gelu_approximate,
      posemb=self.posemb,
      execution=ex,
      name="Transformer",
    )(x, train=train)  # [B, N(+1), D]
    if not pool:
      return x.astype(jnp.float32)

    if self.classifier == "token":
      x = x[:, 0]  # [B, D]
    elif self.classifier == "gap":
      x = jnp.mean(x, axis=1)  # [B, D]

    if self.representation_size is not None:
      x = nn.Dense(
        self.representation_size,
        dtype=ex.dtype,
        param_dtype=ex.param_dtype,
        kernel_init=_partitioned(nn.initializers.lecun_normal(), (EMBED, None)),
        bias_init=_partitioned(nn.initializers.zeros, (None,)),
        name="pre_logits",
      )(x)
      x = jnp.tanh(x)

    if self.num_classes:
      x = layers.head(self.num_classes, self.head_bias_init, ex.dtype, ex.param_dtype)(x)
    return x.astype(jnp.float32)
