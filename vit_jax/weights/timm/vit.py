"""timm `VisionTransformer` (and its ResNet hybrids) <-> our parameters, numpy only: one
table of arrays (`vit_table`) read both ways (`to_timm`, `from_timm`), and the export's
`timm_model.json` (`model_spec`); what a ViT's arguments say beyond its arrays is
`vit_config.py`, the export's folder `folder.py`.

The export's name picks timm's model class and default config; the keyword arguments set
every dimension. A shape timm has no name for (e.g. the quickstart's 4-layer, 64-wide ViT)
takes the generic `vit_base_patch16_224`; the spec's "architecture" states the real shape.

timm's fused attention input ``qkv`` is our query, key and value stacked; classifier
'gap' is ``global_pool='avg'`` with the final norm before pooling unless ``fc_norm``;
'map' is timm's ``AttentionPoolLatent`` (fused ``kv``). Registers, LayerScale, ``norm_pre``
and the position table without prefix rows are timm's ``reg_tokens``, ``init_values``,
``pre_norm`` and ``no_embed_class``. timm's ViT with ``pre_norm`` has no patch-embedding
bias: ours is added to the patches' position rows instead (the same sum). A LayerNorm
epsilon of 1e-5 takes timm's CLIP name, whose registered LayerNorm has it.
Hybrids map onto timm's R50 (3, 4, 9), R26 (2, 2, 2, 2) and root-only models.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import numpy as np

from vit_jax import models
from vit_jax.infra import errors
from vit_jax.infra.aliases import Params
from vit_jax.models import options
from vit_jax.weights import architecture, tensor_table
from vit_jax.weights.tensor_table import Row, rows
from vit_jax.weights.timm import arguments, eva_config, names, shared_rows

# Official architectures -> timm names (any other plain ViT uses the generic name below,
# with every dimension given as a keyword argument).
_VIT_NAMES = {
  (16, 192, 12): "vit_tiny_patch16_224",
  (32, 384, 12): "vit_small_patch32_224",
  (16, 384, 12): "vit_small_patch16_224",
  (32, 768, 12): "vit_base_patch32_224",
  (16, 768, 12): "vit_base_patch16_224",
  (8, 768, 12): "vit_base_patch8_224",
  (32, 1024, 24): "vit_large_patch32_224",
  (16, 1024, 24): "vit_large_patch16_224",
  (14, 1280, 32): "vit_huge_patch14_224",
}
_GENERIC_VIT = "vit_base_patch16_224"
_GENERIC_CLIP = "vit_base_patch16_clip_224"  # registered with LayerNorm(eps=1e-5)
LAYER_NORM_EPS = 1e-6  # timm's ViT LayerNorm default
_CLIP_EPS = 1e-5
POOLS = {"token": "token", "gap": "avg", "map": "map"}  # our classifier -> global_pool
_HYBRID_NAMES = {
  (3, 4, 9): "vit_base_r50_s16_224",
  (2, 2, 2, 2): "vit_small_r26_s32_224",
  (): "vit_tiny_r_s16_p8_224",
}
# ModelSettings fields that are timm VisionTransformer keyword arguments, given only where
# not the default of timm or of the name exported under; the other fields are set in
# model_spec, or refused by check_exportable.
FIELD_ARGS = {
  "num_registers": "reg_tokens",
  "posemb_patches_only": "no_embed_class",
  "norm_pre": "pre_norm",
  "layer_scale_init": "init_values",
}
# timm's hybrid kernels standardise as (w - mean) / sqrt(var + 1e-8); ours (official) as
# (w - mean) / (std + 1e-5). Each kernel is rescaled so that the other side computes the same.
_TIMM_STD_EPS = 1e-8
_OUR_STD_EPS = 1e-5


def check_exportable(config: models.Settings) -> None:
  """One ConfigError listing what timm's VisionTransformer cannot represent."""
  problems = unexportable(config)
  if problems:
    raise errors.ConfigError("This model cannot be exported to timm: " + "; ".join(problems) + ".")


def unexportable(config: models.Settings) -> list[str]:
  """What of ``config`` timm's VisionTransformer cannot represent, one phrase each."""
  problems = []
  if config.get("classifier", "token") not in POOLS:
    problems.append(f"classifier {config.classifier!r} (timm: one of {tuple(POOLS)})")
  eps = config.get("layer_norm_epsilon", LAYER_NORM_EPS)
  if eps not in (LAYER_NORM_EPS, _CLIP_EPS):
    problems.append(
      f"LayerNorm epsilon {eps:g} (timm's ViTs: {LAYER_NORM_EPS:g}, CLIP {_CLIP_EPS:g})"
    )
  if config.get("posemb", "learn") != "learn":
    problems.append(f"position embeddings {config.posemb!r} (timm: posemb='learn')")
  if eva_config.is_eva(config):
    problems.append("RoPE, SwiGLU or a q and v bias without a key bias (written as timm's Eva)")
  if config.get("map_num_heads") or config.get("map_mlp_dim") or config.get("map_include_prefix"):
    problems.append("a map head of its own heads, MLP or tokens (Perception Encoder's: Eva)")
  if config.get("axial", False):
    problems.append("Axial-ViT blocks (timm's ViT has one global attention per block)")
  if config.get("representation_size") is not None:
    problems.append("a representation layer (pre_logits), which timm's ViT no longer has")
  resnet = config.get("resnet")
  if resnet is not None and (
    tuple(resnet.num_layers) not in _HYBRID_NAMES or resnet.width_factor != 1
  ):
    problems.append(
      f"ResNet stages {tuple(resnet.num_layers)} at width factor "
      f"{resnet.width_factor} (timm has {sorted(_HYBRID_NAMES)} at 1)"
    )
  if config.get("fc_norm") and not config.get("final_norm", True):
    problems.append("fc_norm without final_norm (timm's final_norm=False has no norm at all)")
  return problems


def model_spec(
  config: models.Settings,
  *,
  num_classes: Optional[int],
  image_size: tuple[int, int],
) -> dict[str, Any]:
  """{'model_name', 'kwargs', 'pretrained_cfg_overlay'} for `timm.create_model`; a model
  without a head (``num_classes`` None or 0) is timm's ``num_classes=0``, pre-logits out."""
  check_exportable(config)
  num_classes = num_classes or 0
  t, resnet = config.transformer, config.get("resnet")
  patch = tuple(config.patches.size)
  config = models.model_settings(config)
  if resnet is not None:
    name = _HYBRID_NAMES[tuple(resnet.num_layers)]
  elif config.layer_norm_epsilon == _CLIP_EPS:
    name = _GENERIC_CLIP
  else:
    name = _VIT_NAMES.get((patch[0], config.hidden_size, t.num_layers), _GENERIC_VIT)
  module = models.create_model(config, num_classes=num_classes)
  kwargs = dict(
    img_size=list(image_size),
    patch_size=patch[0] if patch[0] == patch[1] else list(patch),
    embed_dim=config.hidden_size,
    depth=t.num_layers,
    num_heads=t.num_heads,
    mlp_ratio=t.mlp_dim / config.hidden_size,
    class_token=module.has_class_token,
    global_pool=POOLS[config.classifier],
    fc_norm=config.fc_norm,  # always: timm's default (None) means 'with average pooling'
    qkv_bias=config.qkv_bias == options.QKV_BIAS_ALL,
    final_norm=config.final_norm,
    act_layer=arguments.act_layer(config.activation, config.gelu_approximate),
    num_classes=num_classes,
  )
  registered = names.registered_args(name) or {}
  kwargs.update(
    {
      arg: getattr(config, field)
      for field, arg in FIELD_ARGS.items()
      if getattr(config, field) or registered.get(arg)  # given where ours differs from the name's
    }
  )
  size = "x".join(str(s) for s in image_size)
  stem = f"R{'-'.join(map(str, resnet.num_layers)) or ' root'}+" if resnet is not None else ""
  # timm drops a stored head whose class count differs from the pretrained config's.
  return {
    "architecture": (
      f"{stem}ViT: patch {'x'.join(map(str, patch))}, width {config.hidden_size}, depth "
      f"{t.num_layers}, {t.num_heads} heads, MLP {t.mlp_dim}, input {size}, "
      f"{f'{num_classes} classes' if num_classes else 'no head'} (model_name only picks "
      "timm's class; kwargs set the shape)"
    ),
    "model_name": name,
    "kwargs": kwargs,
    "pretrained_cfg_overlay": {
      "num_classes": num_classes,
      "mean": list(config.input_mean),
      "std": list(config.input_std),
    },
  }


def _std_conv_to_torch(kernel: np.ndarray) -> np.ndarray:
  """A kernel that timm's standardisation maps onto our standardised kernel exactly.

  Ours: s = (w - m) / (sd + 1e-5), with variance v_s < 1. timm applied to c * s gives
  c s / sqrt(c^2 v_s + 1e-8), which is s for c = sqrt(1e-8 / (1 - v_s)).
  """
  w = kernel.astype(np.float64)
  mean = w.mean(axis=(0, 1, 2), keepdims=True)
  s = (w - mean) / (w.std(axis=(0, 1, 2), keepdims=True) + _OUR_STD_EPS)
  var = s.var(axis=(0, 1, 2), keepdims=True)
  return tensor_table.conv_to_torch((s * np.sqrt(_TIMM_STD_EPS / (1.0 - var))).astype(np.float32))


def _std_conv_from_torch(weight: np.ndarray) -> np.ndarray:
  """A kernel that our standardisation maps onto timm's standardised kernel.

  timm: s = (w - m) / sqrt(v + 1e-8), of standard deviation d = sqrt(v / (v + 1e-8)) < 1.
  Ours applied to c * s gives c s / (c d + 1e-5), which is s for c = 1e-5 / (1 - d),
  with 1 - d = (1e-8 / (v + 1e-8)) / (1 + d) computed without cancellation.
  """
  w = weight.astype(np.float64)
  mean = w.mean(axis=(1, 2, 3), keepdims=True)
  var = w.var(axis=(1, 2, 3), keepdims=True)
  s = (w - mean) / np.sqrt(var + _TIMM_STD_EPS)
  d = np.sqrt(var / (var + _TIMM_STD_EPS))
  c = _OUR_STD_EPS * (1 + d) * (var + _TIMM_STD_EPS) / _TIMM_STD_EPS
  return tensor_table.conv_from_torch((s * c).astype(np.float32))


# The hybrid's weight-standardised convolutions (not bit-exact: each side standardises).
_STD_CONV = tensor_table.Layout(_std_conv_to_torch, _std_conv_from_torch)
_BACKBONE = "patch_embed.backbone."


def _resnet_rows(units: tuple[int, ...], stem: bool) -> list[Row]:
  """The hybrid's ResNet root and stages <-> timm's ``patch_embed.backbone``."""
  root = _BACKBONE + ("stem." if stem else "")
  table = [
    Row("conv_root/kernel", root + "conv.weight", _STD_CONV),
    *rows("gn_root", root + "norm"),
  ]
  for s, n in enumerate(units):
    for u in range(n):
      ours, theirs = f"block{s + 1}/unit{u + 1}/", f"{_BACKBONE}stages.{s}.blocks.{u}."
      for r in (1, 2, 3):
        table.append(Row(f"{ours}conv{r}/kernel", f"{theirs}conv{r}.weight", _STD_CONV))
        table += rows(f"{ours}gn{r}", f"{theirs}norm{r}")
      proj = f"{theirs}downsample."
      table.append(Row(f"{ours}conv_proj/kernel", proj + "conv.weight", _STD_CONV, required=False))
      table += rows(f"{ours}gn_proj", proj + "norm", required=False)
  return table


def vit_table(
  depth: int,
  num_heads: int,
  *,
  map_head: bool,
  resnet: Optional[tuple[tuple[int, ...], bool]],
  qkv_bias: bool = True,
  mlp: str = options.MLP,
) -> list[Row]:
  """Every array of a timm ViT (``resnet``: the hybrid's units per stage and whether its
  root is timm's ``stem``; ``qkv_bias`` False: the blocks' attention has none; ``mlp``:
  the blocks' MLP kind, 'mlp' or 'swiglu_fused'), ours <-> timm's; the optional ones where
  a model may lack them."""
  optional = dict(required=False)
  table = [
    Row("embedding/kernel", "patch_embed.proj.weight", tensor_table.CONV),
    Row("embedding/bias", "patch_embed.proj.bias", **optional),  # none with pre_norm
    Row(architecture.POSEMB, "pos_embed"),
    Row("cls", "cls_token", **optional),
    Row("registers", "reg_token", **optional),
    *rows("Transformer/norm_pre", "norm_pre", **optional),  # CLIP
    *rows("Transformer/encoder_norm", "norm", **optional),  # absent with fc_norm
    *rows("fc_norm", "fc_norm", **optional),
    *rows("head", "head", tensor_table.DENSE, **optional),
    *rows("pre_logits", "pre_logits.fc", tensor_table.DENSE, **optional),
  ]
  for i in range(depth):
    ours, theirs = f"Transformer/encoderblock_{i}/", f"blocks.{i}."
    att = ours + "MultiHeadDotProductAttention_1/"
    fused = ("query", "key", "value")
    table += shared_rows.attention_rows(att, theirs + "attn.", num_heads, fused, qkv_bias)
    table += rows(ours + "LayerNorm_0", theirs + "norm1")
    table += rows(ours + "LayerNorm_2", theirs + "norm2")
    table += shared_rows.mlp_rows(ours + "MlpBlock_3", theirs + "mlp", mlp)
    table.append(Row(ours + "LayerScale_attention/scale", theirs + "ls1.gamma", **optional))
    table.append(Row(ours + "LayerScale_mlp/scale", theirs + "ls2.gamma", **optional))
  if map_head:
    table += shared_rows.map_head_rows(num_heads)
  if resnet is not None:
    table += _resnet_rows(*resnet)
  return table


def to_timm(params: Params, config: models.Settings) -> dict[str, np.ndarray]:
  """timm's state dict (numpy, float32) of a per-layer parameter tree. timm's ViT with
  ``pre_norm`` has no patch bias: ours is added to the position rows of the patches."""
  config = models.model_settings(config)
  flat = shared_rows.fold_patch_bias(tensor_table.flat_float32(params), config)
  resnet = config.get("resnet")
  units = None if resnet is None else tuple(resnet.num_layers)
  table = vit_table(
    config.transformer.num_layers,
    config.transformer.num_heads,
    map_head="MAPHead_0/probe" in flat,
    resnet=None if units is None else (units, bool(units)),
    qkv_bias=config.qkv_bias == options.QKV_BIAS_ALL,
    mlp=config.mlp,
  )
  return tensor_table.to_torch(table, flat)


_BLOCK = re.compile(r"^blocks\.(\d+)\.")
_STAGE_UNIT = re.compile(r"^patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.")


def refuse_distilled(tensors: dict[str, np.ndarray], source: str) -> None:
  """A distilled DeiT is one error saying what to load instead."""
  if "dist_token" in tensors:
    raise errors.CheckpointError(
      f"{source}: a distilled DeiT (dist_token, head_dist): timm averages the logits of its "
      "class-token and distillation-token heads, which this ViT does not have; load the "
      "non-distilled deit_* checkpoint of the same size instead."
    )


def from_timm(tensors: dict[str, np.ndarray], num_heads: int, source: str) -> Params:
  """Our per-layer parameter tree (official layout) of timm's ViT state dict (a bias timm
  leaves out is zeros); one error names every timm array this model has no place for."""
  refuse_distilled(tensors, source)
  depth = 1 + max((int(m[1]) for k in tensors if (m := _BLOCK.match(k))), default=-1)
  units: dict[int, int] = {}
  for k in tensors:
    if m := _STAGE_UNIT.match(k):
      units[int(m[1])] = max(units.get(int(m[1]), 0), int(m[2]) + 1)
  hybrid = any(k.startswith(_BACKBONE) for k in tensors)
  resnet = (tuple(units[s] for s in sorted(units)), _BACKBONE + "stem.conv.weight" in tensors)
  table = vit_table(
    depth,
    num_heads,
    map_head="attn_pool.latent" in tensors,
    resnet=resnet if hybrid else None,
    qkv_bias=depth == 0 or "blocks.0.attn.qkv.bias" in tensors,  # timm's qkv_bias=False: none
    mlp=_mlp_kind(tensors),
  )
  return tensor_table.from_torch(table, _zero_biases(table, tensors), source, "ViT")


def _mlp_kind(tensors: dict[str, np.ndarray]) -> str:
  """'swiglu_fused' where the first block's ``fc1`` is twice ``fc2``'s input (timm's
  GluMlp), else the GELU MLP."""
  fc1, fc2 = tensors.get("blocks.0.mlp.fc1.weight"), tensors.get("blocks.0.mlp.fc2.weight")
  fused = fc1 is not None and fc2 is not None and fc1.shape[0] == 2 * fc2.shape[1]
  return options.SWIGLU_FUSED if fused else options.MLP


def _zero_biases(table: list[Row], tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """``tensors`` with zeros for each required bias timm left out beside its weight
  (``proj_bias=False``): the same computation. An optional one (CLIP's patch embedding)
  stays out, as in the model read."""
  tensors = dict(tensors)
  for row in table:
    weight = row.theirs.removesuffix("bias") + "weight"
    missing = row.theirs not in tensors and weight in tensors
    if row.required and row.theirs.endswith(".bias") and missing:
      tensors[row.theirs] = np.zeros(tensors[weight].shape[0], np.float32)
  return tensors
