"""The ViT's self-attention with the official `query/key/value/out` parameter layout: the
projections (with all, no, or query and value biases), rotary position embeddings of the
queries and keys, the einsum attention (with relative position logits) and the fused
`jax.nn.dot_product_attention` path padded to the lengths a kernel takes."""

from __future__ import annotations

import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.infra import errors
from vit_jax.infra.sharding import EMBED, HEADS, KV
from vit_jax.models import options
from vit_jax.models import posemb as posemb_lib
from vit_jax.models import rope as rope_lib
from vit_jax.models.execution import EINSUM, ExecutionOptions
from vit_jax.models.layers import partitioned


class Projection(nn.Module):
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
  use_bias: bool = True

  @nn.compact
  def __call__(self) -> tuple[jax.Array, Optional[jax.Array]]:
    ex = self.execution

    def kernel_init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype) -> jax.Array:
      matrix = (math.prod(shape[: self.num_inputs]), math.prod(shape[self.num_inputs :]))
      return nn.initializers.xavier_uniform()(key, matrix, dtype).reshape(shape)

    kernel = self.param(
      "kernel", partitioned(kernel_init, self.kernel_axes), self.kernel_shape, ex.param_dtype
    )
    if not self.use_bias:
      return kernel.astype(ex.dtype), None
    bias = self.param(
      "bias", partitioned(nn.initializers.zeros, self.bias_axes), self.bias_shape, ex.param_dtype
    )
    return kernel.astype(ex.dtype), bias.astype(ex.dtype)


def _biased(y: jax.Array, bias: Optional[jax.Array]) -> jax.Array:
  return y if bias is None else y + bias


MIXED_FREQS = "rope_freqs"  # mixed RoPE's parameter (timm's ``rope.freqs``, one layer's)

# Sequence lengths a fused implementation needs: JAX's cuDNN attention differentiates only
# even lengths (jax 0.10, `check_is_flash_attention`), and ViT-B/16 at 224 has 197 tokens.
SEQUENCE_MULTIPLE: dict[str, int] = {"cudnn": 2}


def padded_dot_product_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  implementation: str,
  multiple: int,
  lengths: Optional[jax.Array] = None,
) -> jax.Array:
  """`jax.nn.dot_product_attention` of [B, N, H, Dh] inputs with N padded to ``multiple``.

  The padded keys are masked out by length (``key_value_seq_lengths``, which cuDNN takes
  as a padding mask, not as a bias) and the padded queries' rows are dropped: the same
  function as the unpadded attention, values and gradients. ``lengths`` (int32 [B]):
  each example's keys beyond its length are masked out too (NaFlex padding).
  """
  b, n = q.shape[:2]
  padded = -(-n // multiple) * multiple
  if padded == n and lengths is None:
    return jax.nn.dot_product_attention(q, k, v, implementation=implementation)
  widths = ((0, 0), (0, padded - n), (0, 0), (0, 0))
  q, k, v = (jnp.pad(t, widths) for t in (q, k, v))  # [B, padded, H, Dh]
  lengths = jnp.full((b,), n, jnp.int32) if lengths is None else lengths.astype(jnp.int32)
  y = jax.nn.dot_product_attention(
    q, k, v, key_value_seq_lengths=lengths, implementation=implementation
  )
  return y[:, :n]  # [B, N, H, Dh]


class MultiHeadDotProductAttention(nn.Module):
  """Self-attention with the official `query/key/value/out` parameter layout.

  ``attention_impl`` chooses how the product runs, never the parameters or the function:
  `EINSUM` (the default): the projections write queries, keys and values head-major,
  [B, H, N, Dh], as the batched products need them, and the softmax's normalisation
  divides the [B, H, N, Dh] product rather than the [B, H, N, N] weights (the weights are
  formed only when sown or dropped out); any other
  value goes to `jax.nn.dot_product_attention` as its ``implementation`` ('xla', or a fused
  kernel such as 'cudnn' on GPU) with [B, N, H, Dh] inputs, padded to the sequence lengths
  the kernel takes (`padded_dot_product_attention`). On the CPU the einsum path
  compiled to less memory traffic and faster steps in training and inference (README,
  Performance). When the weights are needed (sown for inspection, or attention dropout in
  training) the einsum path runs whatever the choice.
  """

  num_heads: int
  execution: ExecutionOptions = ExecutionOptions()
  # Relative position embeddings (`posemb_lib.RelativePositions`): an offset table whose
  # logits are added to the content logits; they need the einsum path.
  relative: Optional[posemb_lib.RelativePositions] = None
  # Rotary position embeddings (`rope.RotaryPositions`), applied to the projected queries
  # and keys on every path (as timm's EVA attention: before the scaling); mixed RoPE's
  # learned frequencies are this layer's parameter ``rope_freqs`` [2, H, Dh / 2].
  rotary: Optional[rope_lib.RotaryPositions] = None
  qkv_bias: str = options.QKV_BIAS_ALL  # `options.QKV_BIASES`
  # Epsilon of a LayerNorm ``norm`` on the merged heads before ``out`` (None: none; EVA-02
  # CLIP's sub-LN, timm's ``scale_attn_inner``).
  norm_epsilon: Optional[float] = None

  def _out(self, y: jax.Array, w_out: jax.Array, b_out: jax.Array, heads_first: bool) -> jax.Array:
    """The output projection of y [B, H, N, Dh] (``heads_first``) or [B, N, H, Dh]."""
    if self.norm_epsilon is None:
      spec = "bhnk,hkd->bnd" if heads_first else "bnhk,hkd->bnd"
      return jnp.einsum(spec, y, w_out) + b_out  # [B, N, D]
    y = jnp.swapaxes(y, 1, 2) if heads_first else y  # [B, N, H, Dh]
    y = y.reshape(*y.shape[:2], -1)  # [B, N, H * Dh]
    ex = self.execution
    y = nn.LayerNorm(
      epsilon=self.norm_epsilon,
      dtype=ex.dtype,
      param_dtype=ex.param_dtype,
      scale_init=partitioned(nn.initializers.ones, (None,)),
      bias_init=partitioned(nn.initializers.zeros, (None,)),
      name="norm",
    )(y)
    return jnp.einsum("bnk,kd->bnd", y, w_out.reshape(-1, w_out.shape[-1])) + b_out

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    deterministic: bool,
    mask: Optional[jax.Array] = None,
    lengths: Optional[jax.Array] = None,
  ) -> jax.Array:
    """Attention along the second-last axis of x [..., N, D] (the leading axes are batch:
    the Axial-ViT's rows or columns); returns [..., N, D]. ``mask``: bool, broadcast to
    [B, H, N, N] (query, key), False where a query may not attend to a key (a text
    tower's padding or causal mask; it takes the einsum path). ``lengths``: int32 [B], the
    same mask as a count of valid tokens at the front (NaFlex padding), which lets a fused
    kernel run it as a padding mask (cuDNN's); the einsum path reads ``mask``."""
    lead = x.shape[:-2]
    x = x.reshape(-1, *x.shape[-2:])  # [B, N, D]
    ex = self.execution
    d = x.shape[-1]
    options.check_heads(d, self.num_heads)
    h, dh = self.num_heads, d // self.num_heads
    relative = None
    if self.relative is not None:
      if self.relative.num_patches + self.relative.num_prefix != x.shape[1]:
        raise errors.ConfigError(
          f"Relative positions of {self.relative} do not match {x.shape[1]} tokens."
        )
      relative = posemb_lib.relative_table(self, self.relative, h, dh, ex.param_dtype)
    options.check_qkv_bias(self.qkv_bias)
    biased = {options.QKV_BIAS_ALL: "qkv", options.QKV_BIAS_QV: "qv"}.get(self.qkv_bias, "")
    qkv = [
      Projection(
        1, (d, h, dh), (EMBED, HEADS, KV), (h, dh), (HEADS, KV), ex, name[0] in biased, name=name
      )()
      for name in ("query", "key", "value")
    ]
    w_out, b_out = Projection(2, (h, dh, d), (HEADS, KV, EMBED), (d,), (EMBED,), ex, name="out")()

    freqs = None  # mixed RoPE's learned frequencies of this layer, [2, H, Dh / 2]
    if self.rotary is not None and self.rotary.rope.kind == rope_lib.MIXED:
      init = rope_lib.init_mixed_freqs(self.rotary.rope.temperature)
      axes = (None, HEADS, None)
      freqs = self.param(MIXED_FREQS, partitioned(init, axes), (2, h, dh // 2), ex.param_dtype)

    use_dropout = not deterministic and ex.attention_dropout_rate > 0.0
    need_weights = use_dropout or self.is_mutable_collection("intermediates")
    fused = (ex.attention_impl or EINSUM) != EINSUM and (mask is None or lengths is not None)
    if fused and not need_weights and relative is None:
      q, k, v = (_biased(jnp.einsum("bnd,dhk->bnhk", x, w), b) for w, b in qkv)  # [B, N, H, Dh]
      if self.rotary is not None:
        q, k = (self.rotary.rotate(t, heads_first=False, freqs=freqs) for t in (q, k))
      multiple = SEQUENCE_MULTIPLE.get(ex.attention_impl, 1)
      y = padded_dot_product_attention(q, k, v, ex.attention_impl, multiple, lengths)
      out = self._out(y, w_out, b_out, heads_first=False)  # [B, N, D]
      return out.reshape(*lead, *out.shape[1:])
    q, k, v = (
      _biased(jnp.einsum("bnd,dhk->bhnk", x, w), None if b is None else b[:, None]) for w, b in qkv
    )  # [B, H, N, Dh]
    if self.rotary is not None:
      q, k = self.rotary.rotate(q, freqs=freqs), self.rotary.rotate(k, freqs=freqs)
    q = q / jnp.sqrt(dh).astype(ex.dtype)
    logits = jnp.einsum("bhqd,bhkd->bhqk", q, k).astype(jnp.float32)  # [B, H, N, N]
    if relative is not None:  # the same scaled query against the offsets' embeddings
      rel = posemb_lib.relative_logits(q, relative.astype(ex.dtype), self.relative)
      logits = logits + rel.astype(jnp.float32)  # [B, H, N, N]
    if mask is not None:  # as transformers' additive mask: the float32 minimum
      logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
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
    out = self._out(y, w_out, b_out, heads_first=True)  # [B, N, D]
    return out.reshape(*lead, *out.shape[1:])  # [..., N, D]
