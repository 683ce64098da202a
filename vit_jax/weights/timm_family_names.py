"""Our model config of a timm architecture name outside timm's plain `VisionTransformer`:
an Eva (timm's eva.py: DINOv3, EVA-02, ...) and an MLP-Mixer (mlp_mixer.py), from the
arguments timm registers for the name (`timm_names`) and the constructor defaults timm
fills in; what `timm_import.config_from_name` gives for those modules. The name was
checked by `expressible.check_timm` first (a family or argument not computed is refused
there).
"""

from __future__ import annotations

from typing import Any

import ml_collections

from vit_jax import errors, models
from vit_jax.models import options
from vit_jax.weights import timm_eva, timm_names

# Eva's constructor defaults for the shape arguments (timm 1.0.31, `Eva.__init__`).
_EVA_SHAPES: dict[str, Any] = dict(
  timm_names.BASE_SHAPES,
  swiglu_mlp=False,
  swiglu_align_to=0,
  scale_mlp=False,
  scale_attn_inner=False,
  num_reg_tokens=0,
  use_abs_pos_emb=True,
  use_fc_norm=None,
  use_pre_transformer_norm=False,
)
# timm MlpMixer's constructor defaults for what the arrays show (`MlpMixer.__init__`).
_MIXER_SHAPES: dict[str, Any] = dict(
  patch_size=16, num_blocks=8, embed_dim=512, mlp_ratio=(0.5, 4.0)
)


def _square(patch: Any) -> tuple[int, int]:
  return tuple(patch) if isinstance(patch, (list, tuple)) else (int(patch), int(patch))


def eva_config(name: str, args: dict[str, Any]) -> ml_collections.ConfigDict:
  """Our config of timm's Eva ``name`` with its registered arguments ``args`` (the layer
  shapes as `Eva.__init__` builds them: ``int(width * mlp_ratio)`` hidden units, a split
  SwiGLU where ``scale_mlp`` or ``swiglu_align_to``, rounded up to the latter)."""
  a = {**timm_eva.DEFAULTS, **_EVA_SHAPES, **args}
  config = models.get_model_config("ViT-B_16")  # every field; the shape is set below
  config.patches.size = _square(a["patch_size"])
  d = config.hidden_size = int(a["embed_dim"])
  config.transformer.num_layers = int(a["depth"])
  config.transformer.num_heads = int(a["num_heads"])
  hidden = int(d * a["mlp_ratio"])
  if not a["swiglu_mlp"]:
    config.mlp = options.MLP
  elif a["scale_mlp"] or a["swiglu_align_to"]:
    config.mlp = options.SWIGLU
    align = int(a["swiglu_align_to"])
    hidden += -hidden % align if align else 0
  else:
    config.mlp = options.SWIGLU_FUSED  # timm's GluMlp of twice the hidden units
  config.transformer.mlp_dim = hidden
  config.mlp_norm = bool(a["scale_mlp"])
  config.attention_norm = bool(a["scale_attn_inner"])
  # EvaAttention's bias is q and v only; AttentionRope's (attn_type 'rope') one qkv.bias.
  full = options.QKV_BIAS_ALL if a["attn_type"] == "rope" else options.QKV_BIAS_QV
  config.qkv_bias = full if a["qkv_bias"] else options.QKV_BIAS_NONE
  has_cls = bool(a["class_token"])
  config.num_registers = int(a["num_reg_tokens"])
  config.posemb = "learn" if a["use_abs_pos_emb"] else "none"
  config.fc_norm = timm_eva.uses_fc_norm(a)
  config.norm_pre = bool(a["use_pre_transformer_norm"])
  config.patch_bias = not config.norm_pre  # Eva's patch convolution: bias=not norm_pre
  if a["use_post_transformer_norm"] is False and not config.fc_norm:
    config.final_norm = False  # PE's spatial and language towers: no final norm at all
  if a["global_pool"] == "map":  # AttentionPoolLatent's own heads and MLP (PE core)
    config.map_num_heads = a["attn_pool_num_heads"]
    pool_mlp = int(d * (a["attn_pool_mlp_ratio"] or a["mlp_ratio"]))
    config.map_mlp_dim = None if pool_mlp == hidden else pool_mlp
  config.layer_scale_init = 1.0 if a["init_values"] else None  # the value: apply_args
  timm_eva.apply_args(config, a, has_cls, repr(name))
  config.name = name
  return config


def mixer_config(name: str, args: dict[str, Any]) -> ml_collections.ConfigDict:
  """Our Mixer config of timm's ``mixer_*`` ``name`` with its registered arguments: timm's
  token and channel MLP widths are ``int(width * ratio)`` for its two ratios."""
  a = {**_MIXER_SHAPES, **args}
  extra = sorted(set(a) - set(_MIXER_SHAPES) - {"img_size", "num_classes"})
  if extra:  # gMLP, ResMLP and gated Mixers: check_timm refuses them by name first
    raise errors.ConfigError(f"{name!r}: timm MlpMixer arguments {extra} are not computed.")
  config = models.get_model_config("Mixer-B_16")
  config.name = name
  config.patches.size = _square(a["patch_size"])
  d = config.hidden_dim = int(a["embed_dim"])
  config.num_blocks = int(a["num_blocks"])
  tokens, channels = a["mlp_ratio"]
  config.tokens_mlp_dim, config.channels_mlp_dim = int(d * tokens), int(d * channels)
  config.gelu_approximate = False  # timm's nn.GELU
  return config
