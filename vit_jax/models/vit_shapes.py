"""A ViT's architecture read off the shapes of its parameter tree (official layout).

    embedding/kernel                     [ph, pw, C, D]  patch size, width
    Transformer/encoderblock_{i}/...     depth (or the leading axis of a scanned encoder)
    .../query/kernel                     [D, H, Dh]      heads
    .../MlpBlock_3/Dense_0/kernel        [D, M]          MLP width
    cls                                  present: classifier 'token', else 'gap'
    MAPHead_0/...                        classifier 'map' (the class token then kept apart;
                                         its own heads and MLP width where they differ)
    registers                            [1, R, D]       register tokens
    .../LayerScale_attention/scale       LayerScale (its init, unknowable, set to DINOv2's)
    Transformer/norm_pre, fc_norm        CLIP's norm before the blocks; the norm after pooling
    Transformer/encoder_norm             absent (and no fc_norm): no final norm (PE spatial)
    pre_logits/kernel                    [D, R]          representation size
    Transformer/posembed_input/...       'learn' [1, N, D] / 'learn_2d' tables: grid
    .../relative_embedding               [O, H, Dh]      'relative' (O = 2N - 1 (+ 3): grid)
    .../row/..., .../column/...          an Axial-ViT block (its two halves)
    conv_root/kernel                     [7, 7, C, 64 w] ResNet root, width factor w
    block{s}/unit{u}/...                 ResNet stages and units per stage

Everything but the GELU variant and the kind of a parameter-free position embedding
(``sincos2d`` / ``none``) is in the shapes. ``shapes`` maps 'a/b/c' paths to shapes.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Mapping, Optional

from vit_jax.infra import errors
from vit_jax.models import options, settings, variants
from vit_jax.models import posemb as posemb_lib
from vit_jax.models.bit import ROOT_WIDTH
from vit_jax.models.settings import (
  ModelSettings,
  PatchSettings,
  ResNetSettings,
  TransformerSettings,
)
from vit_jax.models.vit import SCANNED_BLOCK

Shapes = Mapping[str, tuple[int, ...]]

EMBEDDING = "embedding/kernel"
POSEMB = "Transformer/posembed_input/pos_embedding"
POSEMB_X = "Transformer/posembed_input/pos_embedding_x"
POSEMB_Y = "Transformer/posembed_input/pos_embedding_y"
_BLOCK = re.compile(r"^Transformer/encoderblock_(\d+)/")
_QUERY = "MultiHeadDotProductAttention_1/query/kernel"  # inside a block
_MLP = "MlpBlock_3/Dense_0/kernel"
_SWIGLU = "MlpBlock_3/fc1_g/kernel"  # a split SwiGLU's gate [D, M]
_SWIGLU_FUSED = "MlpBlock_3/fc1/kernel"  # a fused SwiGLU's gate and value [D, 2M]
_ATTENTION = "MultiHeadDotProductAttention_1/"
MAP_QUERY = "MAPHead_0/MultiHeadDotProductAttention_0/query/kernel"  # [D, H, Dh]
AXIAL_ROW = "row/"  # inside an Axial-ViT block: its row half (then ``column/``)
_RESNET_UNIT = re.compile(r"^block(\d+)/unit(\d+)/")
_LAYER_SCALE = "LayerScale_attention/scale"  # inside a block
LAYER_SCALE_INIT = 1e-5  # a loaded LayerScale's init (DINOv2's; the stored scales replace it)
FIT_ADVICE = (
  "  Fix: build the model with the checkpoint's architecture (width, depth, heads, MLP "
  "dim, posemb), or load a checkpoint of this model."
)


def architecture_key(model_config: Any) -> tuple:
  """What the parameter shapes fix of a ViT config: two configs with the same key load
  the same checkpoints (up to the options `visible_options` tells apart)."""
  t, r = model_config.transformer, model_config.get("resnet")
  return (
    tuple(model_config.patches.size),
    model_config.hidden_size,
    t.num_layers,
    t.mlp_dim,
    t.num_heads,
    None if r is None else (tuple(r.num_layers), r.width_factor),
    model_config.get("axial", False),
  )


# The optional fields that leave no trace in the parameter shapes (or that
# `architecture_key` holds): the rest tell variants of one architecture apart.
_NOT_IN_SHAPES = frozenset(
  {"stoch_depth", "head_bias_init", "axial", "class_token", "layer_norm_epsilon"}
  | {"activation", "input_mean", "input_std", "map_include_prefix"}
  | {f.name for f in dataclasses.fields(ModelSettings) if f.name.startswith("rope")}
)


def visible_options(model_config: Any) -> tuple:
  """The pooling and every optional field that the shapes also show (registers, norms,
  LayerScale, a position table without prefix rows, ...): what tells apart variants of
  one architecture (gap-norep and ViT, SigLIP and ViT-B/16, ...)."""
  shown = (k for k in settings.optional_fields() if k not in _NOT_IN_SHAPES)
  defaults = settings.optional_fields()
  return (model_config.get("classifier"), *(model_config.get(k, defaults[k]) for k in shown))


def _block_shapes(shapes: Shapes) -> tuple[int, dict[str, tuple]]:
  """(depth, shapes of block 0 keyed by the path inside a block) for either layout."""
  scanned = f"Transformer/{SCANNED_BLOCK}/"
  inner = {k[len(scanned) :]: s[1:] for k, s in shapes.items() if k.startswith(scanned)}
  if inner:
    return next(iter(shapes[scanned + k] for k in inner))[0], inner
  layers = {int(m.group(1)) for k in shapes if (m := _BLOCK.match(k))}
  first = "Transformer/encoderblock_0/"
  return len(layers), {k[len(first) :]: s for k, s in shapes.items() if k.startswith(first)}


def _resnet(shapes: Shapes, unknown: list[str]) -> Optional[ResNetSettings]:
  if "conv_root/kernel" not in shapes:
    return None
  units: dict[int, int] = {}
  for key in shapes:
    if m := _RESNET_UNIT.match(key):
      stage, unit = int(m.group(1)), int(m.group(2))
      units[stage] = max(units.get(stage, 0), unit)
  if sorted(units) != list(range(1, len(units) + 1)):
    unknown.append(f"ResNet stages (found block{sorted(units)}; expected block1..blockS)")
  return ResNetSettings(
    num_layers=tuple(units[s] for s in sorted(units)),
    width_factor=shapes["conv_root/kernel"][-1] / ROOT_WIDTH,
  )


def posemb_kind(shapes: Shapes) -> Optional[str]:
  """'learn' or 'learn_2d' by the stored table, 'relative' by the attention layers' offset
  tables; None without one ('sincos2d' and 'none' have no parameters to tell them apart)."""
  if POSEMB in shapes:
    return "learn"
  if any(k.endswith("/" + posemb_lib.RELATIVE_EMBEDDING) for k in shapes):
    return posemb_lib.RELATIVE
  if POSEMB_X in shapes and POSEMB_Y in shapes:
    return "learn_2d"
  return None


def describe_shapes(shapes: Shapes) -> dict[str, Any]:
  """What the shapes say of the ViT, each None where they do not say it: patch size, input
  channels, width, depth, heads, MLP dim, position embedding, ResNet root, axial."""
  kernel = shapes.get(EMBEDDING)
  kernel = kernel if kernel and len(kernel) == 4 else None
  depth, block = _block_shapes(shapes)
  axial = AXIAL_ROW + _QUERY in block  # an Axial-ViT block: a row and a column block
  query = block.get(AXIAL_ROW + _QUERY if axial else _QUERY)
  mlp = block.get(AXIAL_ROW + _MLP if axial else _MLP) or block.get(_SWIGLU)
  if _SWIGLU_FUSED in block:
    mlp = (block[_SWIGLU_FUSED][0], block[_SWIGLU_FUSED][1] // 2)
  return {
    "patch size": kernel[:2] if kernel else None,
    "input channels": kernel[2] if kernel else None,
    "width": kernel[3] if kernel else None,
    "depth": depth or None,
    "heads": query[1] if query and len(query) == 3 else None,
    "MLP dim": mlp[-1] if mlp else None,
    "position embedding": posemb_kind(shapes),
    "ResNet root": "conv_root/kernel" in shapes,
    "axial": axial,
  }


def settings_from_shapes(
  shapes: Shapes, settings: ModelSettings, posemb: Optional[str] = None
) -> ModelSettings:
  """``settings`` (a ViT's) changed to what the shapes were made for, all at once; one
  CheckpointError naming everything they do not tell. ``posemb``: the kind where the
  shapes show no table (a reader that knows it, e.g. 'none' beside rotary embeddings)."""
  arch = describe_shapes(shapes)
  arch["position embedding"] = arch["position embedding"] or posemb
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
      f"one of {', '.join(variants.MODEL_NAMES)})."
    )
  transformer = dataclasses.replace(
    settings.transformer,
    num_layers=arch["depth"],
    mlp_dim=arch["MLP dim"],
    num_heads=arch["heads"],
  )
  changes: dict[str, Any] = dict(
    patches=PatchSettings(tuple(arch["patch size"])),
    hidden_size=arch["width"],
    transformer=transformer,
    posemb=arch["position embedding"],
    axial=arch["axial"],
    **_family_options(shapes, transformer),
  )
  if "pre_logits/kernel" in shapes:
    changes["representation_size"] = shapes["pre_logits/kernel"][-1]
  if resnet is not None:
    changes["resnet"] = resnet
  return settings.replace(**changes)


def _family_options(shapes: Shapes, transformer: TransformerSettings) -> dict[str, Any]:
  """The options of the later ViTs that the shapes show: pooling, prefix tokens, norms,
  LayerScale, and whether the position table has rows for the prefix tokens."""
  has_cls = "cls" in shapes
  found: dict[str, Any] = {}
  classifier = "map" if any(k.startswith("MAPHead_0/") for k in shapes) else "gap"
  if has_cls:
    classifier = "token" if classifier == "gap" else classifier
    found["class_token"] = True if classifier != "token" else None
  found["classifier"] = classifier
  registers = shapes["registers"][1] if "registers" in shapes else 0
  found["num_registers"] = registers
  # The map head's own heads and MLP width where they differ from the encoder's (PE).
  query, mlp = shapes.get(MAP_QUERY), shapes.get("MAPHead_0/MlpBlock_0/Dense_0/kernel")
  if query is not None and len(query) == 3 and query[1] != transformer.num_heads:
    found["map_num_heads"] = query[1]
  if mlp is not None and mlp[-1] != transformer.mlp_dim:
    found["map_mlp_dim"] = mlp[-1]
  fc_norm = "fc_norm/scale" in shapes
  found.update(
    norm_pre="Transformer/norm_pre/scale" in shapes,
    fc_norm=fc_norm,
    patch_bias="embedding/bias" in shapes,
    final_norm=fc_norm or "Transformer/encoder_norm/scale" in shapes,
  )
  block = _block_shapes(shapes)[1]
  if _LAYER_SCALE in block:
    found["layer_scale_init"] = LAYER_SCALE_INIT
  swiglu = options.SWIGLU if _SWIGLU in block else options.SWIGLU_FUSED
  found["mlp"] = swiglu if _SWIGLU in block or _SWIGLU_FUSED in block else options.MLP
  found["mlp_norm"] = "MlpBlock_3/norm/scale" in block
  found["attention_norm"] = f"{_ATTENTION}norm/scale" in block
  biases = {k for k in ("query", "key") if f"{_ATTENTION}{k}/bias" in block}
  none, qv, every = options.QKV_BIAS_NONE, options.QKV_BIAS_QV, options.QKV_BIAS_ALL
  found["qkv_bias"] = every if "key" in biases else qv if biases else none
  prefix = int(has_cls) + registers
  if POSEMB in shapes and prefix:  # a square table without the prefix rows: patches only
    rows = shapes[POSEMB][1]
    found["posemb_patches_only"] = _is_square(rows) and not _is_square(rows - prefix)
  return found


def _is_square(n: int) -> bool:
  return n >= 0 and math.isqrt(n) ** 2 == n


def _num_prefix_rows(config: Any) -> int:
  """Rows of the learned 1-D position table before the grid's: the prefix tokens', unless
  the table covers the patches only."""
  settings = ModelSettings.from_config(config)
  return 0 if settings.posemb_patches_only else settings.num_prefix_tokens


def _relative_grid(shapes: Shapes, config: Any) -> Optional[tuple[int, int]]:
  """The grid of the first block's relative offset tables: an Axial-ViT's row and column
  tables (2 gw - 1, 2 gh - 1 rows), else the square grid of 2N - 1 offsets (+ 3 prefix
  rows)."""
  _, block = _block_shapes(shapes)
  table = "MultiHeadDotProductAttention_1/" + posemb_lib.RELATIVE_EMBEDDING
  if AXIAL_ROW + table in block and "column/" + table in block:
    return (block["column/" + table][0] + 1) // 2, (block[AXIAL_ROW + table][0] + 1) // 2
  if table not in block:
    return None
  prefix = 3 if ModelSettings.from_config(config).num_prefix_tokens else 0
  return posemb_lib.square_grid((block[table][0] - prefix + 1) // 2, "pass the image size")


def trained_grid(shapes: Shapes, config: Any) -> Optional[tuple[int, int]]:
  """The token grid the learned position embeddings were trained for; None without a
  learned table or one resized to every input (``posemb_grid``). A 1-D table is taken to
  be a square grid."""
  if config.get("posemb_grid") is not None:
    return None
  if POSEMB in shapes:
    rows = shapes[POSEMB][1] - _num_prefix_rows(config)
    return posemb_lib.square_grid(rows, "pass the image size (--resolution)")
  if POSEMB_X in shapes and POSEMB_Y in shapes:
    return shapes[POSEMB_Y][1], shapes[POSEMB_X][2]
  return _relative_grid(shapes, config)
