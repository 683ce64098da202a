"""Every model of the official repository's table under its official name and config layout.

    from vit_jax import models
    cfg = models.get_model_config("ViT-B_16")   # an ml_collections.ConfigDict
    models.MODEL_NAMES                          # every valid name

Part of the package (not of `configs/`) so that it works after ``pip install`` from any
directory: notebooks and user code need the variants without the repository checkout.

Fields: ``patches.size``, ``hidden_size``, ``transformer.{num_layers, mlp_dim, num_heads,
dropout_rate, attention_dropout_rate}``, ``classifier``, ``representation_size``,
``resnet`` (None, or ``{num_layers: units per stage, width_factor}``), plus this project's
``posemb``, ``gelu_approximate``, ``head_bias_init``, ``axial`` (Axial-ViT), the later
family's options (`family_options`) and execution options (``scan``, ``remat``, ``remat_policy``,
``stoch_depth``, ``attention_impl``, ``dtype``). An MLP-Mixer config (``model_type``
'mixer') has the official Mixer fields instead: ``patches.size``, ``hidden_dim``,
``num_blocks``, ``tokens_mlp_dim``, ``channels_mlp_dim``, plus ``gelu_approximate``,
``head_bias_init`` and ``remat``, ``remat_policy``, ``dtype``. A BiT ResNet-v2 config
(``model_type`` 'bit', the paper's ResNet baselines) has ``resnet`` ({num_layers: units per
stage, width_factor}), ``head_bias_init``, ``input_mean``/``input_std`` and ``remat``,
``remat_policy``, ``dtype``. `vit_jax.models.create_model` builds each module.
"""

from __future__ import annotations

import functools
import typing
from typing import Callable, Optional, Sequence

import ml_collections

from vit_jax.infra import errors, image_constants
from vit_jax.models import bit, mixer, settings


def family_options() -> dict[str, object]:
  """Every option a ViT config may leave out (`settings.ModelSettings`'s fields with a
  default), at the official model's value; an option that defaults to None is a typed
  `ml_collections.FieldReference`, so that ``--config.model.<key>=...`` parses."""
  hints = typing.get_type_hints(settings.ModelSettings)
  options: dict[str, object] = {}
  for key, default in settings.optional_fields().items():
    if default is None:  # Optional[T]: a reference of type T
      kind = next(t for t in typing.get_args(hints[key]) if t is not type(None))
      kind = typing.get_origin(kind) or kind  # tuple[int, int]: a tuple
      default = ml_collections.FieldReference(None, field_type=kind)
    options[key] = default
  return options


def _vit(
  name: str,
  patch: int,
  width: int,
  depth: int,
  mlp: int,
  heads: int,
  resnet_units: Optional[Sequence[int]] = None,
  axial: bool = False,
) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.name = name
  config.patches = ml_collections.ConfigDict({"size": (patch, patch)})
  config.hidden_size = width
  config.transformer = ml_collections.ConfigDict(
    dict(
      num_layers=depth, mlp_dim=mlp, num_heads=heads, dropout_rate=0.0, attention_dropout_rate=0.0
    )
  )
  config.classifier = "token"
  config.representation_size = ml_collections.FieldReference(None, field_type=int)
  config.posemb = "learn"
  # The tanh approximation, as the official model and checkpoints; False: exact GELU.
  config.gelu_approximate = True
  config.resnet = ml_collections.FieldReference(None, field_type=ml_collections.ConfigDict)
  config.update(family_options())  # the options after the paper, at the official values
  # Axial-ViT (paper Appendix D.6): each block a row attention + MLP, then a column
  # attention + MLP, on the patches kept as a grid (no class token: classifier 'gap').
  config.axial = axial
  if axial:
    config.classifier = "gap"
  if resnet_units is not None:
    config.resnet = ml_collections.ConfigDict(
      {"num_layers": tuple(resnet_units), "width_factor": 1.0}
    )
  # Execution options: they change how the model runs, never its parameters' values.
  config.scan = False
  config.remat = False
  config.remat_policy = ml_collections.FieldReference(None, field_type=str)
  config.attention_impl = ml_collections.FieldReference(None, field_type=str)
  # Unset (None): a run computes in its backend's dtype (`backend_defaults`), float32 on
  # a CPU or TPU, bfloat16 on a GPU.
  config.dtype = ml_collections.FieldReference(None, field_type=str)
  return config


def _mixer(
  name: str, patch: int, width: int, depth: int, tokens_mlp: int, channels_mlp: int
) -> ml_collections.ConfigDict:
  """An MLP-Mixer config: the official fields (`configs/models.py` of the official
  repository) and ``model_type`` 'mixer', which `create_model` dispatches on."""
  config = ml_collections.ConfigDict()
  config.name = name
  config.model_type = mixer.MIXER
  config.patches = ml_collections.ConfigDict({"size": (patch, patch)})
  config.hidden_dim = width
  config.num_blocks = depth
  config.tokens_mlp_dim = tokens_mlp
  config.channels_mlp_dim = channels_mlp
  config.gelu_approximate = True  # as the official model and checkpoints (Flax's nn.gelu)
  config.scan = False  # the Mixer's blocks are never scanned; present for the run's checks
  config.remat = False
  config.remat_policy = ml_collections.FieldReference(None, field_type=str)
  config.dtype = "float32"
  return config


def _bit(name: str, units: Sequence[int], width_factor: int) -> ml_collections.ConfigDict:
  """A BiT ResNet-v2 config (``model_type`` 'bit'): ``units`` per stage, e.g. (3, 4, 6, 3)
  for R50, and the width factor (the x in R50x2)."""
  config = ml_collections.ConfigDict()
  config.name = name
  config.model_type = bit.BIT
  config.resnet = ml_collections.ConfigDict(
    {"num_layers": tuple(units), "width_factor": width_factor}
  )
  config.head_bias_init = 0.0
  config.input_mean = image_constants.OFFICIAL_INPUT_MEAN
  config.input_std = image_constants.OFFICIAL_INPUT_STD
  config.scan = False  # units of different shapes are never scanned; present for the checks
  config.remat = False
  config.remat_policy = ml_collections.FieldReference(None, field_type=str)
  config.dtype = "float32"
  return config


def _variant(base: Callable[[], ml_collections.ConfigDict], name: str, **changes):
  """A registered config with fields changed (the official gap-norep and testing-unpooled)."""

  def make() -> ml_collections.ConfigDict:
    config = base()
    config.name = name
    config.update(changes)
    return config

  return make


_TI = dict(width=192, depth=12, mlp=768, heads=3)
_S = dict(width=384, depth=12, mlp=1536, heads=6)
_B = dict(width=768, depth=12, mlp=3072, heads=12)
_L = dict(width=1024, depth=24, mlp=4096, heads=16)
_H = dict(width=1280, depth=32, mlp=5120, heads=16)

_MODEL_CONFIGS: dict[str, Callable[[], ml_collections.ConfigDict]] = {
  "ViT-Ti_16": lambda: _vit("ViT-Ti_16", 16, **_TI),
  "ViT-S_32": lambda: _vit("ViT-S_32", 32, **_S),
  "ViT-S_16": lambda: _vit("ViT-S_16", 16, **_S),
  "ViT-B_32": lambda: _vit("ViT-B_32", 32, **_B),
  "ViT-B_16": lambda: _vit("ViT-B_16", 16, **_B),
  "ViT-B_8": lambda: _vit("ViT-B_8", 8, **_B),
  "ViT-L_32": lambda: _vit("ViT-L_32", 32, **_L),
  "ViT-L_16": lambda: _vit("ViT-L_16", 16, **_L),
  "ViT-H_14": lambda: _vit("ViT-H_14", 14, **_H),
  # Hybrids: a 1x1 "patch" on the ResNet feature map (R50: stage 4 removed, 3-4-9 units).
  "R50+ViT-B_16": lambda: _vit("R50+ViT-B_16", 1, **_B, resnet_units=(3, 4, 9)),
  "R26+ViT-S_32": lambda: _vit("R26+ViT-S_32", 1, **_S, resnet_units=(2, 2, 2, 2)),
  # The root alone downsamples 4x; with 8x8 patches as in the official config the grid
  # is the input downsampled 32x.
  "R+ViT-Ti_16": lambda: _vit("R+ViT-Ti_16", 8, **_TI, resnet_units=()),
  "R26+ViT-B_32": lambda: _vit("R26+ViT-B_32", 1, **_B, resnet_units=(2, 2, 2, 2)),
  # The full R50 (3, 4, 6, 3): stem and four stages downsample 32x.
  "R50+ViT-L_32": lambda: _vit("R50+ViT-L_32", 1, **_L, resnet_units=(3, 4, 6, 3)),
  # The paper's other two hybrids (Sec. 4.1, Table 6): B/32 on the full R50's stage-4
  # output (as L/32), L/16 on the R50 with stage 4 removed (as B/16).
  "R50+ViT-B_32": lambda: _vit("R50+ViT-B_32", 1, **_B, resnet_units=(3, 4, 6, 3)),
  "R50+ViT-L_16": lambda: _vit("R50+ViT-L_16", 1, **_L, resnet_units=(3, 4, 9)),
  # Axial-ViT-B (Appendix D.6): ViT-B's sizes, 12 axial blocks, global average pooling.
  "Axial-ViT-B_32": lambda: _vit("Axial-ViT-B_32", 32, **_B, axial=True),
  "Axial-ViT-B_16": lambda: _vit("Axial-ViT-B_16", 16, **_B, axial=True),
  "Mixer-B_16": lambda: _mixer("Mixer-B_16", 16, 768, 12, 384, 3072),
  "Mixer-B_32": lambda: _mixer("Mixer-B_32", 32, 768, 12, 384, 3072),
  "Mixer-L_16": lambda: _mixer("Mixer-L_16", 16, 1024, 24, 512, 4096),
  # The paper's ResNet baselines (BiT ResNet-v2; Table 6 and Fig. 12), by depth and width.
  **{
    f"BiT-R{depth}x{wf}": functools.partial(_bit, f"BiT-R{depth}x{wf}", units, wf)
    for depth, units, wf in (
      (50, (3, 4, 6, 3), 1),
      (50, (3, 4, 6, 3), 2),
      (101, (3, 4, 23, 3), 1),
      (152, (3, 8, 36, 3), 1),
      (152, (3, 8, 36, 3), 2),
      (152, (3, 8, 36, 3), 4),
      (200, (3, 24, 36, 3), 3),
    )
  },
  # A tiny model for tests and the CPU quickstart.
  "testing": lambda: _vit("testing", 4, width=32, depth=2, mlp=64, heads=2),
}
# The official table's variants of the above: global average pooling, no representation
# layer (as every config here), and the official `testing` model without pooling.
for _name in ("ViT-S_16", "ViT-S_32", "ViT-B_16", "ViT-B_32"):
  _MODEL_CONFIGS[f"{_name}-gap-norep"] = _variant(
    _MODEL_CONFIGS[_name], f"{_name}-gap-norep", classifier="gap"
  )
_MODEL_CONFIGS["testing-unpooled"] = _variant(
  lambda: _vit("testing-unpooled", 16, width=10, depth=1, mlp=10, heads=2),
  "testing-unpooled",
  classifier="unpooled",
)

# The later ViTs people fine-tune, under their common names, at 224x224 and with the
# options and input normalisation of timm's architectures (`vit_base_patch16_siglip_224`,
# `vit_*_patch14_reg4_dinov2`, `vit_base_patch16_clip_224`, `..._clip_quickgelu_224`):
# exact GELU, as timm computes them all (SigLIP was trained in JAX with the tanh one).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_LATER = dict(gelu_approximate=False)
_DINOV2 = dict(
  _LATER,
  num_registers=4,
  layer_scale_init=1e-5,
  posemb_patches_only=True,
  input_mean=image_constants.IMAGENET_MEAN,
  input_std=image_constants.IMAGENET_STD,
)
_CLIP = dict(
  _LATER,
  norm_pre=True,
  patch_bias=False,  # timm's CLIP ViTs: the patch convolution has no bias before norm_pre
  layer_norm_epsilon=1e-5,
  input_mean=CLIP_MEAN,
  input_std=CLIP_STD,
)
# SigLIP's so400m shape (timm's `vit_so400m_patch*_siglip_*`: MLP int(1152 * 3.7362)).
_SO400M = dict(width=1152, depth=27, mlp=4304, heads=16)
_SIGLIP = dict(_LATER, classifier="map")
_SIGLIP2 = dict(_SIGLIP, gelu_approximate=True)  # SigLIP 2's so400m/16 and giant-opt: tanh
# DINOv3 (timm's `vit_*_patch16_dinov3`) and EVA-02 (`eva02_*_patch14_224`, the MIM
# towers), as timm computes them: rotary embeddings, SwiGLU, q+v or no q/k/v biases.
_DINOV3 = dict(
  _LATER,
  posemb="none",
  rope="dinov3",
  rope_temperature=100.0,
  rope_rotate_half=True,
  classifier="gap",
  class_token=True,
  num_registers=4,
  layer_scale_init=1e-5,
  layer_norm_epsilon=1e-5,
  qkv_bias="none",
  input_mean=image_constants.IMAGENET_MEAN,
  input_std=image_constants.IMAGENET_STD,
)
_EVA02 = dict(
  _LATER,
  rope="eva",
  rope_ref_grid=16,
  classifier="gap",
  class_token=True,
  fc_norm=True,
  mlp="swiglu",
  mlp_norm=True,
  qkv_bias="qv",
  input_mean=CLIP_MEAN,
  input_std=CLIP_STD,
)
# Perception Encoder's core image towers (`vit_pe_core_*`): RoPE (columns first, offset 1,
# rescaled to the pre-training grid) beside a learned table, a norm before the blocks, q/k/v
# biases, attention pooling of every token with 8 heads of its own; the head is PE's
# projection to the text space. Naver's RoPE-ViT (`vit_*_patch16_rope[_mixed]_224`): axial
# RoPE (temperature 100) or learned mixed frequencies (10), LayerScale 1e-5, the class token.
_PE_CORE = dict(
  _LATER,
  rope="eva",
  rope_grid_offset=1.0,
  rope_grid_indexing="xy",
  classifier="map",
  class_token=True,
  map_num_heads=8,
  map_include_prefix=True,
  norm_pre=True,
  patch_bias=False,
  layer_norm_epsilon=1e-5,
)
_ROPE_VIT = dict(
  _LATER,
  posemb="none",
  rope="eva",
  rope_temperature=100.0,
  rope_grid_indexing="xy",
  layer_scale_init=1e-5,
  input_mean=image_constants.IMAGENET_MEAN,
  input_std=image_constants.IMAGENET_STD,
)
_ROPE_MIXED = dict(_ROPE_VIT, rope="mixed", rope_temperature=10.0)
# EVA-02 Ti and S: timm's fused SwiGLU (GluMlp) without the inner LayerNorm.
_EVA02_FUSED = dict(_EVA02, mlp="swiglu_fused", mlp_norm=False)
for _name, _base, _changes in (
  ("PE-Core-T_16", lambda: _vit("", 16, **_TI), dict(_PE_CORE, rope_ref_grid=24)),
  ("PE-Core-S_16", lambda: _vit("", 16, **_S), dict(_PE_CORE, rope_ref_grid=24)),
  ("PE-Core-B_16", lambda: _vit("", 16, **_B), dict(_PE_CORE, rope_ref_grid=14)),
  ("PE-Core-L_14", lambda: _vit("", 14, **_L), dict(_PE_CORE, rope_ref_grid=24)),
  ("RoPE-ViT-S_16", lambda: _vit("", 16, **_S), _ROPE_VIT),
  ("RoPE-ViT-B_16", lambda: _vit("", 16, **_B), _ROPE_VIT),
  ("RoPE-ViT-L_16", lambda: _vit("", 16, **_L), _ROPE_VIT),
  ("RoPE-Mixed-ViT-B_16", lambda: _vit("", 16, **_B), _ROPE_MIXED),
  ("DINOv3-S_16", lambda: _vit("", 16, **_S), _DINOV3),
  ("DINOv3-B_16", lambda: _vit("", 16, **_B), _DINOV3),
  ("DINOv3-L_16", lambda: _vit("", 16, **_L), _DINOV3),
  ("EVA02-Ti_14", lambda: _vit("", 14, **dict(_TI, mlp=512)), _EVA02_FUSED),
  ("EVA02-S_14", lambda: _vit("", 14, **dict(_S, mlp=1024)), _EVA02_FUSED),
  ("EVA02-B_14", lambda: _vit("", 14, **dict(_B, mlp=2048)), _EVA02),
  ("EVA02-L_14", lambda: _vit("", 14, **dict(_L, mlp=2730)), _EVA02),
  ("SigLIP-B_16", lambda: _vit("", 16, **_B), _SIGLIP),
  ("SigLIP-So400m_14", lambda: _vit("", 14, **_SO400M), _SIGLIP),
  # SigLIP 2's B/16 tower is SigLIP's architecture (timm's `.v2_webli` weights of the
  # same name); its so400m/16 computes the tanh GELU.
  ("SigLIP2-B_16", lambda: _vit("", 16, **_B), _SIGLIP),
  ("SigLIP2-So400m_16", lambda: _vit("", 16, **_SO400M), _SIGLIP2),
  ("DINOv2-S_14-reg4", lambda: _vit("", 14, **_S), _DINOV2),
  ("DINOv2-B_14-reg4", lambda: _vit("", 14, **_B), _DINOV2),
  ("DINOv2-L_14-reg4", lambda: _vit("", 14, **_L), _DINOV2),
  ("CLIP-B_16", lambda: _vit("", 16, **_B), _CLIP),
  ("CLIP-B_16-quickgelu", lambda: _vit("", 16, **_B), dict(_CLIP, activation="quick_gelu")),
):
  _MODEL_CONFIGS[_name] = _variant(_base, _name, **_changes)
MODEL_NAMES: tuple[str, ...] = tuple(_MODEL_CONFIGS)


def get_model_config(name: str) -> ml_collections.ConfigDict:
  """The config of a named variant; an unknown name lists the valid ones."""
  if name not in _MODEL_CONFIGS:
    raise errors.ConfigError(f"Unknown model {name!r}. Valid names: {', '.join(MODEL_NAMES)}.")
  return _MODEL_CONFIGS[name]()
