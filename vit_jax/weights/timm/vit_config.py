"""What a timm ViT's constructor arguments say beyond its arrays, numpy only: the reader of
a `VisionTransformer` state dict with the arguments read beside it (`read_vit`; the
family's `read`), and our settings of a plain-ViT architecture name alone
(`config_from_name`, what `timm.create_model(name)` builds). The arrays are `vit.py`'s.

The rest comes from the arguments (stored in the checkpoint's config, else registered for
the architecture name: `names`), else from the width of an official variant (the head
count): pooling, LayerNorm epsilon, activation, position rows of the prefix tokens,
LayerScale init. A registered architecture this ViT does not compute is refused by name.
timm's default GELU is exact.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from vit_jax import models
from vit_jax.infra import errors
from vit_jax.infra.aliases import Params
from vit_jax.models import options
from vit_jax.models.settings import PatchSettings, ResNetSettings
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
  settings, params = read_vit(tensors, c.name, c.args, c.pretrained_cfg, source)
  return arguments.loaded(settings, params, c.class_names)


def read_vit(
  tensors: dict[str, Any],
  timm_name: str,
  args: dict[str, Any],
  pretrained_cfg: dict[str, Any],
  source: str,
) -> tuple[models.ModelSettings, Params]:
  """(model settings, per-layer params) of a timm ViT state dict, its architecture name and
  the arguments read beside it (``args``: the registered ones updated with the stored);
  whether the name is one this ViT computes is the caller's (`check_computed`)."""
  vit.refuse_distilled(tensors, source)
  width = tensors["patch_embed.proj.weight"].shape[0]
  params = vit.from_timm(tensors, _num_heads(timm_name, args, width, source), source)
  settings = architecture.infer_settings(params)
  return apply_args(settings, args, pretrained_cfg, "cls_token" in tensors, source), params


def apply_args(
  settings: models.ModelSettings,
  args: dict[str, Any],
  pretrained_cfg: dict[str, Any],
  has_cls: bool,
  source: str,
) -> models.ModelSettings:
  """``settings`` with what the arrays cannot say, from timm's arguments: pooling, the
  position table's prefix rows, LayerNorm epsilon, activation, LayerScale init, input mean
  and std."""
  pool = args.get("global_pool", "token" if has_cls else "avg")
  if pool not in _CLASSIFIERS or (pool == "token" and not has_cls):
    raise errors.CheckpointError(
      f"{source}: timm global_pool {pool!r} with{'' if has_cls else 'out'} a class token; "
      f"this ViT pools by {', '.join(repr(p) for p in _CLASSIFIERS if p)} ('token' with a "
      "class token)."
    )
  changes: dict[str, Any] = {}
  if settings.classifier != "map":  # the MAP head's arrays decide
    classifier = _CLASSIFIERS[pool]
    changes.update(classifier=classifier, class_token=has_cls if classifier != "token" else None)
  if "no_embed_class" in args:
    changes["posemb_patches_only"] = bool(args["no_embed_class"])
  eps = args.get("layer_norm_eps", vit.LAYER_NORM_EPS)
  init_values = args.get("init_values")
  for key, value in (("layer_norm_eps", eps), ("init_values", init_values)):
    if value is not None and not arguments.is_number(value):
      raise errors.CheckpointError(f"{source}: timm {key} is {value!r}, not a number.")
  changes["layer_norm_epsilon"] = float(eps)
  if settings.layer_scale_init is not None and init_values:
    changes["layer_scale_init"] = float(init_values)
  if args.get("mlp_layer") == names.GLU_MLP:  # the SwiGLU computes its own SiLU
    args = {k: v for k, v in args.items() if k != "act_layer"}
  changes["activation"], changes["gelu_approximate"] = arguments.activation(args, source)
  changes.update(arguments.input_stats(pretrained_cfg, source))
  return settings.replace(**changes)


def config_from_name(
  name: str, args: dict[str, Any], source: str
) -> tuple[models.ModelSettings, tuple[int, int]]:
  """The family's settings of an architecture ``name`` and its registered ``args``: the
  name checked (`check_computed`), then `config_of`."""
  check_computed(name, source)
  return config_of(name, args, source)


def config_of(
  name: str, args: dict[str, Any], source: str
) -> tuple[models.ModelSettings, tuple[int, int]]:
  """Our model settings of timm's plain-ViT architecture ``name`` with the arguments
  ``args`` (registered for it, or a NaFlexViT's as the ViT it is at one grid), and its
  input size: what timm's own `create_model(name)` builds, read as `read` reads its weights
  (the same `apply_args`)."""
  base = models.variant_settings("ViT-B_16")  # every field at its default
  patch, resnet = args.get("patch_size", 16), None
  if "backbone" in args:  # a hybrid: timm's BiT ResNetV2 stages (none: its root alone)
    stages = [int(n) for n in re.findall(r"\d+", args["backbone"].partition("[")[2])]
    resnet = ResNetSettings(num_layers=tuple(stages), width_factor=1.0)
    patch = args.get("patch_size", 1)  # timm's hybrid default: a 1x1 patch of the features
  mlp, mlp_dim = base.mlp, int(args["embed_dim"] * args.get("mlp_ratio", 4.0))
  if args.get("mlp_layer") == names.GLU_MLP:  # timm's fc1 is the hidden width, gate + value
    mlp, mlp_dim = options.SWIGLU_FUSED, mlp_dim // 2
  pool = args.get("global_pool", "token")
  has_cls = bool(args.get("class_token", True))
  classifier, class_token = base.classifier, base.class_token
  if pool == "map":  # the MAP head, with a class token only where timm keeps one
    classifier, class_token = "map", True if has_cls else None
  norm_pre = bool(args.get("pre_norm", False))
  # timm's fc_norm None: a norm after pooling exactly when the pooling averages.
  fc_norm = pool == "avg" if args.get("fc_norm") is None else bool(args["fc_norm"])
  final_norm = args.get("final_norm") is not False  # False: no final norm, none after pooling
  settings = base.replace(
    name=name,
    resnet=resnet,
    patches=PatchSettings(arguments.pair(patch)),
    hidden_size=int(args["embed_dim"]),
    transformer=dataclasses.replace(
      base.transformer,
      num_layers=int(args["depth"]),
      num_heads=int(args["num_heads"]),
      mlp_dim=mlp_dim,
    ),
    mlp=mlp,
    classifier=classifier,
    class_token=class_token,
    num_registers=int(args.get("reg_tokens", 0)),
    norm_pre=norm_pre,
    fc_norm=fc_norm and final_norm,
    # timm's attention without q/k/v biases where qkv_bias=False
    qkv_bias=options.QKV_BIAS_NONE if args.get("qkv_bias") is False else base.qkv_bias,
    patch_bias=not norm_pre,  # timm's patch convolution: bias=not pre_norm
    final_norm=final_norm,
    layer_scale_init=float(args["init_values"]) if args.get("init_values") else None,
  )
  settings = apply_args(settings, args, {}, has_cls, source)
  size = names.named_size(name, args)
  if resnet is None:  # timm's patch convolution drops what is past the last patch
    size = tuple(s - s % p for s, p in zip(size, settings.patches.size))  # 384 -> 378 at 14
  return settings, size
