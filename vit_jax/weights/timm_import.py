"""timm `VisionTransformer` (and its ResNet hybrids) -> our parameters, numpy only; a timm
`MlpMixer` (a ``stem.proj`` instead of a ``patch_embed``) goes to `timm_mixer`, a BiT
ResNet-v2 (``stem.conv``) to `timm_bit`.

The inverse of `vit_jax.weights.timm`'s export. A timm checkpoint is a `model.safetensors`
(timm's state dict) with, from the hub or `timm.models.save_for_hf`, a `config.json`
naming the architecture (``architecture``, ``model_args``, ``global_pool``,
``pretrained_cfg`` with the input ``mean``/``std``), or with our export's `timm_model.json`.
The arrays give the shapes and which parts exist (class token, registers, LayerScale,
``norm_pre``, ``fc_norm``, the MAP head); the rest comes from the config's ``model_args``,
else from the family's registered defaults in timm (`_family_args`: CLIP's LayerNorm
epsilon 1e-5 and QuickGELU, DINOv2-reg's and the register-gap ViTs' position table
without prefix rows, SigLIP's MAP pooling), else from timm's size in the architecture name
or the width of an official variant (the head count). timm's default GELU is exact.

Hybrid kernels: timm standardises as (w - mean) / sqrt(var + 1e-8), our model as
(w - mean) / (std + 1e-5); each kernel is rescaled so that our model computes timm's.
Pickled checkpoints (`.bin`, `.pth`) are never read (`vit_jax.weights.sources`).
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

import ml_collections
import numpy as np
from flax import traverse_util

from vit_jax import errors, models
from vit_jax.aliases import Params
from vit_jax.weights import architecture, expressible, files, timm_bit, timm_mixer
from vit_jax.weights import timm as timm_export

CONFIG = "config.json"  # timm's hub config (architecture, model_args, pretrained_cfg)
_APPROXIMATE = {v: k for k, v in timm_export._ACT_LAYER.items()}  # act_layer -> tanh GELU?
_APPROXIMATE.update({"gelu_pytorch_tanh": True, None: False})  # None: timm's nn.GELU
_QUICK_GELU = "quick_gelu"  # timm's act_layer name; ours is the same
_ACT_NAMES = ", ".join(repr(k) for k in (*_APPROXIMATE, _QUICK_GELU) if k)
# timm global_pool -> our classifier ('' : no pooling, a head on every token)
_CLASSIFIERS = {"token": "token", "avg": "gap", "map": "map", "": "unpooled"}
_HEADS_BY_SIZE = {"tiny": 3, "small": 6, "base": 12, "large": 16, "huge": 16}  # timm's ViTs
_SIZE = re.compile(r"^vit_(tiny|small|base|large|huge)_")
_BLOCK = re.compile(r"^blocks\.(\d+)\.")
_STAGE_UNIT = re.compile(r"^patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.")
_BACKBONE = "patch_embed.backbone."


def is_timm_config(path: str) -> bool:
  """Whether ``path`` is timm's hub `config.json` (it names an ``architecture``)."""
  if not os.path.isfile(path):
    return False
  return "architecture" in files.read_json(path)


def is_timm_dir(path: str) -> bool:
  spec = os.path.isfile(os.path.join(path, timm_export.SPEC))
  return spec or is_timm_config(os.path.join(path, CONFIG))


def _clip_args(name: str) -> dict[str, Any]:
  """OpenAI/LAION CLIP towers: LayerNorm(eps=1e-5) everywhere, QuickGELU where named."""
  if "_clip_" not in name:
    return {}
  return {"layer_norm_eps": 1e-5, **({"act_layer": "quick_gelu"} if "_quickgelu" in name else {})}


def _dinov2_args(name: str) -> dict[str, Any]:
  """DINOv2 (LayerScale 1e-5); with registers the position table has no prefix rows."""
  if not name.endswith("_dinov2"):
    return {}
  return {"init_values": 1e-5, **({"no_embed_class": True} if "_reg" in name else {})}


def _deit3_args(name: str) -> dict[str, Any]:
  """DeiT III: LayerScale 1e-6, no position rows for the class token."""
  return {"init_values": 1e-6, "no_embed_class": True} if name.startswith("deit3_") else {}


def _siglip_args(name: str) -> dict[str, Any]:
  """SigLIP towers: no class token; MAP pooling unless the name says gap."""
  if "_siglip" not in name:
    return {}
  return {"class_token": False, "global_pool": "avg" if "_gap" in name else "map"}


def _gap_args(name: str) -> dict[str, Any]:
  """`vit_*_gap_*` and `vit_*_reg4_gap_*`: no class token, average pooling; the register
  ones without position rows for the registers."""
  if "_gap_" not in name or "_siglip" in name:
    return {}
  return {
    "class_token": False,
    "global_pool": "avg",
    **({"no_embed_class": True} if "_reg" in name else {}),
  }


def _flexivit_args(name: str) -> dict[str, Any]:
  """FlexiViT (timm's ``flexivit_*`` factories): no position embedding on the class token."""
  return {"no_embed_class": True} if name.startswith("flexivit_") else {}


def _family_args(name: str) -> dict[str, Any]:
  """timm's registered model arguments of ``name``'s family that the arrays do not show."""
  args: dict[str, Any] = {}
  for family in (_clip_args, _dinov2_args, _deit3_args, _siglip_args, _gap_args, _flexivit_args):
    args.update(family(name))
  return args


def _arguments(directory: str) -> tuple[str, dict[str, Any], Optional[list[str]], dict[str, Any]]:
  """(architecture, model arguments, class names, pretrained config) from the config beside
  the weights; the arguments are the family's defaults updated with the stored ones."""
  spec_path, config_path = (os.path.join(directory, n) for n in (timm_export.SPEC, CONFIG))
  if os.path.isfile(spec_path):  # our export
    spec = files.read_json(spec_path)
    # model_name None: a Mixer of a shape timm has no name for (built as its class).
    name = spec.get("model_name")
    if not isinstance(name, (str, type(None))) or not isinstance(spec.get("kwargs"), dict):
      raise errors.CheckpointError(f"{spec_path!r} has no model_name and kwargs: re-export it.")
    overlay = _object(spec, "pretrained_cfg_overlay", spec_path)
    name = name or ""
    args = {**_family_args(name), **spec["kwargs"]}
    if "act_layer" in spec:  # a Mixer's, given apart (timm's MlpMixer takes a class)
      args["act_layer"] = spec["act_layer"]
    return name, args, None, overlay
  if is_timm_config(config_path):
    config = files.read_json(config_path)
    if not isinstance(config["architecture"], str):
      raise errors.CheckpointError(f"{config_path!r}: architecture must be a name.")
    name = config["architecture"]
    args = {**_family_args(name), **_object(config, "model_args", config_path)}
    if config.get("global_pool") is not None:
      args["global_pool"] = config["global_pool"]
    names = config.get("label_names")
    named = isinstance(names, list) and all(isinstance(n, str) for n in names)
    if names is not None and not named:
      raise errors.CheckpointError(f"{config_path!r}: label_names must be a list of names.")
    return name, args, names, _object(config, "pretrained_cfg", config_path)
  return "", {}, None, {}


def _object(config: dict[str, Any], key: str, path: str) -> dict[str, Any]:
  """``config[key]`` as a dict (absent or null: empty); anything else is one error."""
  value = config.get(key) or {}
  if not isinstance(value, dict):
    raise errors.CheckpointError(f"{path!r}: {key} is {value!r}, not an object.")
  return dict(value)


def _num_heads(timm_name: str, args: dict[str, Any], width: int, source: str) -> int:
  if args.get("num_heads"):
    return int(args["num_heads"])
  if m := _SIZE.match(timm_name):
    return _HEADS_BY_SIZE[m.group(1)]
  configs = [models.get_model_config(n) for n in models.MODEL_NAMES]
  official = {c.hidden_size: c.transformer.num_heads for c in configs if "transformer" in c}
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


def _heads_in(weight: np.ndarray, num_heads: int) -> np.ndarray:
  """A torch projection weight [H*Dh, D] -> our per-head kernel [D, H, Dh]."""
  return np.ascontiguousarray(weight.T).reshape(weight.shape[1], num_heads, -1)


def _heads_out(weight: np.ndarray, num_heads: int) -> np.ndarray:
  """A torch output projection [D, H*Dh] -> our kernel [H, Dh, D]."""
  return np.ascontiguousarray(weight.T).reshape(num_heads, -1, weight.shape[0])


def _norm(take, theirs: str, ours: str) -> dict[str, np.ndarray]:
  return {f"{ours}/scale": take(f"{theirs}.weight"), f"{ours}/bias": take(f"{theirs}.bias")}


def _mlp(take, theirs: str, ours: str) -> dict[str, np.ndarray]:
  out = {}
  for dense, fc in (("Dense_0", "fc1"), ("Dense_1", "fc2")):
    out[f"{ours}/{dense}/kernel"] = np.ascontiguousarray(take(f"{theirs}.{fc}.weight").T)
    out[f"{ours}/{dense}/bias"] = take(f"{theirs}.{fc}.bias")
  return out


def _block(take, tensors, i: int, num_heads: int) -> dict[str, np.ndarray]:
  """Encoder block ``i``: fused qkv split into query/key/value, LayerScale when present."""
  theirs, ours = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
  att = ours + "MultiHeadDotProductAttention_1/"
  qkv_w = take(theirs + "attn.qkv.weight")  # [3 D, D]
  qkv_b = take(theirs + "attn.qkv.bias").reshape(3, num_heads, -1)
  flat = {}
  for j, (name, w) in enumerate(zip(("query", "key", "value"), np.split(qkv_w, 3))):
    flat[f"{att}{name}/kernel"], flat[f"{att}{name}/bias"] = _heads_in(w, num_heads), qkv_b[j]
  flat[f"{att}out/kernel"] = _heads_out(take(theirs + "attn.proj.weight"), num_heads)
  flat[f"{att}out/bias"] = take(theirs + "attn.proj.bias")
  flat.update(_norm(take, theirs + "norm1", ours + "LayerNorm_0"))
  flat.update(_norm(take, theirs + "norm2", ours + "LayerNorm_2"))
  flat.update(_mlp(take, theirs + "mlp", ours + "MlpBlock_3"))
  for ls, scale in (("ls1", "LayerScale_attention"), ("ls2", "LayerScale_mlp")):
    if f"{theirs}{ls}.gamma" in tensors:  # DINOv2, DeiT III
      flat[f"{ours}{scale}/scale"] = take(f"{theirs}{ls}.gamma")
  return flat


def _map_head(take, num_heads: int) -> dict[str, np.ndarray]:
  """timm's `AttentionPoolLatent` (latent, q, fused kv, proj, norm, mlp) -> big_vision's
  `MAPHead_0` names."""
  ours = "MAPHead_0/"
  att = ours + "MultiHeadDotProductAttention_0/"
  key_w, value_w = np.split(take("attn_pool.kv.weight"), 2)
  key_b, value_b = np.split(take("attn_pool.kv.bias"), 2)
  flat = {
    ours + "probe": take("attn_pool.latent"),
    att + "query/kernel": _heads_in(take("attn_pool.q.weight"), num_heads),
    att + "query/bias": take("attn_pool.q.bias").reshape(num_heads, -1),
    att + "key/kernel": _heads_in(key_w, num_heads),
    att + "key/bias": key_b.reshape(num_heads, -1),
    att + "value/kernel": _heads_in(value_w, num_heads),
    att + "value/bias": value_b.reshape(num_heads, -1),
    att + "out/kernel": _heads_out(take("attn_pool.proj.weight"), num_heads),
    att + "out/bias": take("attn_pool.proj.bias"),
  }
  flat.update(_norm(take, "attn_pool.norm", ours + "LayerNorm_0"))
  flat.update(_mlp(take, "attn_pool.mlp", ours + "MlpBlock_0"))
  return flat


def _embeddings(take, tensors) -> dict[str, np.ndarray]:
  """Patch embedding (CLIP's has no bias: zeros), position table, class token, registers."""
  kernel = take("patch_embed.proj.weight")
  bias = "patch_embed.proj.bias"
  flat = {
    "embedding/kernel": _conv(kernel),
    "embedding/bias": take(bias) if bias in tensors else np.zeros(kernel.shape[0], np.float32),
    architecture.POSEMB: take("pos_embed"),
  }
  if "cls_token" in tensors:
    flat["cls"] = take("cls_token")
  if "reg_token" in tensors:
    flat["registers"] = take("reg_token")
  return flat


def from_timm(tensors: dict[str, np.ndarray], num_heads: int, source: str) -> Params:
  """Our per-layer parameter tree (official layout) of timm's state dict; one error names
  every timm array this model has no place for."""
  tensors = {k: np.asarray(v, np.float32) for k, v in tensors.items()}
  if "dist_token" in tensors:
    raise errors.CheckpointError(
      f"{source}: a distilled DeiT (dist_token, head_dist): timm averages the logits of its "
      "class-token and distillation-token heads, which this ViT does not have; load the "
      "non-distilled deit_* checkpoint of the same size instead."
    )
  unused = set(tensors)

  def take(key: str) -> np.ndarray:
    unused.discard(key)
    return tensors[key]

  flat = _embeddings(take, tensors)
  for ours, theirs in (
    ("Transformer/norm_pre", "norm_pre"),  # CLIP
    ("Transformer/encoder_norm", "norm"),  # absent with fc_norm
    ("fc_norm", "fc_norm"),
  ):
    if f"{theirs}.weight" in tensors:
      flat.update(_norm(take, theirs, ours))
  for key, ours in (("head", "head"), ("pre_logits.fc", "pre_logits")):
    if f"{key}.weight" in tensors:
      flat[f"{ours}/kernel"] = np.ascontiguousarray(take(f"{key}.weight").T)
      flat[f"{ours}/bias"] = take(f"{key}.bias")
  for i in sorted({int(m[1]) for k in tensors if (m := _BLOCK.match(k))}):
    flat.update(_block(take, tensors, i, num_heads))
  if "attn_pool.latent" in tensors:
    flat.update(_map_head(take, num_heads))
  if any(k.startswith(_BACKBONE) for k in tensors):
    flat.update(_resnet(tensors, take))
  if unused:
    raise errors.CheckpointError(
      f"{source}: {len(unused)} timm arrays have no place in this ViT: {sorted(unused)}."
    )
  return traverse_util.unflatten_dict(flat, sep="/")


def read(
  path: str,
) -> tuple[ml_collections.ConfigDict, Params, Optional[list[str]], Optional[tuple[int, int]]]:
  """(model config, per-layer params, class names or None, image size) of a timm
  `.safetensors` file or a directory holding `model.safetensors`."""
  directory, weights = (
    (path, os.path.join(path, timm_export.WEIGHTS))
    if os.path.isdir(path)
    else (os.path.dirname(path), path)
  )
  timm_name, args, names, pretrained_cfg = _arguments(directory)
  expressible.check_timm(timm_name, repr(path))
  if not os.path.isfile(weights):
    raise errors.CheckpointError(
      f"No {timm_export.WEIGHTS} in {directory!r} (a pickled pytorch_model.bin is not read: "
      "save the state dict with safetensors.torch.save_file first)."
    )
  tensors = files.read_safetensors(weights)
  if timm_mixer.STEM in tensors:
    params = timm_mixer.from_timm(tensors, repr(path))
    config = architecture.infer_model_config(params)
    activation, config.gelu_approximate = _activation(args, repr(path))
    if activation != "gelu":
      raise errors.CheckpointError(
        f"{path!r}: a timm MlpMixer with act_layer {activation!r}: the Mixer computes a GELU."
      )
    _read_input_stats(config, pretrained_cfg, repr(path))
    return _loaded(config, params, names)
  if timm_bit.STEM in tensors:
    timm_bit.check_name(timm_name, args, repr(path))
    params = timm_bit.from_timm(tensors, repr(path))
    config = architecture.infer_model_config(params)
    _read_input_stats(config, pretrained_cfg, repr(path))
    return _loaded(config, params, names, _input_size(pretrained_cfg))
  if "patch_embed.proj.weight" not in tensors:
    raise errors.CheckpointError(
      f"{weights!r} is not a timm ViT state dict (no patch_embed.proj.weight): a "
      "Hugging Face transformers checkpoint is read from its folder (with config.json)."
    )
  width = tensors["patch_embed.proj.weight"].shape[0]
  params = from_timm(tensors, _num_heads(timm_name, args, width, repr(path)), repr(path))
  config = architecture.infer_model_config(params)
  _apply_args(config, args, pretrained_cfg, "cls_token" in tensors, repr(path))
  return _loaded(config, params, names)


def _loaded(
  config: ml_collections.ConfigDict,
  params: Params,
  names: Optional[list[str]],
  image_size: Optional[tuple[int, int]] = None,
) -> tuple[ml_collections.ConfigDict, Params, Optional[list[str]], Optional[tuple[int, int]]]:
  """`read`'s result: class names only where they match the head; the image size the
  weights fix (position tables, token MLPs), else ``image_size``."""
  if names is not None and len(names) != architecture.num_classes(params):
    names = None
  return config, params, names, architecture.trained_image_size(params, config) or image_size


def _input_size(pretrained_cfg: dict[str, Any]) -> Optional[tuple[int, int]]:
  """(height, width) of timm's ``pretrained_cfg`` ``input_size`` [C, H, W], if it has one:
  the size a model without position tables (a ResNet) was trained or fine-tuned at."""
  size = pretrained_cfg.get("input_size")
  if isinstance(size, list) and len(size) == 3 and all(isinstance(v, int) for v in size):
    return size[1], size[2]
  return None


def _apply_args(
  config: ml_collections.ConfigDict,
  args: dict[str, Any],
  pretrained_cfg: dict[str, Any],
  has_cls: bool,
  source: str,
) -> None:
  """What the arrays cannot say, from timm's arguments: pooling, the position table's
  prefix rows, LayerNorm epsilon, activation, LayerScale init, input mean and std."""
  pool = args.get("global_pool", "token" if has_cls else "avg")
  if pool not in _CLASSIFIERS or (pool == "token" and not has_cls):
    raise errors.CheckpointError(
      f"{source}: timm global_pool {pool!r} with{'' if has_cls else 'out'} a class token; "
      f"this ViT pools by {', '.join(repr(p) for p in _CLASSIFIERS if p)} ('token' with a "
      "class token)."
    )
  if config.classifier != "map":  # the MAP head's arrays decide
    config.classifier = _CLASSIFIERS[pool]
    config.class_token = has_cls if config.classifier != "token" else None
  if "no_embed_class" in args:
    config.posemb_patches_only = bool(args["no_embed_class"])
  eps = args.get("layer_norm_eps", timm_export.LAYER_NORM_EPS)
  init_values = args.get("init_values")
  for key, value in (("layer_norm_eps", eps), ("init_values", init_values)):
    if value is not None and not _is_number(value):
      raise errors.CheckpointError(f"{source}: timm {key} is {value!r}, not a number.")
  config.layer_norm_epsilon = float(eps)
  if config.layer_scale_init is not None and init_values:
    config.layer_scale_init = float(init_values)
  config.activation, config.gelu_approximate = _activation(args, source)
  _read_input_stats(config, pretrained_cfg, source)


def _activation(args: dict[str, Any], source: str) -> tuple[str, bool]:
  """(our activation, tanh GELU?) of timm's ``act_layer`` model argument."""
  act = args.get("act_layer")
  if act not in _APPROXIMATE and act != _QUICK_GELU:
    raise errors.CheckpointError(
      f"{source}: timm act_layer {act!r} is not an activation this model has ({_ACT_NAMES})."
    )
  return (_QUICK_GELU if act == _QUICK_GELU else "gelu"), _APPROXIMATE.get(act, False)


def _read_input_stats(
  config: ml_collections.ConfigDict, pretrained_cfg: dict[str, Any], source: str
) -> None:
  """The checkpoint's input ``mean``/``std`` (timm's ``pretrained_cfg``) into ``config``."""
  for ours, theirs in (("input_mean", "mean"), ("input_std", "std")):
    value = pretrained_cfg.get(theirs)
    if value is None:
      continue
    if not isinstance(value, list) or len(value) != 3 or not all(_is_number(v) for v in value):
      raise errors.CheckpointError(
        f"{source}: pretrained_cfg {theirs} is {value!r}, not three numbers (one per RGB channel)."
      )
    config[ours] = tuple(float(v) for v in value)


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)
