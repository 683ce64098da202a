"""Rows and conversions timm's ViT (`vit.py`) and Eva (`eva.py`) tables share, numpy only:
the attention and MLP rows, the attention pool's (``AttentionPoolLatent``, the MAP head),
and the patch bias that a norm before the blocks leaves timm without."""

from __future__ import annotations

import numpy as np

from vit_jax import models
from vit_jax.models import options
from vit_jax.weights import architecture, tensor_table
from vit_jax.weights.tensor_table import Row, rows


def attention_rows(
  ours: str, theirs: str, num_heads: int, fused: tuple[str, ...], qkv_bias: bool = True
) -> list[Row]:
  """Our query/key/value/out <-> timm's attention: the ``fused`` ones (``qkv``: all three;
  the MAP head's ``kv``: key and value) as parts of one array, ``q`` and ``proj`` apart;
  ``qkv_bias`` False: no query/key/value biases (timm's ``qkv_bias=False``)."""
  table = []
  for name in ("query", "key", "value"):
    key = f"{theirs}q" if name not in fused else f"{theirs}{'qkv' if len(fused) == 3 else 'kv'}"
    part = (fused.index(name), len(fused)) if name in fused else None
    table.append(
      Row(f"{ours}{name}/kernel", f"{key}.weight", tensor_table.heads_in(num_heads), part)
    )
    if qkv_bias:
      table.append(
        Row(f"{ours}{name}/bias", f"{key}.bias", tensor_table.heads_bias(num_heads), part)
      )
  table.append(Row(f"{ours}out/kernel", f"{theirs}proj.weight", tensor_table.heads_out(num_heads)))
  table.append(Row(f"{ours}out/bias", f"{theirs}proj.bias"))
  return table


def mlp_rows(ours: str, theirs: str, mlp: str = options.MLP) -> list[Row]:
  """Our ``MlpBlock`` (``Dense_0``, ``Dense_1``) <-> timm's ``Mlp`` (``fc1``, ``fc2``), or
  (``swiglu_fused``: timm's ``GluMlp`` with SiLU, the gate first, DINOv2-g's) the fused
  SwiGLU's ``fc1`` [D, 2M] and ``fc2``."""
  first, second = ("Dense_0", "Dense_1") if mlp == options.MLP else ("fc1", "fc2")
  return [
    *rows(f"{ours}/{first}", f"{theirs}.fc1", tensor_table.DENSE),
    *rows(f"{ours}/{second}", f"{theirs}.fc2", tensor_table.DENSE),
  ]


def map_head_rows(num_heads: int) -> list[Row]:
  """Our ``MAPHead_0`` <-> timm's ``AttentionPoolLatent`` (latent, q, fused kv, proj, norm,
  mlp) of ``num_heads`` heads: timm's ViT's and Eva's (Perception Encoder) alike."""
  att = "MAPHead_0/MultiHeadDotProductAttention_0/"
  return [
    Row("MAPHead_0/probe", "attn_pool.latent"),
    *attention_rows(att, "attn_pool.", num_heads, ("key", "value")),
    *rows("MAPHead_0/LayerNorm_0", "attn_pool.norm"),
    *mlp_rows("MAPHead_0/MlpBlock_0", "attn_pool.mlp"),
  ]


def fold_patch_bias(flat: dict[str, np.ndarray], config: models.Settings) -> dict[str, np.ndarray]:
  """``flat`` with the patch bias as timm holds it: its patch convolution has one unless a
  norm precedes the blocks (CLIP, PE); there ours, if any, is added to the position rows of
  the patches (the same input to the norm); elsewhere a model without one
  (``patch_bias=False``) writes zeros."""
  flat = dict(flat)
  bias = flat.pop("embedding/bias", None)
  if config.norm_pre and bias is not None:
    posemb = flat[architecture.POSEMB].copy()
    posemb[:, architecture.num_prefix_rows(config) :] += bias
    flat[architecture.POSEMB] = posemb
  elif not config.norm_pre:
    flat["embedding/bias"] = np.zeros(config.hidden_size, np.float32) if bias is None else bias
  return flat
