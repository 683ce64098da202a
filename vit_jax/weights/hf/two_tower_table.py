"""The one table of arrays between our two-tower parameters and transformers'
``SiglipModel``, ``Siglip2Model`` and ``CLIPModel`` state dicts (`table`, read both ways
through `tensor_table` by `two_tower`), and SigLIP 2's position table at a square grid
(`naflex_positions`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vit_jax.weights import tensor_table
from vit_jax.weights.tensor_table import CONV, DENSE, Layout, Row, rows

# model_type -> the architecture transformers saves it as.
ARCHITECTURES = {"siglip": "SiglipModel", "siglip2": "Siglip2Model", "clip": "CLIPModel"}
POSEMB = "img/Transformer/posembed_input/pos_embedding"
PATCH_BIAS = "img/embedding/bias"


# ------------------------------------------------------------------------ the table


def _unsqueeze(axes: int) -> Layout:
  """Ours with ``axes`` leading unit axes <-> torch's without them."""
  return Layout(lambda x: x.reshape(x.shape[axes:]), lambda x: x.reshape((1,) * axes + x.shape))


def _encoder_rows(ours: str, theirs: str, depth: int, heads: int) -> list[Row]:
  """The pre-LN blocks shared by every tower: ``encoderblock_i`` <-> ``encoder.layers.i``."""
  table = []
  for i in range(depth):
    o, t = f"{ours}encoderblock_{i}/", f"{theirs}encoder.layers.{i}."
    att = o + "MultiHeadDotProductAttention_1/"
    for name, proj in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
      table += [
        Row(f"{att}{name}/kernel", f"{t}self_attn.{proj}.weight", tensor_table.heads_in(heads)),
        Row(f"{att}{name}/bias", f"{t}self_attn.{proj}.bias", tensor_table.heads_bias(heads)),
      ]
    table += [
      Row(f"{att}out/kernel", f"{t}self_attn.out_proj.weight", tensor_table.heads_out(heads)),
      Row(f"{att}out/bias", f"{t}self_attn.out_proj.bias"),
      *rows(o + "LayerNorm_0", t + "layer_norm1"),
      *rows(o + "LayerNorm_2", t + "layer_norm2"),
      *rows(o + "MlpBlock_3/Dense_0", t + "mlp.fc1", DENSE),
      *rows(o + "MlpBlock_3/Dense_1", t + "mlp.fc2", DENSE),
    ]
  return table


def _map_head_rows(heads: int) -> list[Row]:
  """Our ``MAPHead_0`` <-> SigLIP's ``head`` (torch's MultiheadAttention: q, k, v packed)."""
  o, t = "img/MAPHead_0/", "vision_model.head."
  att = o + "MultiHeadDotProductAttention_0/"
  table = [Row(o + "probe", t + "probe")]
  for i, name in enumerate(("query", "key", "value")):
    table += [
      Row(f"{att}{name}/kernel", t + "attention.in_proj_weight", tensor_table.heads_in(heads),
          part=(i, 3)),
      Row(f"{att}{name}/bias", t + "attention.in_proj_bias", tensor_table.heads_bias(heads),
          part=(i, 3)),
    ]  # fmt: skip
  return table + [
    Row(att + "out/kernel", t + "attention.out_proj.weight", tensor_table.heads_out(heads)),
    Row(att + "out/bias", t + "attention.out_proj.bias"),
    *rows(o + "LayerNorm_0", t + "layernorm"),
    *rows(o + "MlpBlock_0/Dense_0", t + "mlp.fc1", DENSE),
    *rows(o + "MlpBlock_0/Dense_1", t + "mlp.fc2", DENSE),
  ]


def _patch_dense(patch: tuple[int, int]) -> Layout:
  """Our patch kernel [ph, pw, C, D] <-> SigLIP 2's Dense weight [D, ph * pw * C]."""
  return Layout(
    lambda k: np.ascontiguousarray(k.reshape(-1, k.shape[-1]).T),
    lambda w: np.ascontiguousarray(w.T.reshape(*patch, -1, w.shape[0])),
  )


def table(kind: str, settings: Any) -> list[Row]:
  """Every array of a ``kind`` (a model_type) model of two-tower ``settings``."""
  image, text = settings.image, settings.text
  v, tm = "vision_model.", "text_model."
  emb = v + "embeddings."
  out = [
    *_encoder_rows("img/Transformer/", v, image.transformer.num_layers,
                   image.transformer.num_heads),
    *rows("img/Transformer/encoder_norm", v + "post_layernorm"),
    Row(POSEMB, emb + "position_embedding.weight", _unsqueeze(1)),
    *_encoder_rows("txt/Encoder_0/", tm, text.depth, text.num_heads),
    *rows("txt/Encoder_0/encoder_norm", tm + "final_layer_norm"),
    Row("txt/Embed_0/embedding", tm + "embeddings.token_embedding.weight"),
    Row("txt/pos_embedding", tm + "embeddings.position_embedding.weight", _unsqueeze(1)),
  ]  # fmt: skip
  if kind == "clip":
    return out + [
      Row("img/embedding/kernel", emb + "patch_embedding.weight", CONV),
      Row("img/cls", emb + "class_embedding", _unsqueeze(2)),
      *rows("img/Transformer/norm_pre", v + "pre_layrnorm"),
      Row("img_head/kernel", "visual_projection.weight", DENSE),
      Row("txt/head/kernel", "text_projection.weight", DENSE),
      Row("t", "logit_scale", Layout(lambda x: x.reshape(()), lambda x: x.reshape(1))),
    ]
  patch = _patch_dense(image.patches.size) if kind == "siglip2" else CONV
  return out + [
    *rows("img/embedding", emb + "patch_embedding", patch),
    *_map_head_rows(image.transformer.num_heads),
    *rows("txt/head", tm + "head", DENSE),
    Row("t", "logit_scale"),
    Row("b", "logit_bias"),
  ]


# ------------------------------------------------------------------ SigLIP 2's positions


def _triangle_weights(size: int, grid: int) -> np.ndarray:
  """[size, grid]: transformers' antialiased linear resampling of ``grid`` cells to
  ``size`` (align_corners=False): a triangle of half-width max(grid / size, 1)."""
  scale = grid / size
  support = max(scale, 1.0)
  centre = (np.arange(size, dtype=np.float64) + 0.5) * scale - 0.5  # [size]
  weights = np.clip(1 - np.abs(np.arange(grid)[None] - centre[:, None]) / support, 0, None)
  return weights / weights.sum(-1, keepdims=True)


def naflex_positions(table_: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
  """SigLIP 2's position table [S * S, D] resampled to ``grid`` -> [gh * gw, D], as
  transformers resamples it for an image of that many patches."""
  side = math.isqrt(table_.shape[0])
  square = table_.reshape(side, side, -1).astype(np.float64)
  rows_, cols = _triangle_weights(grid[0], side), _triangle_weights(grid[1], side)
  out = np.einsum("hs,wt,std->hwd", rows_, cols, square)
  return out.reshape(grid[0] * grid[1], -1).astype(np.float32)
