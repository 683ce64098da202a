"""timm's ViT architecture names -> the constructor arguments timm registers for them.

The table is `vit_jax/weights/timm_architectures.json`, package data generated from
timm's own registry by `tools/timm_architectures.py` (no torch here). Its values are
timm's, with a class or a partial written as ``Name(key=value)``
(``"LayerNorm(eps=1e-05)"``). `model_args` gives them in the readers' words, `unsupported`
the ones timm's plain ViT has and this ViT does not compute (RMSNorm, SwiGLU, QK-norm,
parallel blocks, a distillation token, other backbones...), `named_size` the input size
timm builds a name for.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import re
from typing import Any, Optional

TABLE = "timm_architectures.json"
# timm's fused SwiGLU in a ViT (DINOv2-g): our 'swiglu_fused', gate first, SiLU.
GLU_MLP = "GluMlp(act_layer='SiLU', gate_last=False)"
# What timm's ViT-family constructors (VisionTransformer, Eva, NaFlexVit) default to: ViT-B/16.
BASE_SHAPES: dict[str, Any] = dict(
  patch_size=16, embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.0, qkv_bias=True
)
_IMAGE_SIZE = re.compile(r"_(\d+)$")  # timm names end in their input size: ..._224
_TIMM_DEFAULT_SIZE = 224  # timm's VisionTransformer img_size default
_LAYER_NORM = re.compile(r"^LayerNorm\((?:eps=([0-9.e+-]+))?\)$|^LayerNorm$")
# A hybrid's backbone this package holds: timm's BiT-style ResNetV2 (weight-standardised
# convs, GroupNorm), or its root alone (an nn.Sequential stem: `_resnetv2(layers=())`).
_RESNET_BACKBONE = re.compile(r"^ResNetV2\(layers=\[[0-9, ]*\]\)$|^Sequential$")
# Arguments that only fix shapes the arrays show, or do not change what is computed.
_SHAPES = ("embed_dim", "depth", "patch_size", "mlp_ratio", "img_size", "num_heads")
_FREE = ("dynamic_img_size", "num_classes", "qkv_bias", "proj_bias")  # no bias: zeros
# Argument -> the values this ViT computes (a callable: a check of the value).
_COMPUTED: dict[str, Any] = {
  "global_pool": ("token", "avg", "map", ""),
  "class_token": (True, False),
  "reg_tokens": lambda v: isinstance(v, int) and v >= 0,
  "no_embed_class": (True, False),
  "pre_norm": (True, False),
  "fc_norm": (True, False, None),
  "final_norm": (True, False),
  "init_values": lambda v: v is None or isinstance(v, (int, float)),
  "layer_norm_eps": lambda v: isinstance(v, (int, float)),
  "norm_layer": lambda v: isinstance(v, str) and bool(_LAYER_NORM.match(v)),
  "act_layer": ("gelu", "gelu_tanh", "gelu_pytorch_tanh", "quick_gelu", "SiLU", None),
  "mlp_layer": (GLU_MLP,),  # SiLU's only use: checked in `unsupported`
  "backbone": lambda v: isinstance(v, str) and bool(_RESNET_BACKBONE.match(v)),
}


@functools.cache
def _table() -> dict[str, Any]:
  text = importlib.resources.files("vit_jax.weights").joinpath(TABLE).read_text()
  return json.loads(text)


def timm_version() -> str:
  """The timm release the table was generated from."""
  return _table()["timm_version"]


def names() -> list[str]:
  """Every architecture name in the table."""
  return list(_table()["architectures"])


def registered_args(name: str) -> Optional[dict[str, Any]]:
  """timm's constructor arguments of ``name`` as the table holds them, or None."""
  entry = _table()["architectures"].get(name.split(".")[0])  # a pretrained tag ignored
  return None if entry is None else dict(entry["args"])


def module(name: str) -> Optional[str]:
  """timm's module registering ``name`` ('vision_transformer', 'eva', ...), or None."""
  entry = _table()["architectures"].get(name.split(".")[0])
  return None if entry is None else entry["module"]


def input_size(name: str) -> Optional[tuple[int, int]]:
  """The (height, width) timm builds ``name`` for where its arguments give no ``img_size``:
  its default pretrained config's input size; None if the table has none."""
  entry = _table()["architectures"].get(name.split(".")[0])
  size = None if entry is None else entry.get("input_size")
  return None if size is None else (int(size[0]), int(size[1]))


def unsupported(args: dict[str, Any]) -> list[str]:
  """``key=value`` of each argument this package's ViT does not compute."""
  problems = []
  for key, value in args.items():
    if key in _SHAPES or key in _FREE:
      continue
    accepted = _COMPUTED.get(key)
    ok = accepted is not None and (accepted(value) if callable(accepted) else value in accepted)
    if not ok:
      problems.append(f"{key}={value!r}")
  if args.get("act_layer") == "SiLU" and args.get("mlp_layer") != GLU_MLP:
    problems.append("act_layer='SiLU' outside timm's GluMlp")
  return problems


def model_args(name: str) -> dict[str, Any]:
  """The registered arguments of ``name`` in the reader's words (a LayerNorm's epsilon as
  ``layer_norm_eps``); empty for a name the table does not hold."""
  args = registered_args(name) or {}
  norm = args.pop("norm_layer", None)
  if isinstance(norm, str) and (m := _LAYER_NORM.match(norm)) and m.group(1):
    args["layer_norm_eps"] = float(m.group(1))
  elif norm is not None:
    args["norm_layer"] = norm
  return args


def named_size(name: str, args: dict[str, Any]) -> tuple[int, int]:
  """The input size timm builds architecture ``name`` for: its ``img_size`` argument, else
  its default weights' input size, else the size its name ends in, else timm's default."""
  size = args.get("img_size") or input_size(name)
  if size is None:
    match = _IMAGE_SIZE.search(name)
    size = int(match.group(1)) if match else _TIMM_DEFAULT_SIZE
  return tuple(size) if isinstance(size, (list, tuple)) else (int(size), int(size))
