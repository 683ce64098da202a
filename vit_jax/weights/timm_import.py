"""A timm folder or `.safetensors` file -> our model config and parameters, numpy only:
what the arrays do not say, read from the folder's config; the arrays themselves go
through the family's table (`timm.from_timm` for a ViT or hybrid, `timm_mixer` for a
``stem.proj`` Mixer, `timm_bit` for a ``stem.conv`` BiT ResNet-v2).

A timm checkpoint is a `model.safetensors` (timm's state dict) with, from the hub or
`timm.models.save_for_hf`, a `config.json` naming the architecture (``architecture``,
``model_args``, ``global_pool``, ``pretrained_cfg`` with the input ``mean``/``std``), or
with our export's `timm_model.json`. The arrays give the shapes and which parts exist
(class token, registers, LayerScale, ``norm_pre``, ``fc_norm``, the MAP head); the rest
comes from the config's ``model_args``, else from the arguments timm registers for the
architecture name (`timm_names`: heads, pooling, LayerNorm epsilon, activation, position
rows of the prefix tokens, LayerScale init), else from the width of an official variant
(the head count); a registered architecture this ViT does not compute is refused by
name. timm's default GELU is exact. Pickled checkpoints (`.bin`, `.pth`) are never read
(`vit_jax.weights.sources`).
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

import ml_collections

from vit_jax import errors, models
from vit_jax.aliases import Params
from vit_jax.data import data_config as data_config_lib
from vit_jax.models import options
from vit_jax.weights import (
  architecture,
  expressible,
  files,
  timm_bit,
  timm_eva,
  timm_family_names,
  timm_mixer,
  timm_naflex,
  timm_names,
)
from vit_jax.weights import timm as timm_vit

CONFIG = "config.json"  # timm's hub config (architecture, model_args, pretrained_cfg)
# timm act_layer -> (our activation, tanh GELU?); None: timm's default nn.GELU.
_ACTIVATIONS = {name: ours for ours, name in timm_vit.ACT_LAYERS.items()}
_ACTIVATIONS.update({"gelu_pytorch_tanh": ("gelu", True), None: ("gelu", False)})
_ACT_NAMES = ", ".join(repr(k) for k in _ACTIVATIONS if k)
# timm global_pool -> our classifier ('' : no pooling, a head on every token)
_CLASSIFIERS = {pool: ours for ours, pool in timm_vit.POOLS.items()} | {"": "unpooled"}


def is_timm_config(path: str) -> bool:
  """Whether ``path`` is timm's hub `config.json` (it names an ``architecture``)."""
  if not os.path.isfile(path):
    return False
  return "architecture" in files.read_json(path)


def is_timm_dir(path: str) -> bool:
  spec = os.path.isfile(os.path.join(path, timm_vit.SPEC))
  return spec or is_timm_config(os.path.join(path, CONFIG))


def _arguments(directory: str) -> tuple[str, dict[str, Any], Optional[list[str]], dict[str, Any]]:
  """(architecture, model arguments, class names, pretrained config) from the config beside
  the weights; the arguments are the family's defaults updated with the stored ones."""
  spec_path, config_path = (os.path.join(directory, n) for n in (timm_vit.SPEC, CONFIG))
  if os.path.isfile(spec_path):  # our export
    spec = files.read_json(spec_path)
    # model_name None: a Mixer of a shape timm has no name for (built as its class).
    name = spec.get("model_name")
    if not isinstance(name, (str, type(None))) or not isinstance(spec.get("kwargs"), dict):
      raise errors.CheckpointError(f"{spec_path!r} has no model_name and kwargs: re-export it.")
    overlay = _object(spec, "pretrained_cfg_overlay", spec_path)
    name = name or ""
    args = {**timm_names.model_args(name), **spec["kwargs"]}
    if "act_layer" in spec:  # a Mixer's, given apart (timm's MlpMixer takes a class)
      args["act_layer"] = spec["act_layer"]
    return name, args, None, overlay
  if is_timm_config(config_path):
    config = files.read_json(config_path)
    if not isinstance(config["architecture"], str):
      raise errors.CheckpointError(f"{config_path!r}: architecture must be a name.")
    name = config["architecture"]
    args = {**timm_names.model_args(name), **_object(config, "model_args", config_path)}
    if config.get("global_pool") is not None:
      args["global_pool"] = config["global_pool"]
    names = config.get("label_names")
    named = isinstance(names, list) and all(isinstance(n, str) for n in names)
    if names is not None and not named:
      raise errors.CheckpointError(f"{config_path!r}: label_names must be a list of names.")
    return name, args, names, _object(config, "pretrained_cfg", config_path)
  return "", {}, None, {}


def read_data_config(
  directory: str, config: ml_collections.ConfigDict, image_size: tuple[int, int]
) -> data_config_lib.DataConfig:
  """The eval preprocessing of timm's ``pretrained_cfg`` beside the weights (timm's
  defaults for what it leaves out; the mean and std the model config read from it)."""
  pretrained_cfg = _arguments(directory)[3]
  config = models.with_family_defaults(config)
  stats = {"mean": list(config.input_mean), "std": list(config.input_std)}
  return data_config_lib.from_timm({**pretrained_cfg, **stats}, image_size)


def _object(config: dict[str, Any], key: str, path: str) -> dict[str, Any]:
  """``config[key]`` as a dict (absent or null: empty); anything else is one error."""
  value = config.get(key) or {}
  if not isinstance(value, dict):
    raise errors.CheckpointError(f"{path!r}: {key} is {value!r}, not an object.")
  return dict(value)


def _num_heads(timm_name: str, args: dict[str, Any], width: int, source: str) -> int:
  """timm's ``num_heads`` (the stored or registered arguments), else an official variant's
  of the same width."""
  if args.get("num_heads"):
    return int(args["num_heads"])
  configs = [models.get_model_config(n) for n in models.MODEL_NAMES]
  official = {c.hidden_size: c.transformer.num_heads for c in configs if "transformer" in c}
  if width in official:
    return official[width]
  raise errors.CheckpointError(
    f"{source}: the head count of a width-{width} timm ViT {timm_name!r} is not in the arrays "
    "and neither timm's registry nor a config.json beside them gives it: put timm's "
    "config.json (architecture, model_args with num_heads) next to the .safetensors file."
  )


def _check_computed(timm_name: str, source: str) -> None:
  """A registered architecture whose arguments this ViT does not compute is one error."""
  problems = timm_names.unsupported(timm_names.registered_args(timm_name) or {})
  if problems:
    raise errors.CheckpointError(
      f"{source}: timm's {timm_name!r} has {', '.join(problems)}, which this ViT does not compute."
    )


def read(
  path: str,
) -> tuple[ml_collections.ConfigDict, Params, Optional[list[str]], Optional[tuple[int, int]]]:
  """(model config, per-layer params, class names or None, image size) of a timm
  `.safetensors` file or a directory holding `model.safetensors`."""
  directory, weights = (
    (path, os.path.join(path, timm_vit.WEIGHTS))
    if os.path.isdir(path)
    else (os.path.dirname(path), path)
  )
  timm_name, args, names, pretrained_cfg = _arguments(directory)
  expressible.check_timm(timm_name, repr(path))
  if not os.path.isfile(weights):
    raise errors.CheckpointError(
      f"No {timm_vit.WEIGHTS} in {directory!r} (a pickled pytorch_model.bin is not read: "
      "save the state dict with safetensors.torch.save_file first)."
    )
  tensors = files.read_safetensors(weights)
  reader = next((r for stem, r in _FAMILY_READERS if stem in tensors), _read_vit_dict)
  module = timm_names.module(timm_name)
  reader = {timm_eva.MODULE: _read_eva, timm_naflex.MODULE: _read_naflex}.get(module, reader)
  return reader(tensors, timm_name, args, names, pretrained_cfg, repr(path))


def _read_mixer(tensors, timm_name, args, names, pretrained_cfg, source) -> tuple:
  del timm_name  # the stem's arrays fix the Mixer
  params = timm_mixer.from_timm(tensors, source)
  config = architecture.infer_model_config(params)
  activation, config.gelu_approximate = _activation(args, source)
  if activation != "gelu":
    raise errors.CheckpointError(
      f"{source}: a timm MlpMixer with act_layer {activation!r}: the Mixer computes a GELU."
    )
  _read_input_stats(config, pretrained_cfg, source)
  return _loaded(config, params, names)


def _read_bit(tensors, timm_name, args, names, pretrained_cfg, source) -> tuple:
  timm_bit.check_name(timm_name, args, source)
  params = timm_bit.from_timm(tensors, source)
  config = architecture.infer_model_config(params)
  _read_input_stats(config, pretrained_cfg, source)
  return _loaded(config, params, names, _input_size(pretrained_cfg))


def _read_vit_dict(tensors, timm_name, args, names, pretrained_cfg, source) -> tuple:
  if "blocks.0.gamma_1" in tensors or "blocks.0.attn.q_bias" in tensors:
    raise errors.CheckpointError(
      f"{source} is a timm Eva state dict (DINOv3, EVA-02): its rotary embedding is in no "
      "array; put timm's config.json naming the architecture next to it."
    )
  if "patch_embed.proj.weight" not in tensors:
    raise errors.CheckpointError(
      f"{source} is not a timm ViT state dict (no patch_embed.proj.weight): a "
      "Hugging Face transformers checkpoint is read from its folder (with config.json)."
    )
  config, params = read_vit(tensors, timm_name, args, pretrained_cfg, source)
  return _loaded(config, params, names)


def _read_eva(tensors, timm_name, args, names, pretrained_cfg, source) -> tuple:
  config, params = timm_eva.read_eva(tensors, timm_name, args, source)
  _read_input_stats(config, pretrained_cfg, source)
  # RoPE without a table (DINOv3): the size is the pretrained config's, as a ResNet's.
  return _loaded(config, params, names, _input_size(pretrained_cfg))


def _read_naflex(tensors, timm_name, args, names, pretrained_cfg, source) -> tuple:
  """A NaFlexViT read as the ViT it is at its pretrained square input size (else at its
  stored table's grid): `timm_naflex`."""
  problems = timm_naflex.unsupported({**timm_naflex.DEFAULTS, **args})  # stored ones too
  if problems:
    raise errors.CheckpointError(
      f"{source}: timm NaFlexViT {timm_name!r} with {', '.join(problems)}: not computed here."
    )
  stored = timm_naflex.stored_grid(args)
  patch = timm_naflex.vit_args(args)["patch_size"]
  size = _input_size(pretrained_cfg)
  grid = stored if size is None else (size[0] // patch, size[1] // patch)
  if grid[0] != grid[1]:
    raise errors.CheckpointError(
      f"{source}: NaFlexViT at input size {size}: this package reads it at a square grid."
    )
  vit = timm_naflex.to_vit_tensors(tensors, args, grid, source)
  config, params = read_vit(vit, timm_name, timm_naflex.vit_args(args), pretrained_cfg, source)
  return _loaded(config, params, names)


# timm's state dicts by the array only their family has (a ViT's otherwise): its reader.
_FAMILY_READERS = ((timm_mixer.STEM, _read_mixer), (timm_bit.STEM, _read_bit))


def read_vit(
  tensors: dict[str, Any],
  timm_name: str,
  args: dict[str, Any],
  pretrained_cfg: dict[str, Any],
  source: str,
) -> tuple[ml_collections.ConfigDict, Params]:
  """(model config, per-layer params) of a timm ViT state dict, its architecture name and
  the arguments read beside it (``args``: the registered ones updated with the stored)."""
  timm_vit.refuse_distilled(tensors, source)
  if timm_names.module(timm_name) != timm_naflex.MODULE:  # its own check: expressible
    _check_computed(timm_name, source)
  width = tensors["patch_embed.proj.weight"].shape[0]
  params = timm_vit.from_timm(tensors, _num_heads(timm_name, args, width, source), source)
  config = architecture.infer_model_config(params)
  _apply_args(config, args, pretrained_cfg, "cls_token" in tensors, source)
  return config, params


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
  eps = args.get("layer_norm_eps", timm_vit.LAYER_NORM_EPS)
  init_values = args.get("init_values")
  for key, value in (("layer_norm_eps", eps), ("init_values", init_values)):
    if value is not None and not _is_number(value):
      raise errors.CheckpointError(f"{source}: timm {key} is {value!r}, not a number.")
  config.layer_norm_epsilon = float(eps)
  if config.layer_scale_init is not None and init_values:
    config.layer_scale_init = float(init_values)
  if args.get("mlp_layer") == timm_names.GLU_MLP:  # the SwiGLU computes its own SiLU
    args = {k: v for k, v in args.items() if k != "act_layer"}
  config.activation, config.gelu_approximate = _activation(args, source)
  _read_input_stats(config, pretrained_cfg, source)


def _activation(args: dict[str, Any], source: str) -> tuple[str, bool]:
  """(our activation, tanh GELU?) of timm's ``act_layer`` model argument."""
  act = args.get("act_layer")
  if act not in _ACTIVATIONS:
    raise errors.CheckpointError(
      f"{source}: timm act_layer {act!r} is not an activation this model has ({_ACT_NAMES})."
    )
  return _ACTIVATIONS[act]


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


_IMAGE_SIZE = re.compile(r"_(\d+)$")  # timm names end in their input size: ..._224
_TIMM_DEFAULT_SIZE = 224  # timm's VisionTransformer img_size default


def config_from_name(name: str) -> tuple[ml_collections.ConfigDict, tuple[int, int]]:
  """Our model config of timm's plain-ViT architecture ``name`` (``vit_tiny_patch16_224``,
  a ``.tag`` ignored) from the arguments timm registers for it (`timm_names`), and its
  input size; what timm's own `create_model(name)` builds, read as `read` reads its
  weights (the same `_apply_args`). A name that is not in the table, or that this ViT does
  not compute, is one error."""
  arch = name.split(".")[0]
  if timm_names.registered_args(arch) is None:
    raise errors.ConfigError(
      f"{name!r} is neither a model of this package ({', '.join(models.MODEL_NAMES)}) nor a "
      f"timm ViT architecture of timm {timm_names.timm_version()} (e.g. vit_tiny_patch16_224)."
    )
  expressible.check_timm(arch, repr(name))
  args = timm_names.model_args(arch)
  family = _FAMILY_CONFIGS.get(timm_names.module(arch))
  if family is not None:
    return family(arch, args), _named_size(arch, args)
  if timm_names.module(arch) == timm_naflex.MODULE:  # at its stored table's grid
    grid = timm_naflex.stored_grid(args)
    args = timm_naflex.vit_args(args)
    args["img_size"] = [g * args["patch_size"] for g in grid]
  else:
    _check_computed(arch, repr(name))
  config = models.get_model_config("ViT-B_16")  # every field; the shape is set below
  config.name = arch
  patch = args.get("patch_size", 16)
  if "backbone" in args:  # a hybrid: timm's BiT ResNetV2 stages (none: its root alone)
    stages = [int(n) for n in re.findall(r"\d+", args["backbone"].partition("[")[2])]
    config.resnet = ml_collections.ConfigDict({"num_layers": tuple(stages), "width_factor": 1.0})
    patch = args.get("patch_size", 1)  # timm's hybrid default: a 1x1 patch of the features
  config.patches.size = tuple(patch) if isinstance(patch, (list, tuple)) else (patch, patch)
  config.hidden_size = int(args["embed_dim"])
  config.transformer.num_layers = int(args["depth"])
  config.transformer.num_heads = int(args["num_heads"])
  config.transformer.mlp_dim = int(args["embed_dim"] * args.get("mlp_ratio", 4.0))
  if args.get("mlp_layer") == timm_names.GLU_MLP:  # timm's fc1 is the hidden width, gate + value
    config.mlp, config.transformer.mlp_dim = options.SWIGLU_FUSED, config.transformer.mlp_dim // 2
  pool = args.get("global_pool", "token")
  has_cls = bool(args.get("class_token", True))
  if pool == "map":  # the MAP head, with a class token only where timm keeps one
    config.classifier, config.class_token = "map", True if has_cls else None
  config.num_registers = int(args.get("reg_tokens", 0))
  config.norm_pre = bool(args.get("pre_norm", False))
  # timm's fc_norm None: a norm after pooling exactly when the pooling averages.
  fc_norm = args.get("fc_norm")
  config.fc_norm = pool == "avg" if fc_norm is None else bool(fc_norm)
  if args.get("qkv_bias") is False:  # timm's attention without q/k/v biases
    config.qkv_bias = options.QKV_BIAS_NONE
  config.patch_bias = not config.norm_pre  # timm's patch convolution: bias=not pre_norm
  if args.get("final_norm") is False:  # neither the final norm nor one after pooling
    config.final_norm = config.fc_norm = False
  if args.get("init_values"):
    config.layer_scale_init = float(args["init_values"])
  _apply_args(config, args, {}, has_cls, repr(name))
  size = _named_size(arch, args)
  if config.resnet is None:  # timm's patch convolution drops what is past the last patch
    size = tuple(s - s % p for s, p in zip(size, config.patches.size))  # 384 -> 378 at 14
  return config, size


def _named_size(arch: str, args: dict[str, Any]) -> tuple[int, int]:
  """The input size timm builds ``arch`` for: its ``img_size``, else its default weights'
  input size, else the size its name ends in, else timm's default."""
  size = args.get("img_size") or timm_names.input_size(arch)
  if size is None:
    match = _IMAGE_SIZE.search(arch)
    size = int(match.group(1)) if match else _TIMM_DEFAULT_SIZE
  return tuple(size) if isinstance(size, (list, tuple)) else (int(size), int(size))


# timm module -> our config of one of its names and its registered arguments.
_FAMILY_CONFIGS = {
  timm_eva.MODULE: timm_family_names.eva_config,
  "mlp_mixer": timm_family_names.mixer_config,
}
