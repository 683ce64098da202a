"""What a timm ViT's constructor arguments say beyond its arrays, numpy only: the reader of
a `VisionTransformer` state dict with the arguments read beside it (`read_vit`; the
family's `read`), and our config of a plain-ViT architecture name alone
(`config_from_name`, what `timm.create_model(name)` builds). The arrays are `vit.py`'s.

The rest comes from the arguments (stored in the checkpoint's config, else registered for
the architecture name: `names`), else from the width of an official variant (the head
count): pooling, LayerNorm epsilon, activation, position rows of the prefix tokens,
LayerScale init. A registered architecture this ViT does not compute is refused by name.
timm's default GELU is exact.
"""

from __future__ import annotations

import re
from typing import Any

import ml_collections

from vit_jax import models
from vit_jax.infra import errors
from vit_jax.infra.aliases import Params
from vit_jax.models import options
from vit_jax.weights import architecture
from vit_jax.weights.timm import arguments, names, vit

# timm's modules of the plain ViT, its hybrids and DeiT (`names.module`).
MODULES = ("vision_transformer", "vision_transformer_hybrid", "deit")
# timm global_pool -> our classifier ('' : no pooling, a head on every token)
_CLASSIFIERS = {pool: ours for ours, pool in vit.POOLS.items()} | {"": "unpooled"}


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


def check_computed(timm_name: str, source: str) -> None:
  """A registered architecture whose arguments this ViT does not compute is one error."""
  problems = names.unsupported(names.registered_args(timm_name) or {})
  if problems:
    raise errors.CheckpointError(
      f"{source}: timm's {timm_name!r} has {', '.join(problems)}, which this ViT does not compute."
    )


def read(checkpoint: arguments.Checkpoint) -> arguments.Loaded:
  """The family's reader: a timm ViT state dict (an Eva's without its config, which alone
  says its rotary embedding, is one error; a distilled DeiT another), its architecture
  name checked before its arrays are read."""
  tensors, source = checkpoint.tensors, checkpoint.source
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
  vit.refuse_distilled(tensors, source)  # before the name's check: it says what to load
  check_computed(checkpoint.name, source)
  c = checkpoint
  config, params = read_vit(tensors, c.name, c.args, c.pretrained_cfg, source)
  return arguments.loaded(config, params, c.class_names)


def read_vit(
  tensors: dict[str, Any],
  timm_name: str,
  args: dict[str, Any],
  pretrained_cfg: dict[str, Any],
  source: str,
) -> tuple[ml_collections.ConfigDict, Params]:
  """(model config, per-layer params) of a timm ViT state dict, its architecture name and
  the arguments read beside it (``args``: the registered ones updated with the stored);
  whether the name is one this ViT computes is the caller's (`check_computed`)."""
  vit.refuse_distilled(tensors, source)
  width = tensors["patch_embed.proj.weight"].shape[0]
  params = vit.from_timm(tensors, _num_heads(timm_name, args, width, source), source)
  config = architecture.infer_model_config(params)
  apply_args(config, args, pretrained_cfg, "cls_token" in tensors, source)
  return config, params


def apply_args(
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
  eps = args.get("layer_norm_eps", vit.LAYER_NORM_EPS)
  init_values = args.get("init_values")
  for key, value in (("layer_norm_eps", eps), ("init_values", init_values)):
    if value is not None and not arguments.is_number(value):
      raise errors.CheckpointError(f"{source}: timm {key} is {value!r}, not a number.")
  config.layer_norm_epsilon = float(eps)
  if config.layer_scale_init is not None and init_values:
    config.layer_scale_init = float(init_values)
  if args.get("mlp_layer") == names.GLU_MLP:  # the SwiGLU computes its own SiLU
    args = {k: v for k, v in args.items() if k != "act_layer"}
  config.activation, config.gelu_approximate = arguments.activation(args, source)
  arguments.read_input_stats(config, pretrained_cfg, source)


def config_from_name(
  name: str, args: dict[str, Any], source: str
) -> tuple[ml_collections.ConfigDict, tuple[int, int]]:
  """The family's config of an architecture ``name`` and its registered ``args``: the
  name checked (`check_computed`), then `config_of`."""
  check_computed(name, source)
  return config_of(name, args, source)


def config_of(
  name: str, args: dict[str, Any], source: str
) -> tuple[ml_collections.ConfigDict, tuple[int, int]]:
  """Our model config of timm's plain-ViT architecture ``name`` with the arguments ``args``
  (registered for it, or a NaFlexViT's as the ViT it is at one grid), and its input size:
  what timm's own `create_model(name)` builds, read as `read` reads its weights (the same
  `apply_args`)."""
  config = models.get_model_config("ViT-B_16")  # every field; the shape is set below
  config.name = name
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
  if args.get("mlp_layer") == names.GLU_MLP:  # timm's fc1 is the hidden width, gate + value
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
  apply_args(config, args, {}, has_cls, source)
  size = names.named_size(name, args)
  if config.resnet is None:  # timm's patch convolution drops what is past the last patch
    size = tuple(s - s % p for s, p in zip(size, config.patches.size))  # 384 -> 378 at 14
  return config, size
