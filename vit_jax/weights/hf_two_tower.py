"""transformers' image-text models <-> our two-tower parameters: ``SiglipModel``,
``Siglip2Model`` and ``CLIPModel`` folders as ``save_pretrained`` writes them, one table of
arrays read both ways (`table`, through `tensor_table`).

What each is here (`models.image_text`, `models.text`):
- SigLIP: a ViT without class token pooled by attention (``MAPHead_0``, transformers'
  ``head`` with torch's packed ``in_proj``), no image projection (``image_head='none'``);
  a text tower pooled at its last position and projected with a bias; ``logit_scale`` is
  our ``t``, ``logit_bias`` our ``b``. transformers' tokenizers return an attention mask
  and its text model uses it: the text settings' ``pad_id`` / ``eos_id`` mask the same keys.
- SigLIP 2 (NaFlex) at one fixed square grid: its patch embedding is a Dense on pixels
  flattened (row, column, channel) per patch, our convolution's kernel; its position table
  is resampled to that grid as transformers resamples it for a square image (an
  antialiased triangle filter, `naflex_positions`; the identity at the stored grid). The
  grid is the image processor's ``max_num_patches`` (its square root; the stored table's
  when absent). Not supported: other aspect ratios or patch counts per image (NaFlex's
  variable grids and padded patches); images are resized to the square.
- CLIP: a ViT with class token, ``pre_layrnorm`` (our ``norm_pre``) and QuickGELU; both
  projections without bias (``image_head='linear'``, text ``head_bias=False``); a causal
  text tower pooled at the first end token (``eos_token_id`` 2: the largest id, as
  transformers' legacy configs); a temperature and no bias. transformers' patch
  convolution has no bias: ours is read as zeros and, on export, added to the patches'
  position rows (the same sum).
"""

from __future__ import annotations

import math
import os
from typing import Any, Optional

import ml_collections
import numpy as np
from flax import traverse_util

from vit_jax import errors, models
from vit_jax.aliases import Params
from vit_jax.data import data_config as data_config_lib
from vit_jax.data import folder_tokenizer
from vit_jax.weights import files, hf, tensor_table
from vit_jax.weights.tensor_table import CONV, DENSE, Layout, Row, rows

# model_type -> the architecture transformers saves it as.
ARCHITECTURES = {"siglip": "SiglipModel", "siglip2": "Siglip2Model", "clip": "CLIPModel"}
# transformers' hidden_act -> (our activation, tanh GELU?)
_ACTIVATIONS = {
  "gelu_pytorch_tanh": ("gelu", True),
  "gelu_new": ("gelu", True),
  "gelu": ("gelu", False),
  "quick_gelu": ("quick_gelu", False),
}
_LEGACY_CLIP_EOS = 2  # transformers' CLIP pools the largest id when eos_token_id is 2
POSEMB = "img/Transformer/posembed_input/pos_embedding"
PATCH_BIAS = "img/embedding/bias"


def model_type(directory: str) -> Optional[str]:
  """The two-tower model_type of the transformers folder ``directory``, or None."""
  path = os.path.join(directory, hf.CONFIG)
  if not os.path.isfile(path):
    return None
  found = files.read_json(path).get("model_type")
  return found if found in ARCHITECTURES else None


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


# ---------------------------------------------------------------------- reading

PROCESSOR = "processor_config.json"  # transformers 5 saves the image processor in it


def image_processor(directory: str) -> tuple[Optional[dict[str, Any]], str]:
  """The folder's image processor config and its file: ``preprocessor_config.json``, else
  ``processor_config.json``'s ``image_processor`` (what transformers 5 saves); None: none."""
  for name in (hf.PREPROCESSOR, PROCESSOR):
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      found = files.read_json(path)
      found = found.get("image_processor", found) if name == PROCESSOR else found
      if isinstance(found, dict):
        return found, path
  return None, directory


def read_data_config(
  directory: str, config: ml_collections.ConfigDict, image_size: tuple[int, int]
) -> data_config_lib.DataConfig:
  """The folder's image preprocessing; without an image processor the official recipe
  with the image tower's mean and std. SigLIP 2's processor resizes to ``image_size``."""
  processor, path = image_processor(directory)
  if processor is None:
    image = config.image
    return data_config_lib.official(image_size, tuple(image.input_mean), tuple(image.input_std))
  return data_config_lib.from_hf_processor(processor, image_size, repr(path))


def _sub(config: dict[str, Any], key: str, path: str) -> dict[str, Any]:
  value = config.get(key)
  if not isinstance(value, dict):
    raise errors.CheckpointError(f"{path!r}: {key} is {value!r}, not an object.")
  return value


def _activation(sub: dict[str, Any], path: str) -> tuple[str, bool]:
  act = sub.get("hidden_act", "gelu_pytorch_tanh")
  if act not in _ACTIVATIONS:
    raise errors.CheckpointError(
      f"{path!r}: hidden_act {act!r} is none this package computes ({', '.join(_ACTIVATIONS)})."
    )
  return _ACTIVATIONS[act]


def _eps(sub: dict[str, Any], path: str, default: float) -> float:
  return hf.layer_norm_eps({"layer_norm_eps": sub.get("layer_norm_eps", default)}, path)


def _ints(sub: dict[str, Any], path: str, *keys: str) -> list[int]:
  return [files.field(sub, key, int, path) for key in keys]


def _grid(directory: str, kind: str, vision: dict[str, Any], path: str) -> tuple[int, int]:
  """The image's patch grid: from image_size (SigLIP, CLIP) or, for SigLIP 2, the square
  root of the image processor's max_num_patches (else of the stored table's)."""
  patch = files.field(vision, "patch_size", int, path)
  if kind != "siglip2":
    size = files.field(vision, "image_size", int, path)
    return size // patch, size // patch
  count = files.field(vision, "num_patches", int, path)
  processor, processor_path = image_processor(directory)
  count = (processor or {}).get("max_num_patches", count)
  if not isinstance(count, int) or isinstance(count, bool) or count < 1:
    raise errors.CheckpointError(f"{processor_path!r}: max_num_patches {count!r} is no count.")
  side = math.isqrt(count)
  return side, side


def _config(directory: str, kind: str) -> tuple[ml_collections.ConfigDict, tuple[int, int]]:
  """Our two-tower model config of a transformers folder, and the image grid."""
  path = os.path.join(directory, hf.CONFIG)
  config = files.read_json(path)
  vision, text = _sub(config, "vision_config", path), _sub(config, "text_config", path)
  width, mlp, depth, heads, patch = _ints(
    vision, path, "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "patch_size",
  )  # fmt: skip
  activation, approximate = _activation(vision, path)
  clip = kind == "clip"
  if not clip and vision.get("vision_use_head", True) is not True:
    raise errors.CheckpointError(
      f"{path!r}: vision_use_head is false: a {ARCHITECTURES[kind]} without its attention "
      "pooling has no image embedding."
    )
  image = models.get_model_config("ViT-B_16")
  image.name = f"{kind}-image"
  image.patches.size = (patch, patch)
  image.hidden_size = width
  image.transformer.update(num_layers=depth, mlp_dim=mlp, num_heads=heads)
  image.classifier = "token" if clip else "map"
  image.update(activation=activation, gelu_approximate=approximate, norm_pre=clip)
  image.layer_norm_epsilon = _eps(vision, path, 1e-5 if clip else 1e-6)
  data = read_data_config(directory, ml_collections.ConfigDict({"image": image}), (1, 1))
  image.input_mean, image.input_std = tuple(data.mean), tuple(data.std)

  tokenizer = folder_tokenizer.read_folder_tokenizer(directory)
  t_width, t_mlp, t_depth, t_heads, vocab, length = _ints(
    text, path, "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "vocab_size", "max_position_embeddings",
  )  # fmt: skip
  t_act, t_approximate = _activation(text, path)
  eos = text.get("eos_token_id", tokenizer.eos_id)  # CLIP pools at the config's
  text_settings = dict(
    width=t_width, depth=t_depth, mlp_dim=t_mlp, num_heads=t_heads, vocab_size=vocab,
    activation=t_act, gelu_approximate=t_approximate,
    layer_norm_epsilon=_eps(text, path, 1e-5 if clip else 1e-6),
    pad_id=tokenizer.pad_id, eos_id=tokenizer.eos_id,
  )  # fmt: skip
  if clip:
    pool = "argmax" if eos == _LEGACY_CLIP_EOS else "eos"
    text_settings.update(pool=pool, causal=True, head_bias=False, eos_id=eos)
    embed_dim = files.field(config, "projection_dim", int, path)
  else:
    text_settings.update(pool="last")
    embed_dim = int(text.get("projection_size") or t_width)
  two_tower = models.two_tower_config(
    image, text=text_settings, text_len=length, embed_dim=embed_dim,
    loss="softmax" if clip else "sigmoid", name=ARCHITECTURES[kind],
    image_head="linear" if clip else "none",
  )  # fmt: skip
  return two_tower, _grid(directory, kind, vision, path)


def read_dir(
  directory: str,
) -> tuple[ml_collections.ConfigDict, Params, None, tuple[int, int]]:
  """(model config, params, no class names, image size) of a SigLIP, SigLIP 2 or CLIP
  folder (`sources.Reader`); its tokenizer is `read_tokenizer`."""
  kind = model_type(directory)
  config, grid = _config(directory, kind)
  settings = models.model_settings(config)
  tensors = hf.read_tensors(directory)
  source = f"{directory!r} ({ARCHITECTURES[kind]})"
  tensors = {k: v for k, v in tensors.items() if not k.endswith("position_ids")}
  rows_ = table(kind, settings)
  params = tensor_table.from_torch(
    rows_, tensors, source, ARCHITECTURES[kind], library="transformers"
  )
  flat = tensor_table.flat_float32(params)
  if kind == "siglip2":
    flat[POSEMB] = naflex_positions(flat[POSEMB][0], grid)[None]
  if kind == "clip":
    flat[PATCH_BIAS] = np.zeros(settings.image.hidden_size, np.float32)
  patch = settings.image.patches.size
  params = traverse_util.unflatten_dict(flat, sep="/")
  return config, params, None, (grid[0] * patch[0], grid[1] * patch[1])


def read_tokenizer(directory: str) -> folder_tokenizer.FolderTokenizer:
  """The folder's tokenizer (`data.folder_tokenizer`)."""
  return folder_tokenizer.read_folder_tokenizer(directory)
