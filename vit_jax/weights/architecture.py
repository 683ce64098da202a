"""A model's architecture read off the shapes of an official-layout parameter tree.

Official `.npz` files carry no config: everything but the GELU variant and the position
embedding kind of a parameter-free table (``sincos2d`` / ``none``) is in the shapes:

    embedding/kernel                     [ph, pw, C, D]  patch size, width
    Transformer/encoderblock_{i}/...     depth (or the leading axis of a scanned encoder)
    .../query/kernel                     [D, H, Dh]      heads
    .../MlpBlock_3/Dense_0/kernel        [D, M]          MLP width
    cls                                  present: classifier 'token', else 'gap'
    MAPHead_0/...                        classifier 'map' (the class token then kept apart)
    registers                            [1, R, D]       register tokens
    .../LayerScale_attention/scale       LayerScale (its init, unknowable, set to DINOv2's)
    Transformer/norm_pre, fc_norm        CLIP's norm before the blocks; the norm after pooling
    pre_logits/kernel                    [D, R]          representation size
    head/kernel                          [D or R, K]     classes
    Transformer/posembed_input/...       'learn' [1, N, D] / 'learn_2d' tables: grid
    .../relative_embedding               [O, H, Dh]      'relative' (O = 2N - 1 (+ 3): grid)
    .../row/..., .../column/...          an Axial-ViT block (its two halves)
    conv_root/kernel                     [7, 7, C, 64 w] ResNet root, width factor w
    block{s}/unit{u}/...                 ResNet stages and units per stage

and of an MLP-Mixer's (the official `models_mixer.py` tree, told apart by its ``stem``):

    stem/kernel                                  [ph, pw, C, D]  patch size, width
    MixerBlock_{i}/...                           depth
    MixerBlock_0/token_mixing/Dense_0/kernel     [N, Dt]         patches, token MLP
    MixerBlock_0/channel_mixing/Dense_0/kernel   [D, Dc]         channel MLP

and of a BiT ResNet-v2's (`models.bit`, told apart by its ``root_block``):

    root_block/conv_root/kernel                  [7, 7, C, 64 w] width factor w
    block{s}/unit{uu}/...                        stages and units per stage
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Optional

import flax.linen as nn
import ml_collections
import numpy as np
from flax import traverse_util

from vit_jax import errors, models
from vit_jax.models import posemb as posemb_lib
from vit_jax.weights import npz

POSEMB = "Transformer/posembed_input/pos_embedding"
POSEMB_X = "Transformer/posembed_input/pos_embedding_x"
POSEMB_Y = "Transformer/posembed_input/pos_embedding_y"
_BLOCK = re.compile(r"^Transformer/encoderblock_(\d+)/")
_QUERY = "MultiHeadDotProductAttention_1/query/kernel"  # inside a block
_MLP = "MlpBlock_3/Dense_0/kernel"
AXIAL_ROW = "row/"  # inside an Axial-ViT block: its row half (then ``column/``)
_RESNET_UNIT = re.compile(r"^block(\d+)/unit(\d+)/")
_ROOT_WIDTH = 64  # conv_root's output channels at width factor 1
_LAYER_SCALE = "LayerScale_attention/scale"  # inside a block
LAYER_SCALE_INIT = 1e-5  # a loaded LayerScale's init (DINOv2's; the stored scales replace it)
MIXER_STEM = "stem/kernel"
_MIXER_BLOCK = re.compile(r"^MixerBlock_(\d+)/")
_TOKEN_MLP = "MixerBlock_0/token_mixing/Dense_0/kernel"
_CHANNEL_MLP = "MixerBlock_0/channel_mixing/Dense_0/kernel"
BIT_ROOT = "root_block/conv_root/kernel"
_BIT_UNIT = re.compile(r"^block(\d+)/unit(\d+)/")


def _shapes(params: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
  flat = traverse_util.flatten_dict(nn.unbox(dict(params)), sep="/")
  return {k: tuple(np.shape(v)) for k, v in flat.items()}


def _block_shapes(shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, dict[str, tuple]]:
  """(depth, shapes of block 0 keyed by the path inside a block) for either layout."""
  scanned = f"Transformer/{npz.SCANNED_BLOCK}/"
  inner = {k[len(scanned) :]: s[1:] for k, s in shapes.items() if k.startswith(scanned)}
  if inner:
    return next(iter(shapes[scanned + k] for k in inner))[0], inner
  layers = {int(m.group(1)) for k in shapes if (m := _BLOCK.match(k))}
  first = "Transformer/encoderblock_0/"
  return len(layers), {k[len(first) :]: s for k, s in shapes.items() if k.startswith(first)}


def _resnet(
  shapes: Mapping[str, tuple[int, ...]], unknown: list[str]
) -> Optional[ml_collections.ConfigDict]:
  if "conv_root/kernel" not in shapes:
    return None
  units: dict[int, int] = {}
  for key in shapes:
    if m := _RESNET_UNIT.match(key):
      stage, unit = int(m.group(1)), int(m.group(2))
      units[stage] = max(units.get(stage, 0), unit)
  if sorted(units) != list(range(1, len(units) + 1)):
    unknown.append(f"ResNet stages (found block{sorted(units)}; expected block1..blockS)")
  return ml_collections.ConfigDict(
    {
      "num_layers": tuple(units[s] for s in sorted(units)),
      "width_factor": shapes["conv_root/kernel"][-1] / _ROOT_WIDTH,
    }
  )


def _official_name(config: ml_collections.ConfigDict) -> Optional[str]:
  """The registered variant with this architecture, if any."""

  def arch(c: ml_collections.ConfigDict) -> tuple:
    if models.is_mixer(c):
      fields = ("hidden_dim", "num_blocks", "tokens_mlp_dim", "channels_mlp_dim")
      return (models.MIXER, tuple(c.patches.size), *(c[f] for f in fields))
    if models.is_bit(c):
      return (models.BIT, tuple(c.resnet.num_layers), c.resnet.width_factor)
    t, r = c.transformer, c.get("resnet")
    return (
      tuple(c.patches.size),
      c.hidden_size,
      t.num_layers,
      t.mlp_dim,
      t.num_heads,
      None if r is None else (tuple(r.num_layers), r.width_factor),
      c.get("axial", False),
    )

  target = arch(config)
  same = [n for n in models.MODEL_NAMES if arch(models.get_model_config(n)) == target]

  # Variants that share an architecture (gap-norep and ViT, SigLIP and ViT-B/16, ...)
  # differ in what the shapes also show: pooling, registers, norms, LayerScale.
  def visible(c: ml_collections.ConfigDict) -> tuple:
    return (
      c.get("classifier"),
      c.get("num_registers", 0),
      bool(c.get("norm_pre")),
      bool(c.get("fc_norm")),
      c.get("layer_scale_init") is not None,
      bool(c.get("posemb_patches_only")),
    )

  alike = [n for n in same if visible(models.get_model_config(n)) == visible(config)]
  return (alike or same or [None])[0]


def posemb_kind(params: Mapping[str, Any]) -> Optional[str]:
  """'learn' or 'learn_2d' by the stored table, 'relative' by the attention layers' offset
  tables; None without one ('sincos2d' and 'none' have no parameters to tell them apart)."""
  shapes = _shapes(params)
  if POSEMB in shapes:
    return "learn"
  if any(k.endswith("/" + posemb_lib.RELATIVE_EMBEDDING) for k in shapes):
    return posemb_lib.RELATIVE
  if POSEMB_X in shapes and POSEMB_Y in shapes:
    return "learn_2d"
  return None


def is_mixer(params: Mapping[str, Any]) -> bool:
  """Whether a parameter tree is an MLP-Mixer's (it has the Mixer's ``stem``)."""
  return MIXER_STEM in _shapes(params)


def _describe_mixer(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
  kernel = shapes[MIXER_STEM]
  tokens, channels = shapes.get(_TOKEN_MLP), shapes.get(_CHANNEL_MLP)
  return {
    "patch size": kernel[:2],
    "input channels": kernel[2],
    "width": kernel[3],
    "depth": len({m.group(1) for k in shapes if (m := _MIXER_BLOCK.match(k))}) or None,
    "patches": tokens[0] if tokens else None,
    "token MLP dim": tokens[1] if tokens else None,
    "channel MLP dim": channels[1] if channels else None,
  }


def describe(params: Mapping[str, Any]) -> dict[str, Any]:
  """What the shapes say of the model, each None where they do not say it: patch size,
  input channels, width, depth, heads, MLP dim, position embedding, ResNet root (for a
  Mixer: patch size, input channels, width, depth, patches, token and channel MLP dims;
  for a BiT: stages, units per stage, width factor)."""
  shapes = _shapes(params)
  if MIXER_STEM in shapes:
    return _describe_mixer(shapes)
  if BIT_ROOT in shapes:
    return _describe_bit(shapes)
  kernel = shapes.get("embedding/kernel")
  kernel = kernel if kernel and len(kernel) == 4 else None
  depth, block = _block_shapes(shapes)
  axial = AXIAL_ROW + _QUERY in block  # an Axial-ViT block: a row and a column block
  query = block.get(AXIAL_ROW + _QUERY if axial else _QUERY)
  mlp = block.get(AXIAL_ROW + _MLP if axial else _MLP)
  return {
    "patch size": kernel[:2] if kernel else None,
    "input channels": kernel[2] if kernel else None,
    "width": kernel[3] if kernel else None,
    "depth": depth or None,
    "heads": query[1] if query and len(query) == 3 else None,
    "MLP dim": mlp[-1] if mlp else None,
    "position embedding": posemb_kind(params),
    "ResNet root": "conv_root/kernel" in shapes,
    "axial": axial,
  }


def infer_model_config(params: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """The model config (`vit_jax.models.variants` layout) that ``params`` were made for.

  Its ``name`` is the official variant's when the architecture is one, else 'custom'.
  Raises one ValueError naming everything that cannot be read from the shapes.
  """
  shapes = _shapes(params)
  arch = describe(params)
  if BIT_ROOT in shapes:
    return _infer_bit(arch)
  if MIXER_STEM in shapes:
    return _infer_mixer(arch)
  unknown: list[str] = []
  if arch["width"] is None:
    unknown.append("patch size and width (no embedding/kernel [ph, pw, C, D])")
  if arch["depth"] is None:
    unknown.append("depth (no Transformer/encoderblock_{i} or scanned encoderblock arrays)")
  elif arch["heads"] is None:
    unknown.append(f"heads (no {_QUERY} [D, H, Dh] in the first encoder block)")
  if arch["depth"] is not None and arch["MLP dim"] is None:
    unknown.append(f"MLP width (no {_MLP} in the first encoder block)")
  if arch["position embedding"] is None:
    unknown.append(
      "position embeddings (no learned table: 'sincos2d' and 'none' have no "
      "parameters to tell them apart)"
    )
  resnet = _resnet(shapes, unknown)
  if unknown:
    raise errors.CheckpointError(
      "Cannot infer the architecture from the checkpoint's arrays: "
      + "; ".join(unknown)
      + ". Pass the model explicitly (--model=NAME, "
      f"one of {', '.join(models.MODEL_NAMES)})."
    )

  config = models.get_model_config("testing")  # every field, then overwritten
  config.patches.size = tuple(arch["patch size"])
  config.hidden_size = arch["width"]
  config.transformer.num_layers = arch["depth"]
  config.transformer.mlp_dim = arch["MLP dim"]
  config.transformer.num_heads = arch["heads"]
  _read_family_options(config, shapes)
  config.posemb = arch["position embedding"]
  config.axial = arch["axial"]
  if "pre_logits/kernel" in shapes:
    config.representation_size = shapes["pre_logits/kernel"][-1]
  if resnet is not None:
    config.resnet = resnet
  config.name = _official_name(config) or "custom"
  return config


def _read_family_options(config: ml_collections.ConfigDict, shapes: Mapping[str, tuple]) -> None:
  """The options of the later ViTs that the shapes show: pooling, prefix tokens, norms,
  LayerScale, and whether the position table has rows for the prefix tokens."""
  has_cls = "cls" in shapes
  config.classifier = "map" if any(k.startswith("MAPHead_0/") for k in shapes) else "gap"
  if has_cls:
    config.classifier = "token" if config.classifier == "gap" else config.classifier
    config.class_token = True if config.classifier != "token" else None
  config.num_registers = shapes["registers"][1] if "registers" in shapes else 0
  config.norm_pre = "Transformer/norm_pre/scale" in shapes
  config.fc_norm = "fc_norm/scale" in shapes
  if _LAYER_SCALE in _block_shapes(shapes)[1]:
    config.layer_scale_init = LAYER_SCALE_INIT
  prefix = int(has_cls) + config.num_registers
  if POSEMB in shapes and prefix:  # a square table without the prefix rows: patches only
    rows = shapes[POSEMB][1]
    config.posemb_patches_only = _is_square(rows) and not _is_square(rows - prefix)


def _is_square(n: int) -> bool:
  return n >= 0 and math.isqrt(n) ** 2 == n


def num_prefix_rows(config: ml_collections.ConfigDict) -> int:
  """Rows of the learned 1-D position table before the grid's: the prefix tokens', unless
  the table covers the patches only."""
  if config.get("posemb_patches_only", False):
    return 0
  return models.create_model(config, num_classes=None).num_prefix_tokens


def _infer_mixer(arch: Mapping[str, Any]) -> ml_collections.ConfigDict:
  missing = [name for name, value in arch.items() if value is None]
  if missing:
    raise errors.CheckpointError(
      "Cannot infer the Mixer architecture from the checkpoint's arrays: no "
      + ", ".join(missing)
      + f" (from MixerBlock_{{i}}, {_TOKEN_MLP} and {_CHANNEL_MLP})."
    )
  config = models.get_model_config("Mixer-B_16")  # every field, then overwritten
  config.patches.size = tuple(arch["patch size"])
  config.hidden_dim = arch["width"]
  config.num_blocks = arch["depth"]
  config.tokens_mlp_dim = arch["token MLP dim"]
  config.channels_mlp_dim = arch["channel MLP dim"]
  config.name = _official_name(config) or "custom"
  return config


def _describe_bit(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
  units: dict[int, int] = {}
  for key in shapes:
    if m := _BIT_UNIT.match(key):
      units[int(m.group(1))] = max(units.get(int(m.group(1)), 0), int(m.group(2)))
  stages = sorted(units)
  return {
    "stages": stages,
    "units per stage": tuple(units[s] for s in stages),
    "width factor": shapes[BIT_ROOT][-1] / _ROOT_WIDTH,
  }


def _infer_bit(arch: Mapping[str, Any]) -> ml_collections.ConfigDict:
  stages, width = arch["stages"], arch["width factor"]
  if not stages or stages != list(range(1, len(stages) + 1)) or not width.is_integer():
    raise errors.CheckpointError(
      f"Cannot infer the BiT ResNet from the checkpoint's arrays: stages block{stages} "
      f"(expected block1..blockS) and a root of {_ROOT_WIDTH * width:g} channels (64 x a "
      "whole width factor)."
    )
  config = models.get_model_config("BiT-R50x1")  # every field, then overwritten
  config.resnet.num_layers = arch["units per stage"]
  config.resnet.width_factor = int(width)
  config.name = _official_name(config) or "custom"
  return config


def _relative_grid(
  shapes: Mapping[str, tuple[int, ...]], config: ml_collections.ConfigDict
) -> Optional[tuple[int, int]]:
  """The grid of the first block's relative offset tables: an Axial-ViT's row and column
  tables (2 gw - 1, 2 gh - 1 rows), else the square grid of 2N - 1 offsets (+ 3 prefix
  rows)."""
  _, block = _block_shapes(shapes)
  table = "MultiHeadDotProductAttention_1/" + posemb_lib.RELATIVE_EMBEDDING
  if AXIAL_ROW + table in block and "column/" + table in block:
    return (block["column/" + table][0] + 1) // 2, (block[AXIAL_ROW + table][0] + 1) // 2
  if table not in block:
    return None
  prefix = 3 if models.create_model(config, num_classes=None).num_prefix_tokens else 0
  return posemb_lib.square_grid((block[table][0] - prefix + 1) // 2, "pass the image size")


def num_classes(params: Mapping[str, Any]) -> Optional[int]:
  """The head's class count; None for a checkpoint without a head."""
  head = _shapes(params).get("head/kernel")
  return head[-1] if head else None


def trained_image_size(
  params: Mapping[str, Any], config: ml_collections.ConfigDict
) -> Optional[tuple[int, int]]:
  """The (height, width) the learned position embeddings were trained for; None without
  a learned table. A 1-D table is taken to be a square grid."""
  shapes = _shapes(params)
  if MIXER_STEM in shapes:  # the token-mixing MLP fixes the number of patches
    tokens = shapes.get(_TOKEN_MLP)
    if tokens is None:
      return None
    grid = posemb_lib.square_grid(tokens[0], "pass the image size (--resolution)")
  elif POSEMB in shapes:
    prefix = num_prefix_rows(config)
    grid = posemb_lib.square_grid(shapes[POSEMB][1] - prefix, "pass the image size (--resolution)")
  elif POSEMB_X in shapes and POSEMB_Y in shapes:
    grid = shapes[POSEMB_Y][1], shapes[POSEMB_X][2]
  elif relative := _relative_grid(shapes, config):
    grid = relative
  else:
    return None
  stride = models.create_model(config, num_classes=None).input_stride
  return grid[0] * stride[0], grid[1] * stride[1]
