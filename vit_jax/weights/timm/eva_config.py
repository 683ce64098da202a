"""What a timm Eva's constructor arguments (eva.py: DINOv3, EVA-02, PE, RoPE-ViT) mean for
our settings, numpy only: `DEFAULTS`, the arguments this ViT computes (`unsupported`),
`apply_args` (what a state dict's arrays cannot say), `config_from_name` (our settings from
an architecture name alone, its registered arguments), and `is_eva` (a ViT config that
needs timm's Eva over its ViT). The arrays are `eva.py`'s.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

from vit_jax import models
from vit_jax.infra import errors
from vit_jax.models import options
from vit_jax.models.settings import PatchSettings
from vit_jax.weights.timm import arguments, names

MODULE = "eva"  # timm's module of these architectures (`names.module`)
# Eva's constructor defaults for the arguments read here (timm 1.0.31, `Eva.__init__`).
DEFAULTS: dict[str, Any] = dict(
  global_pool="avg",
  use_fc_norm=None,
  use_post_transformer_norm=None,
  class_token=True,
  use_rot_pos_emb=False,
  rope_type="cat",
  rope_temperature=10000.0,
  rope_rotate_half=False,
  rope_grid_offset=0.0,
  rope_grid_indexing="ij",
  ref_feat_shape=None,
  attn_type="eva",
  attn_pool_num_heads=None,
  attn_pool_mlp_ratio=None,
  no_embed_class=False,
  init_values=None,
  layer_norm_eps=1e-6,  # timm's LayerNorm, Eva's default norm_layer
)
ROPE_KINDS = {"cat": "eva", "dinov3": "dinov3", "mixed": "mixed"}  # timm rope_type -> ours
# timm global_pool -> classifier
POOLS = {"token": "token", "avg": "gap", "map": "map", "": "unpooled"}
ATTN_TYPES = ("eva", "rope")  # EvaAttention (no key bias), AttentionRope (qkv.bias)
EPSILONS = (1e-5, 1e-6)  # the LayerNorm epsilons of timm's registered Eva architectures


def _number(v: Any) -> bool:
  return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _square(v: Any) -> bool:
  return v is None or (isinstance(v, list) and len(v) == 2 and v[0] == v[1])


# Argument -> the values this ViT computes (a callable: a check of the value); arguments
# not here and not in _FREE are refused by name.
_COMPUTED: dict[str, Any] = {
  "global_pool": tuple(POOLS),
  "class_token": (True, False),
  "num_reg_tokens": lambda v: isinstance(v, int) and v >= 0,
  "use_rot_pos_emb": (True, False),
  "rope_type": tuple(ROPE_KINDS),
  "rope_temperature": _number,
  "rope_rotate_half": (True, False),
  "rope_grid_offset": _number,
  "rope_grid_indexing": ("ij", "xy"),
  "attn_type": ATTN_TYPES,
  "attn_pool_num_heads": lambda v: v is None or (isinstance(v, int) and v > 0),
  "attn_pool_mlp_ratio": lambda v: v is None or _number(v),
  "ref_feat_shape": _square,
  "no_embed_class": (True, False),
  "init_values": lambda v: v is None or _number(v),
  "layer_norm_eps": _number,
  "use_fc_norm": (True, False, None),
  "use_post_transformer_norm": (None, True, False),  # False: PE spatial / language
  "use_pre_transformer_norm": (True, False),
  "scale_attn_inner": (True, False),
  "in_chans": (3,),  # what timm.models.save_for_hf writes beside the arguments
}
# Arguments that only fix shapes the arrays show, or how timm runs.
_FREE = {"embed_dim", "depth", "patch_size", "mlp_ratio", "img_size", "num_heads"}
_FREE |= {"num_classes", "dynamic_img_size", "qkv_fused", "qkv_bias", "swiglu_mlp"}
_FREE |= {"swiglu_align_to", "scale_mlp", "use_abs_pos_emb"}


def unsupported(args: dict[str, Any]) -> list[str]:
  """``key=value`` of each Eva argument this package's ViT does not compute."""
  problems = []
  for key, value in args.items():
    accepted = _COMPUTED.get(key)
    if key in _FREE:
      continue
    ok = accepted is not None and (accepted(value) if callable(accepted) else value in accepted)
    if not ok:
      problems.append(f"{key}={value!r}")
  full = {**DEFAULTS, **args}
  if uses_fc_norm(full) and full.get("use_post_transformer_norm"):
    problems.append("use_post_transformer_norm=True beside a norm after pooling (two final norms)")
  return problems


def unexpressed(name: str) -> list[str]:
  """`unsupported` of the arguments timm registers for architecture ``name``."""
  return unsupported({**DEFAULTS, **names.model_args(name)})


def uses_fc_norm(args: dict[str, Any]) -> bool:
  """Whether an Eva of ``args`` (every one of `DEFAULTS` present) normalises after pooling:
  ``use_fc_norm``, else timm's default, with average pooling."""
  return args["global_pool"] == "avg" if args["use_fc_norm"] is None else bool(args["use_fc_norm"])


def apply_args(
  settings: models.ModelSettings, args: dict[str, Any], has_cls: bool, source: str
) -> models.ModelSettings:
  """``settings`` with what an Eva's arrays cannot say, from its arguments (``args``: every
  one of `DEFAULTS` present): pooling, the table's prefix rows, LayerNorm epsilon,
  LayerScale init, the activation and the rotary embedding; every field checked."""
  pool = args["global_pool"]
  if pool == "token" and not has_cls:
    raise errors.CheckpointError(f"{source}: timm global_pool 'token' without a class token.")
  classifier = POOLS[pool]
  changes: dict[str, Any] = dict(
    name="custom",
    classifier=classifier,
    class_token=has_cls if classifier != "token" else None,
    map_include_prefix=pool == "map",  # Eva's attention pool sees every token
    posemb_patches_only=bool(args["no_embed_class"]),
    layer_norm_epsilon=float(args["layer_norm_eps"]),
    activation="gelu",  # Eva's nn.GELU: exact
    gelu_approximate=False,
  )
  if settings.layer_scale_init is not None and args["init_values"]:
    changes["layer_scale_init"] = float(args["init_values"])
  if args["use_rot_pos_emb"]:
    changes.update(_rope(args))
  return settings.replace(**changes)


def _rope(args: dict[str, Any]) -> dict[str, Any]:
  """The rotary embedding's settings of an Eva's arguments."""
  ref, rope = args["ref_feat_shape"], ROPE_KINDS[args["rope_type"]]
  mixed = rope == "mixed"  # timm's RotaryEmbeddingMixed reads neither offset nor grid
  return dict(
    rope=rope,
    rope_temperature=float(args["rope_temperature"]),
    rope_rotate_half=bool(args["rope_rotate_half"]),
    rope_grid_offset=0.0 if mixed else float(args["rope_grid_offset"]),
    rope_ref_grid=None if ref is None or rope != "eva" else int(ref[0]),
    rope_grid_indexing=args["rope_grid_indexing"],
  )


def is_eva(config: Any) -> bool:
  """Whether a ViT config needs timm's Eva (RoPE, SwiGLU, a q and v bias without a key
  bias) over its ViT (which has q/k/v biases or none: ``qkv_bias=False``)."""
  return (
    config.get("rope") is not None
    or config.get("mlp", options.MLP) != options.MLP
    or config.get("qkv_bias", options.QKV_BIAS_ALL) == options.QKV_BIAS_QV
  )


# Eva's constructor defaults for the shape arguments (timm 1.0.31, `Eva.__init__`).
_EVA_SHAPES: dict[str, Any] = dict(
  names.BASE_SHAPES,
  swiglu_mlp=False,
  swiglu_align_to=0,
  scale_mlp=False,
  scale_attn_inner=False,
  num_reg_tokens=0,
  use_abs_pos_emb=True,
  use_fc_norm=None,
  use_pre_transformer_norm=False,
)


def config_from_name(
  name: str, args: dict[str, Any], source: str
) -> tuple[models.ModelSettings, tuple[int, int]]:
  """Our settings of timm's Eva ``name`` with its registered arguments ``args``, and its
  input size (the layer shapes as `Eva.__init__` builds them: ``int(width * mlp_ratio)``
  hidden units, a split SwiGLU where ``scale_mlp`` or ``swiglu_align_to``, rounded up to
  the latter)."""
  a = {**DEFAULTS, **_EVA_SHAPES, **args}
  base = models.variant_settings("ViT-B_16")  # every field at its default
  d = int(a["embed_dim"])
  hidden = int(d * a["mlp_ratio"])
  if not a["swiglu_mlp"]:
    mlp = options.MLP
  elif a["scale_mlp"] or a["swiglu_align_to"]:
    mlp, align = options.SWIGLU, int(a["swiglu_align_to"])
    hidden += -hidden % align if align else 0
  else:
    mlp = options.SWIGLU_FUSED  # timm's GluMlp of twice the hidden units
  # EvaAttention's bias is q and v only; AttentionRope's (attn_type 'rope') one qkv.bias.
  full = options.QKV_BIAS_ALL if a["attn_type"] == "rope" else options.QKV_BIAS_QV
  fc_norm, norm_pre = uses_fc_norm(a), bool(a["use_pre_transformer_norm"])
  map_num_heads = map_mlp_dim = None
  if a["global_pool"] == "map":  # AttentionPoolLatent's own heads and MLP (PE core)
    map_num_heads = a["attn_pool_num_heads"]
    pool_mlp = int(d * (a["attn_pool_mlp_ratio"] or a["mlp_ratio"]))
    map_mlp_dim = None if pool_mlp == hidden else pool_mlp
  settings = base.replace(
    patches=PatchSettings(arguments.pair(a["patch_size"])),
    hidden_size=d,
    transformer=dataclasses.replace(
      base.transformer, num_layers=int(a["depth"]), num_heads=int(a["num_heads"]), mlp_dim=hidden
    ),
    mlp=mlp,
    mlp_norm=bool(a["scale_mlp"]),
    attention_norm=bool(a["scale_attn_inner"]),
    qkv_bias=full if a["qkv_bias"] else options.QKV_BIAS_NONE,
    num_registers=int(a["num_reg_tokens"]),
    posemb="learn" if a["use_abs_pos_emb"] else "none",
    fc_norm=fc_norm,
    norm_pre=norm_pre,
    patch_bias=not norm_pre,  # Eva's patch convolution: bias=not norm_pre
    # PE's spatial and language towers: no final norm at all
    final_norm=not (a["use_post_transformer_norm"] is False and not fc_norm),
    map_num_heads=map_num_heads,
    map_mlp_dim=map_mlp_dim,
    layer_scale_init=1.0 if a["init_values"] else None,  # the value: apply_args
  )
  settings = apply_args(settings, a, bool(a["class_token"]), source)
  return settings.replace(name=name), names.named_size(name, args)
