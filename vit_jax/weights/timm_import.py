"""timm `VisionTransformer` (and its ResNet hybrids) -> our parameters, numpy only; a timm
`MlpMixer` (a ``stem.proj`` instead of a ``patch_embed``) goes to `timm_mixer`.

The inverse of `vit_jax.weights.timm`'s export. A timm checkpoint is a `model.safetensors`
(timm's state dict) with, from the hub or `timm.models.save_for_hf`, a `config.json`
naming the architecture (``architecture``, ``model_args``, ``global_pool``), or with our
export's `timm_model.json`. The arrays give everything but the head count and the GELU:
those come from the config (``num_heads``; ``act_layer``, timm's default being exact
GELU), else from timm's size in the architecture name or the width of an official variant.

Hybrid kernels: timm standardises as (w - mean) / sqrt(var + 1e-8), our model as
(w - mean) / (std + 1e-5); each kernel is rescaled so that our model computes timm's.
Pickled checkpoints (`.bin`, `.pth`) are never read (`vit_jax.weights.sources`).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Optional

import ml_collections
import numpy as np
from flax import traverse_util

from vit_jax import errors, models
from vit_jax.aliases import Params
from vit_jax.weights import architecture
from vit_jax.weights import timm as timm_export

CONFIG = "config.json"  # timm's hub config (architecture, model_args, pretrained_cfg)
_APPROXIMATE = {v: k for k, v in timm_export._ACT_LAYER.items()}  # act_layer -> tanh GELU?
_APPROXIMATE.update({"gelu_pytorch_tanh": True, None: False})  # None: timm's nn.GELU
_ACT_NAMES = ", ".join(repr(k) for k in _APPROXIMATE if k)
_HEADS_BY_SIZE = {"tiny": 3, "small": 6, "base": 12, "large": 16, "huge": 16}  # timm's ViTs
_SIZE = re.compile(r"^vit_(tiny|small|base|large|huge)_")
_BLOCK = re.compile(r"^blocks\.(\d+)\.")
_STAGE_UNIT = re.compile(r"^patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.")
_BACKBONE = "patch_embed.backbone."
_FLEXIVIT = "flexivit_"  # timm's FlexiViT architectures (no position embedding on the class token)


def is_timm_config(path: str) -> bool:
  """Whether ``path`` is timm's hub `config.json` (it names an ``architecture``)."""
  if not os.path.isfile(path):
    return False
  with open(path) as f:
    return "architecture" in json.load(f)


def is_timm_dir(path: str) -> bool:
  spec = os.path.isfile(os.path.join(path, timm_export.SPEC))
  return spec or is_timm_config(os.path.join(path, CONFIG))


def _arguments(directory: str) -> tuple[str, dict[str, Any], Optional[list[str]]]:
  """(architecture, model arguments, class names) from the config beside the weights."""
  spec_path, config_path = (os.path.join(directory, n) for n in (timm_export.SPEC, CONFIG))
  if os.path.isfile(spec_path):  # our export
    with open(spec_path) as f:
      spec = json.load(f)
    args = dict(spec["kwargs"])
    if "act_layer" in spec:  # a Mixer's, given apart (timm's MlpMixer takes a class)
      args["act_layer"] = spec["act_layer"]
    return spec["model_name"], args, None
  if is_timm_config(config_path):
    with open(config_path) as f:
      config = json.load(f)
    args = dict(config.get("model_args") or {})
    if config.get("global_pool"):
      args.setdefault("global_pool", config["global_pool"])
    return config["architecture"], args, config.get("label_names")
  return "", {}, None


def _num_heads(timm_name: str, args: dict[str, Any], width: int, source: str) -> int:
  if args.get("num_heads"):
    return int(args["num_heads"])
  if m := _SIZE.match(timm_name):
    return _HEADS_BY_SIZE[m.group(1)]
  official = {
    models.get_model_config(n).hidden_size: models.get_model_config(n).transformer.num_heads
    for n in models.MODEL_NAMES
  }
  if width in official:
    return official[width]
  raise errors.CheckpointError(
    f"{source}: the head count of a width-{width} timm ViT is not in the arrays and there "
    "is no config.json beside them: put timm's config.json (architecture, model_args "
    "with num_heads) next to the .safetensors file."
  )


def _conv(weight: np.ndarray) -> np.ndarray:  # [Cout, Cin, kh, kw] -> [kh, kw, Cin, Cout]
  return np.ascontiguousarray(weight.transpose(2, 3, 1, 0))


def _std_conv(weight: np.ndarray) -> np.ndarray:
  """A kernel that our standardisation maps onto timm's standardised kernel.

  timm: s = (w - m) / sqrt(v + 1e-8), of standard deviation d = sqrt(v / (v + 1e-8)) < 1.
  Ours applied to c * s gives c s / (c d + 1e-5), which is s for c = 1e-5 / (1 - d),
  with 1 - d = (1e-8 / (v + 1e-8)) / (1 + d) computed without cancellation.
  """
  w = weight.astype(np.float64)
  mean = w.mean(axis=(1, 2, 3), keepdims=True)
  var = w.var(axis=(1, 2, 3), keepdims=True)
  eps = timm_export._TIMM_STD_EPS
  s = (w - mean) / np.sqrt(var + eps)
  d = np.sqrt(var / (var + eps))
  c = timm_export._OUR_STD_EPS * (1 + d) * (var + eps) / eps
  return _conv((s * c).astype(np.float32))


def _resnet(tensors: dict[str, np.ndarray], take) -> dict[str, np.ndarray]:
  """Our ResNet root and stages from timm's `patch_embed.backbone` (R50/R26 or root only)."""
  root = _BACKBONE + ("stem." if _BACKBONE + "stem.conv.weight" in tensors else "")
  out = {
    "conv_root/kernel": _std_conv(take(root + "conv.weight")),
    "gn_root/scale": take(root + "norm.weight"),
    "gn_root/bias": take(root + "norm.bias"),
  }
  units = sorted({(int(m[1]), int(m[2])) for k in tensors if (m := _STAGE_UNIT.match(k))})
  for s, u in units:
    theirs, ours = f"{_BACKBONE}stages.{s}.blocks.{u}.", f"block{s + 1}/unit{u + 1}/"
    for r in (1, 2, 3):
      out[f"{ours}conv{r}/kernel"] = _std_conv(take(f"{theirs}conv{r}.weight"))
      out[f"{ours}gn{r}/scale"] = take(f"{theirs}norm{r}.weight")
      out[f"{ours}gn{r}/bias"] = take(f"{theirs}norm{r}.bias")
    if f"{theirs}downsample.conv.weight" in tensors:
      out[f"{ours}conv_proj/kernel"] = _std_conv(take(f"{theirs}downsample.conv.weight"))
      out[f"{ours}gn_proj/scale"] = take(f"{theirs}downsample.norm.weight")
      out[f"{ours}gn_proj/bias"] = take(f"{theirs}downsample.norm.bias")
  return out


def from_timm(tensors: dict[str, np.ndarray], num_heads: int, source: str) -> Params:
  """Our per-layer parameter tree (official layout) of timm's state dict; one error names
  every timm array this model has no place for (fc_norm, layer scale, registers, ...)."""
  tensors = {k: np.asarray(v, np.float32) for k, v in tensors.items()}
  unused = set(tensors)

  def take(key: str) -> np.ndarray:
    unused.discard(key)
    return tensors[key]

  t = lambda key: np.ascontiguousarray(take(key).T)
  width = tensors["patch_embed.proj.weight"].shape[0]
  dh = width // num_heads
  flat = {
    "embedding/kernel": _conv(take("patch_embed.proj.weight")),
    "embedding/bias": take("patch_embed.proj.bias"),
    architecture.POSEMB: take("pos_embed"),
    "Transformer/encoder_norm/scale": take("norm.weight"),
    "Transformer/encoder_norm/bias": take("norm.bias"),
  }
  for key, ours in (("cls_token", "cls"), ("head", "head"), ("pre_logits.fc", "pre_logits")):
    if key == "cls_token" and key in tensors:
      flat[ours] = take(key)
    elif f"{key}.weight" in tensors:
      flat[f"{ours}/kernel"], flat[f"{ours}/bias"] = t(f"{key}.weight"), take(f"{key}.bias")
  for i in sorted({int(m[1]) for k in tensors if (m := _BLOCK.match(k))}):
    theirs, ours = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
    att = ours + "MultiHeadDotProductAttention_1/"
    qkv_w = take(theirs + "attn.qkv.weight").reshape(3, width, width)  # [3, D out, D in]
    qkv_b = take(theirs + "attn.qkv.bias").reshape(3, num_heads, dh)
    for j, name in enumerate(("query", "key", "value")):
      flat[f"{att}{name}/kernel"] = np.ascontiguousarray(qkv_w[j].T).reshape(width, num_heads, dh)
      flat[f"{att}{name}/bias"] = qkv_b[j]
    flat[f"{att}out/kernel"] = t(theirs + "attn.proj.weight").reshape(num_heads, dh, width)
    flat[f"{att}out/bias"] = take(theirs + "attn.proj.bias")
    for ln, norm in (("LayerNorm_0", "norm1"), ("LayerNorm_2", "norm2")):
      flat[f"{ours}{ln}/scale"] = take(f"{theirs}{norm}.weight")
      flat[f"{ours}{ln}/bias"] = take(f"{theirs}{norm}.bias")
    for dense, fc in (("Dense_0", "fc1"), ("Dense_1", "fc2")):
      flat[f"{ours}MlpBlock_3/{dense}/kernel"] = t(f"{theirs}mlp.{fc}.weight")
      flat[f"{ours}MlpBlock_3/{dense}/bias"] = take(f"{theirs}mlp.{fc}.bias")
  if any(k.startswith(_BACKBONE) for k in tensors):
    flat.update(_resnet(tensors, take))
  if unused:
    raise errors.CheckpointError(
      f"{source}: {len(unused)} timm arrays have no place in this ViT (it has a class "
      "token or global average pooling after the final norm, a learned 1-D position table, "
      f"no layer scale, fc_norm or register tokens): {sorted(unused)[:6]}."
    )
  return traverse_util.unflatten_dict(flat, sep="/")


def _zero_class_posemb(params: Params) -> Params:
  """timm's ``no_embed_class`` (FlexiViT): the table covers the patches only and the class
  token gets no position embedding, which is this ViT's table with a zero class row."""
  flat = traverse_util.flatten_dict(params, sep="/")
  table = flat[architecture.POSEMB]  # [1, N, D]
  flat[architecture.POSEMB] = np.concatenate([np.zeros_like(table[:, :1]), table], axis=1)
  return traverse_util.unflatten_dict(flat, sep="/")


def read(
  path: str,
) -> tuple[ml_collections.ConfigDict, Params, Optional[list[str]], Optional[tuple[int, int]]]:
  """(model config, per-layer params, class names or None, image size) of a timm
  `.safetensors` file or a directory holding `model.safetensors`."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

  from vit_jax.weights import timm_mixer  # pylint: disable=g-import-not-at-top  (it imports this)

  directory, weights = (
    (path, os.path.join(path, timm_export.WEIGHTS))
    if os.path.isdir(path)
    else (os.path.dirname(path), path)
  )
  timm_name, args, names = _arguments(directory)
  if not os.path.isfile(weights):
    raise errors.CheckpointError(
      f"No {timm_export.WEIGHTS} in {directory!r} (a pickled pytorch_model.bin is not read: "
      "save the state dict with safetensors.torch.save_file first)."
    )
  tensors = load_file(weights)
  if timm_mixer.STEM in tensors:
    return loaded(timm_mixer.from_timm(tensors, repr(path)), args, names, path)
  if "patch_embed.proj.weight" not in tensors:
    raise errors.CheckpointError(
      f"{weights!r} is not a timm ViT state dict (no patch_embed.proj.weight): a "
      "Hugging Face transformers checkpoint is read from its folder (with config.json)."
    )
  pool = args.get("global_pool", "token" if "cls_token" in tensors else "avg")
  if pool not in ("token", "avg", "") or (pool == "avg" and "cls_token" in tensors):
    raise errors.CheckpointError(
      f"{path!r}: timm global_pool {pool!r} with{'' if 'cls_token' in tensors else 'out'} "
      "a class token; this ViT pools by the class token ('token') or, without one, by the "
      "average ('avg')."
    )
  width = tensors["patch_embed.proj.weight"].shape[0]
  params = from_timm(tensors, _num_heads(timm_name, args, width, repr(path)), repr(path))
  # FlexiViT's factories set no_embed_class themselves: the hub config does not record it.
  if args.get("no_embed_class", timm_name.startswith(_FLEXIVIT)) and "cls" in params:
    params = _zero_class_posemb(params)
  return loaded(params, args, names, path)


def gelu_approximate(args: dict[str, Any], path: str) -> bool:
  """Whether timm's ``act_layer`` (a model argument) is the tanh GELU; other than a GELU: an
  error."""
  act = args.get("act_layer")
  if act not in _APPROXIMATE:
    raise errors.CheckpointError(
      f"{path!r}: timm act_layer {act!r} is not a GELU this model has ({_ACT_NAMES})."
    )
  return _APPROXIMATE[act]


def loaded(
  params: Params, args: dict[str, Any], names: Optional[list[str]], path: str
) -> tuple[ml_collections.ConfigDict, Params, Optional[list[str]], Optional[tuple[int, int]]]:
  """`read`'s result for imported ``params``: the inferred config with timm's GELU."""
  config = architecture.infer_model_config(params)
  config.gelu_approximate = gelu_approximate(args, path)
  if names is not None and len(names) != architecture.num_classes(params):
    names = None
  return config, params, names, architecture.trained_image_size(params, config)
