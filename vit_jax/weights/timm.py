"""timm `VisionTransformer` (and its ResNet hybrids) <- our parameters, numpy only.

The export is a `model.safetensors` with timm's key names and `timm_model.json`, the
`timm.create_model` name and keyword arguments that rebuild the architecture. The name
picks timm's model class and default config; the keyword arguments set every dimension.
A shape timm has no name for (e.g. the quickstart's 4-layer, 64-wide ViT) takes the
generic `vit_base_patch16_224`; the file's "architecture" states the real shape:

    spec = json.load(open(f"{DIR}/timm_model.json"))
    model = timm.create_model(spec["model_name"], pretrained=True, pretrained_cfg_overlay=dict(
        spec["pretrained_cfg_overlay"], file=f"{DIR}/model.safetensors"), **spec["kwargs"])

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

import json
import os
from typing import Any, Optional

import ml_collections
import numpy as np
from flax import traverse_util

from vit_jax import errors, models
from vit_jax.aliases import Params
from vit_jax.weights import architecture

WEIGHTS = "model.safetensors"
SPEC = "timm_model.json"
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
_POOLS = {"token": "token", "gap": "avg", "map": "map"}  # our classifier -> global_pool
_HYBRID_NAMES = {
  (3, 4, 9): "vit_base_r50_s16_224",
  (2, 2, 2, 2): "vit_small_r26_s32_224",
  (): "vit_tiny_r_s16_p8_224",
}
_ACT_LAYER = {True: "gelu_tanh", False: "gelu"}  # our gelu_approximate -> timm act_layer
_QUICK_GELU = "quick_gelu"
# timm's hybrid kernels standardise as (w - mean) / sqrt(var + 1e-8); ours (official) as
# (w - mean) / (std + 1e-5). The export scales each kernel so timm computes ours.
_TIMM_STD_EPS = 1e-8
_OUR_STD_EPS = 1e-5


def check_exportable(config: ml_collections.ConfigDict, num_classes: Optional[int]) -> None:
  """One ValueError listing what timm's VisionTransformer cannot represent."""
  problems = []
  if config.get("classifier", "token") not in _POOLS:
    problems.append(f"classifier {config.classifier!r} (timm: one of {tuple(_POOLS)})")
  eps = config.get("layer_norm_epsilon", LAYER_NORM_EPS)
  if eps not in (LAYER_NORM_EPS, _CLIP_EPS):
    problems.append(
      f"LayerNorm epsilon {eps:g} (timm's ViTs: {LAYER_NORM_EPS:g}, CLIP {_CLIP_EPS:g})"
    )
  if config.get("posemb", "learn") != "learn":
    problems.append(f"position embeddings {config.posemb!r} (timm: posemb='learn')")
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
  if not num_classes:
    problems.append("no classification head")
  if problems:
    raise errors.ConfigError("This model cannot be exported to timm: " + "; ".join(problems) + ".")


def model_spec(
  config: ml_collections.ConfigDict,
  *,
  num_classes: int,
  image_size: tuple[int, int],
) -> dict[str, Any]:
  """{'model_name', 'kwargs', 'pretrained_cfg_overlay'} for `timm.create_model`."""
  check_exportable(config, num_classes)
  t, resnet = config.transformer, config.get("resnet")
  patch = tuple(config.patches.size)
  config = models.with_family_defaults(config)
  if resnet is not None:
    name = _HYBRID_NAMES[tuple(resnet.num_layers)]
  elif config.layer_norm_epsilon == _CLIP_EPS:
    name = _GENERIC_CLIP
  else:
    name = _VIT_NAMES.get((patch[0], config.hidden_size, t.num_layers), _GENERIC_VIT)
  module = models.create_model(config, num_classes=num_classes)
  quick = config.activation == _QUICK_GELU
  kwargs = dict(
    img_size=list(image_size),
    patch_size=patch[0] if patch[0] == patch[1] else list(patch),
    embed_dim=config.hidden_size,
    depth=t.num_layers,
    num_heads=t.num_heads,
    mlp_ratio=t.mlp_dim / config.hidden_size,
    class_token=module.has_class_token,
    global_pool=_POOLS[config.classifier],
    fc_norm=config.fc_norm,
    act_layer=_QUICK_GELU if quick else _ACT_LAYER[config.gelu_approximate],
    num_classes=num_classes,
  )
  family = dict(
    reg_tokens=config.num_registers,
    no_embed_class=config.posemb_patches_only,
    pre_norm=config.norm_pre,
    init_values=config.layer_scale_init,
  )
  kwargs.update({k: v for k, v in family.items() if v})  # only where not timm's default
  size = "x".join(str(s) for s in image_size)
  stem = f"R{'-'.join(map(str, resnet.num_layers)) or ' root'}+" if resnet is not None else ""
  # timm drops a stored head whose class count differs from the pretrained config's.
  return {
    "architecture": (
      f"{stem}ViT: patch {'x'.join(map(str, patch))}, width {config.hidden_size}, depth "
      f"{t.num_layers}, {t.num_heads} heads, MLP {t.mlp_dim}, input {size}, "
      f"{num_classes} classes (model_name only picks timm's class; kwargs set the shape)"
    ),
    "model_name": name,
    "kwargs": kwargs,
    "pretrained_cfg_overlay": {
      "num_classes": num_classes,
      "mean": list(config.input_mean),
      "std": list(config.input_std),
    },
  }


def _conv(kernel: np.ndarray) -> np.ndarray:  # [kh, kw, Cin, Cout] -> [Cout, Cin, kh, kw]
  return np.ascontiguousarray(kernel.transpose(3, 2, 0, 1))


def _std_conv(kernel: np.ndarray) -> np.ndarray:
  """A kernel that timm's standardisation maps onto our standardised kernel exactly.

  Ours: s = (w - m) / (sd + 1e-5), with variance v_s < 1. timm applied to c * s gives
  c s / sqrt(c^2 v_s + 1e-8), which is s for c = sqrt(1e-8 / (1 - v_s)).
  """
  w = kernel.astype(np.float64)
  mean = w.mean(axis=(0, 1, 2), keepdims=True)
  s = (w - mean) / (w.std(axis=(0, 1, 2), keepdims=True) + _OUR_STD_EPS)
  var = s.var(axis=(0, 1, 2), keepdims=True)
  return _conv((s * np.sqrt(_TIMM_STD_EPS / (1.0 - var))).astype(np.float32))


def _t(x: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(x.T)


def _resnet_tensors(flat: dict[str, np.ndarray], units: tuple[int, ...]) -> dict[str, np.ndarray]:
  root = "patch_embed.backbone." if not units else "patch_embed.backbone.stem."
  out = {
    root + "conv.weight": _std_conv(flat["conv_root/kernel"]),
    root + "norm.weight": flat["gn_root/scale"],
    root + "norm.bias": flat["gn_root/bias"],
  }
  for s, n in enumerate(units):
    for u in range(n):
      ours, theirs = f"block{s + 1}/unit{u + 1}/", f"patch_embed.backbone.stages.{s}.blocks.{u}."
      for r in (1, 2, 3):
        out[f"{theirs}conv{r}.weight"] = _std_conv(flat[f"{ours}conv{r}/kernel"])
        out[f"{theirs}norm{r}.weight"] = flat[f"{ours}gn{r}/scale"]
        out[f"{theirs}norm{r}.bias"] = flat[f"{ours}gn{r}/bias"]
      if f"{ours}conv_proj/kernel" in flat:
        out[f"{theirs}downsample.conv.weight"] = _std_conv(flat[f"{ours}conv_proj/kernel"])
        out[f"{theirs}downsample.norm.weight"] = flat[f"{ours}gn_proj/scale"]
        out[f"{theirs}downsample.norm.bias"] = flat[f"{ours}gn_proj/bias"]
  return out


def _in_heads(kernel: np.ndarray) -> np.ndarray:
  """Our per-head kernel [D, H, Dh] -> torch's projection weight [H*Dh, D]."""
  return _t(kernel.reshape(kernel.shape[0], -1))


def _out_heads(kernel: np.ndarray) -> np.ndarray:
  """Our output kernel [H, Dh, D] -> torch's projection weight [D, H*Dh]."""
  return _t(kernel.reshape(-1, kernel.shape[-1]))


def _norms_and_mlp(flat, ours: str, theirs: str, norms, mlp: str) -> dict[str, np.ndarray]:
  out = {}
  for ln, norm in norms:
    out[f"{theirs}{norm}.weight"] = flat[f"{ours}{ln}/scale"]
    out[f"{theirs}{norm}.bias"] = flat[f"{ours}{ln}/bias"]
  for dense, fc in (("Dense_0", "fc1"), ("Dense_1", "fc2")):
    out[f"{theirs}mlp.{fc}.weight"] = _t(flat[f"{ours}{mlp}/{dense}/kernel"])
    out[f"{theirs}mlp.{fc}.bias"] = flat[f"{ours}{mlp}/{dense}/bias"]
  return out


def _block_tensors(flat, i: int) -> dict[str, np.ndarray]:
  ours, theirs = f"Transformer/encoderblock_{i}/", f"blocks.{i}."
  att = ours + "MultiHeadDotProductAttention_1/"
  out = {
    theirs + "attn.qkv.weight": np.concatenate(
      [_in_heads(flat[f"{att}{n}/kernel"]) for n in ("query", "key", "value")]
    ),
    theirs + "attn.qkv.bias": np.concatenate(
      [flat[f"{att}{n}/bias"].reshape(-1) for n in ("query", "key", "value")]
    ),
    theirs + "attn.proj.weight": _out_heads(flat[f"{att}out/kernel"]),
    theirs + "attn.proj.bias": flat[f"{att}out/bias"],
  }
  norms = (("LayerNorm_0", "norm1"), ("LayerNorm_2", "norm2"))
  out.update(_norms_and_mlp(flat, ours, theirs, norms, "MlpBlock_3"))
  for scale, ls in (("LayerScale_attention", "ls1"), ("LayerScale_mlp", "ls2")):
    if f"{ours}{scale}/scale" in flat:
      out[f"{theirs}{ls}.gamma"] = flat[f"{ours}{scale}/scale"]
  return out


def _map_tensors(flat) -> dict[str, np.ndarray]:
  """Our `MAPHead_0` -> timm's `attn_pool` (query ``q``, key and value fused as ``kv``)."""
  ours, att = "MAPHead_0/", "MAPHead_0/MultiHeadDotProductAttention_0/"
  out = {
    "attn_pool.latent": flat[ours + "probe"],
    "attn_pool.q.weight": _in_heads(flat[att + "query/kernel"]),
    "attn_pool.q.bias": flat[att + "query/bias"].reshape(-1),
    "attn_pool.kv.weight": np.concatenate(
      [_in_heads(flat[f"{att}{n}/kernel"]) for n in ("key", "value")]
    ),
    "attn_pool.kv.bias": np.concatenate(
      [flat[f"{att}{n}/bias"].reshape(-1) for n in ("key", "value")]
    ),
    "attn_pool.proj.weight": _out_heads(flat[att + "out/kernel"]),
    "attn_pool.proj.bias": flat[att + "out/bias"],
  }
  out.update(_norms_and_mlp(flat, ours, "attn_pool.", (("LayerNorm_0", "norm"),), "MlpBlock_0"))
  return out


def _embedding_tensors(flat, config: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
  """Patch embedding, position table, class token, registers; with ``norm_pre`` the patch
  bias (timm has none there) is added to the position rows of the patches."""
  posemb = flat["Transformer/posembed_input/pos_embedding"]
  out = {"patch_embed.proj.weight": _conv(flat["embedding/kernel"])}
  if config.norm_pre:
    prefix = architecture.num_prefix_rows(config)
    posemb = posemb.copy()
    posemb[:, prefix:] += flat["embedding/bias"]
  else:
    out["patch_embed.proj.bias"] = flat["embedding/bias"]
  out["pos_embed"] = posemb
  for ours, theirs in (("cls", "cls_token"), ("registers", "reg_token")):
    if ours in flat:
      out[theirs] = flat[ours]
  return out


def flat_float32(params: Params) -> dict[str, np.ndarray]:
  """A parameter tree as {'a/b/kernel': float32 array}, the form every timm writer reads."""
  return {
    k: np.asarray(v, np.float32) for k, v in traverse_util.flatten_dict(params, sep="/").items()
  }


def to_timm(params: Params, config: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
  """timm's state dict (numpy, float32) of a per-layer parameter tree."""
  flat = flat_float32(params)
  config = models.with_family_defaults(config)
  out = _embedding_tensors(flat, config)
  out["head.weight"], out["head.bias"] = _t(flat["head/kernel"]), flat["head/bias"]
  for ours, theirs in (
    ("Transformer/norm_pre", "norm_pre"),
    ("Transformer/encoder_norm", "norm"),
    ("fc_norm", "fc_norm"),
  ):
    if f"{ours}/scale" in flat:
      out[f"{theirs}.weight"], out[f"{theirs}.bias"] = flat[f"{ours}/scale"], flat[f"{ours}/bias"]
  for i in range(config.transformer.num_layers):
    out.update(_block_tensors(flat, i))
  if "MAPHead_0/probe" in flat:
    out.update(_map_tensors(flat))
  if config.get("resnet") is not None:
    out.update(_resnet_tensors(flat, tuple(config.resnet.num_layers)))
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


def write_dir(directory: str, tensors: dict[str, np.ndarray], spec: dict[str, Any]) -> None:
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  save_file(tensors, os.path.join(directory, WEIGHTS))
  with open(os.path.join(directory, SPEC), "w") as f:
    json.dump(spec, f, indent=2)
