"""A model config (the layout of `variants.py`) as typed, checked, immutable settings.

    settings = models.model_settings(config.model)   # every field checked, once

A ViT config gives `ModelSettings`, an MLP-Mixer config (``model_type`` 'mixer') gives
`MixerSettings`, a BiT ResNet config (``model_type`` 'bit') `BitSettings`; the family
registry (`models/families.py`) picks the class.

`vit_jax.run.resolve` builds them before anything is built, and `create_model` for a
ConfigDict given to it directly; the checks are the model modules' own functions
(`options.check_classifier`, `execution.remat_policy`, `posemb.check_posemb`, ...), so each rule is
written once. The settings read like the ConfigDict (``settings.transformer.num_layers``,
``settings.get("resnet")``), so code written against the config layout takes either.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Optional

import jax.numpy as jnp

from vit_jax.infra import errors
from vit_jax.infra.image_constants import OFFICIAL_INPUT_MEAN, OFFICIAL_INPUT_STD
from vit_jax.models import bit, execution, layers, mixer, naflex, options
from vit_jax.models import posemb as posemb_lib
from vit_jax.models import rope as rope_lib


def _read(node: Any, key: str, where: str) -> Any:
  """``node[key]``; a missing key fails naming ``config.<where>.<key>``."""
  try:
    return node[key]
  except (KeyError, AttributeError, TypeError):
    raise errors.ConfigError(
      f"config.{where}.{key} is missing: start the model config from "
      "vit_jax.models.get_model_config(<name>)."
    ) from None


def _int(value: Any, key: str, low: int = 1) -> int:
  if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
    raise errors.ConfigError(f"config.model.{key}={value!r} must be an integer >= {low}.")
  return int(value)


def _rate(value: Any, key: str) -> float:
  if not isinstance(value, numbers.Real) or isinstance(value, bool) or not 0.0 <= value < 1.0:
    raise errors.ConfigError(f"config.model.{key}={value!r} must be a rate in [0, 1).")
  return float(value)


def _finite(value: Any, key: str) -> float:
  if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
    raise errors.ConfigError(f"config.model.{key}={value!r} must be a finite number.")
  return float(value)


def _bool(value: Any, key: str) -> bool:
  if not isinstance(value, bool):
    raise errors.ConfigError(f"config.model.{key}={value!r} must be True or False.")
  return value


def dtype_name(value: Any) -> Optional[str]:
  """The name of the floating-point dtype ``value`` ('bfloat16', jnp.bfloat16, ...); None
  stays None (`execution.UNSET`: a run takes its backend's choice)."""
  if value is execution.UNSET:
    return None
  try:
    dtype = jnp.dtype(value)
  except TypeError:
    dtype = None
  if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
    raise errors.ConfigError(
      f"config.model.dtype={value!r} is not a floating-point dtype: use e.g. 'float32' or "
      "'bfloat16'."
    )
  return dtype.name


@dataclasses.dataclass(frozen=True)
class PatchSettings:
  size: tuple[int, int]  # patch height and width, in input pixels (hybrids: feature cells)


@dataclasses.dataclass(frozen=True)
class TransformerSettings:
  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float
  attention_dropout_rate: float


@dataclasses.dataclass(frozen=True)
class ResNetSettings:
  num_layers: tuple[int, ...]  # units per stage; (): the root alone
  width_factor: float


@dataclasses.dataclass(frozen=True)
class ModelSettings:
  """Every field of a model config (`variants.py`), checked when built."""

  name: str
  patches: PatchSettings
  hidden_size: int
  transformer: TransformerSettings
  classifier: str  # `heads.CLASSIFIERS`
  representation_size: Optional[int]  # None: no tanh pre-logits
  posemb: str  # `posemb.POSEMB_KINDS`
  gelu_approximate: bool  # tanh GELU (official); False: exact
  resnet: Optional[ResNetSettings]  # None: a plain ViT
  scan: bool
  remat: bool
  remat_policy: Optional[str]  # a name in `jax.checkpoint_policies`
  attention_impl: Optional[str]  # `execution.ATTENTION_IMPLS`
  # the computation's, e.g. 'bfloat16' (parameters stay float32); None: unset (a run takes
  # its backend's, `backend_defaults`; a model built alone computes in float32)
  dtype: Optional[str]
  # The options that came after the paper: each defaults to the official model's value,
  # the one place it is stated (`variants` writes these defaults into every ViT config, and
  # a config saved before an option existed reads it here). Checked by `options`.
  stoch_depth: float = 0.0  # the last block's drop-path rate (timm's linear schedule)
  head_bias_init: float = 0.0  # the head's initial bias (AugReg's sigmoid runs: -6.9)
  axial: bool = False  # Axial-ViT blocks (paper Appendix D.6)
  num_registers: int = 0  # register tokens after the class token (DINOv2-reg)
  class_token: Optional[bool] = None  # None: only with classifier='token'
  posemb_patches_only: bool = False  # timm's no_embed_class: no position rows for the prefix
  # The learned table's own grid, resized to every input's (NaFlex towers); None: the square
  # input's. How NaFlex inputs and such a table resize it (`naflex.TableResample`): big_vision's
  # 'bilinear' or timm's 'bicubic', antialiased or not, timm's pos_embed_ar_preserving
  # (``posemb_keep_aspect``); None: a table read at one grid, which takes no NaFlex inputs.
  posemb_grid: Optional[tuple[int, int]] = None
  posemb_resample: Optional[str] = "bilinear"  # `naflex.RESAMPLE_METHODS`
  posemb_antialias: bool = True
  posemb_keep_aspect: bool = False
  norm_pre: bool = False  # a LayerNorm before the blocks (CLIP)
  patch_bias: bool = True  # the patch embedding's bias (timm's CLIP-style ViTs: none)
  fc_norm: bool = False  # the final LayerNorm after pooling instead of before (timm's)
  # False: no final LayerNorm at all, before pooling or after (timm's final_norm=False:
  # InternViT, RADIO; Perception Encoder's spatial and language towers).
  final_norm: bool = True
  layer_scale_init: Optional[float] = None  # None: no LayerScale (DINOv2: 1e-5)
  layer_norm_epsilon: float = layers.LAYER_NORM_EPSILON
  # Rotary position embeddings of the queries and keys (`rope.KINDS`: 'eva' for EVA-02, PE
  # and RoPE-ViT's axial, 'dinov3', 'mixed' for RoPE-ViT's learned frequencies; None:
  # none), beside the absolute table of ``posemb`` ('none' for DINOv3).
  rope: Optional[str] = None
  rope_temperature: float = rope_lib.TEMPERATURE
  rope_rotate_half: bool = False  # channel i pairs with i + Dh/2 (DINOv3), else 2i with 2i+1
  rope_grid_offset: float = rope_lib.Rope.grid_offset
  rope_normalize_coords: str = rope_lib.Rope.normalize_coords  # DINOv3's patch centres
  rope_ref_grid: Optional[int] = None  # EVA: the pre-training grid's side (EVA-02-B/14: 16)
  rope_grid_indexing: str = rope_lib.Rope.grid_indexing  # 'xy': columns first (PE, RoPE-ViT)
  # The 'map' head (`heads.MAPHead`): its heads and MLP width (None: the encoder's), and
  # whether its probe attends to the prefix tokens too (Perception Encoder) or the patches.
  map_num_heads: Optional[int] = None
  map_mlp_dim: Optional[int] = None
  map_include_prefix: bool = False
  # `options.MLP_KINDS`: 'mlp' (Dense, GELU, Dense), 'swiglu' (split gate and value, timm's
  # fc1_g/fc1_x), 'swiglu_fused' (one fc1, gate first); ``mlp_norm``: EVA-02's LayerNorm on
  # a SwiGLU's hidden units.
  mlp: str = options.MLP
  mlp_norm: bool = False
  # A LayerNorm on the attention's merged heads before ``out`` (EVA-02 CLIP's sub-LN,
  # timm's ``scale_attn_inner``).
  attention_norm: bool = False
  qkv_bias: str = options.QKV_BIAS_ALL  # `options.QKV_BIASES`: 'all', 'none', 'qv' (EVA)
  # `layers.ACTIVATIONS`: 'gelu' (tanh or exact by gelu_approximate) or 'quick_gelu' (CLIP)
  activation: str = layers.GELU
  # The inputs the weights expect, (x / 255 - mean) / std per RGB channel; recorded from a
  # checkpoint's own preprocessing on import.
  input_mean: tuple[float, ...] = OFFICIAL_INPUT_MEAN
  input_std: tuple[float, ...] = OFFICIAL_INPUT_STD

  def __post_init__(self):
    options.check_classifier(self.classifier)
    options.check_heads(self.hidden_size, self.transformer.num_heads)
    execution.remat_policy(self.remat_policy)
    posemb_lib.check_posemb(self.posemb, self.hidden_size)
    execution.check_attention_impl(self.attention_impl)
    dtype_name(self.dtype)
    if self.resnet is not None and not self.resnet.width_factor > 0:
      raise errors.ConfigError(
        f"config.model.resnet.width_factor={self.resnet.width_factor!r} must be positive."
      )
    options.check_model_config(self)

  @classmethod
  def from_config(cls, config: Any) -> "ModelSettings":
    """Reads a ConfigDict (or a dict) in `variants.py`'s layout; a missing or bad field
    fails with one ConfigError naming ``config.model.<field>``."""
    if isinstance(config, ModelSettings):
      return config
    t = _read(config, "transformer", "model")
    resnet = _read(config, "resnet", "model")
    patch = tuple(_read(_read(config, "patches", "model"), "size", "model.patches"))
    if len(patch) != 2:
      raise errors.ConfigError(f"config.model.patches.size={patch!r} must be (height, width).")
    representation_size = _read(config, "representation_size", "model")
    return cls(
      name=str(_read(config, "name", "model")),
      patches=PatchSettings((_int(patch[0], "patches.size"), _int(patch[1], "patches.size"))),
      hidden_size=_int(_read(config, "hidden_size", "model"), "hidden_size"),
      transformer=TransformerSettings(
        **{
          key: _int(_read(t, key, "model.transformer"), f"transformer.{key}")
          for key in ("num_layers", "mlp_dim", "num_heads")
        },
        **{
          key: _rate(_read(t, key, "model.transformer"), f"transformer.{key}")
          for key in ("dropout_rate", "attention_dropout_rate")
        },
      ),
      classifier=_read(config, "classifier", "model"),
      representation_size=None
      if representation_size is None
      else _int(representation_size, "representation_size"),
      posemb=_read(config, "posemb", "model"),
      gelu_approximate=_bool(_read(config, "gelu_approximate", "model"), "gelu_approximate"),
      resnet=None
      if resnet is None
      else ResNetSettings(
        num_layers=tuple(
          _int(n, "resnet.num_layers") for n in _read(resnet, "num_layers", "model.resnet")
        ),
        width_factor=float(_read(resnet, "width_factor", "model.resnet")),
      ),
      scan=_bool(_read(config, "scan", "model"), "scan"),
      remat=_bool(_read(config, "remat", "model"), "remat"),
      remat_policy=_read(config, "remat_policy", "model"),
      attention_impl=_read(config, "attention_impl", "model"),
      dtype=dtype_name(_read(config, "dtype", "model")),
      **_optional_fields(config),
    )

  @property
  def num_prefix_tokens(self) -> int:
    """Tokens before the patches (`options.num_prefix_tokens`): class token and registers."""
    return options.num_prefix_tokens(self.classifier, self.class_token, self.num_registers)

  def table_resample(self) -> Optional[naflex.TableResample]:
    """How the learned table meets another grid (None: it takes one grid only)."""
    if self.posemb_resample is None:
      return None
    return naflex.TableResample(
      self.posemb_resample, self.posemb_antialias, self.posemb_keep_aspect
    )

  def rotary(self) -> Optional[rope_lib.Rope]:
    """The rotary embedding these settings name (None: no RoPE)."""
    if self.rope is None:
      return None
    side = self.rope_ref_grid
    return rope_lib.Rope(
      self.rope,
      self.rope_temperature,
      self.rope_rotate_half,
      grid_offset=self.rope_grid_offset,
      normalize_coords=self.rope_normalize_coords,
      ref_grid=None if side is None else (side, side),
      grid_indexing=self.rope_grid_indexing,
    )

  def execution_options(self) -> execution.ExecutionOptions:
    """How the model these settings describe runs (`create_model` applies its overrides)."""
    t = self.transformer
    return execution.ExecutionOptions(
      dropout_rate=t.dropout_rate,
      attention_dropout_rate=t.attention_dropout_rate,
      attention_impl=self.attention_impl,
      scan=self.scan,
      remat=self.remat,
      remat_policy=self.remat_policy,
      stoch_depth=self.stoch_depth,
      dtype=execution.compute_dtype(self.dtype),
    )

  def get(self, key: str, default: Any = None) -> Any:
    """``self.<key>``, or ``default`` where there is no such field: reads as a ConfigDict does."""
    return getattr(self, key, default)

  def replace(self, **changes: Any) -> "ModelSettings":
    """These settings with top-level fields changed (e.g. ``remat=True``), checked again."""
    return dataclasses.replace(self, **changes)


def optional_fields() -> dict[str, Any]:
  """Every `ModelSettings` field a config may leave out, at its official value."""
  return {
    f.name: f.default
    for f in dataclasses.fields(ModelSettings)
    if f.default is not dataclasses.MISSING
  }


def _optional_fields(config: Any) -> dict[str, Any]:
  """``config``'s optional fields, each at its official value where the config predates
  it: configs saved before a key existed train and evaluate as before without it. Left as
  written (lists as tuples) for `options.check_model_config`, the numbers checked here."""
  found = {}
  for key, default in optional_fields().items():
    value = config.get(key, default)
    found[key] = tuple(value) if isinstance(value, (list, tuple)) else value
  found["stoch_depth"] = _rate(found["stoch_depth"], "stoch_depth")
  found["head_bias_init"] = _finite(found["head_bias_init"], "head_bias_init")
  return found


def _check_convolutional_family(settings: Any, blocks_are: str, family_has: str) -> None:
  """The checks a Mixer's and a BiT's settings share: remat policy, dtype, input
  statistics, and no scan or stochastic depth (neither family has them)."""
  execution.remat_policy(settings.remat_policy)
  dtype_name(settings.dtype)
  if settings.scan:
    raise errors.ConfigError(f"config.model.scan=True: {blocks_are} not scanned; set it to False.")
  if settings.stoch_depth:
    raise errors.ConfigError(
      f"config.model.stoch_depth={settings.stoch_depth!r}: {family_has} no stochastic "
      "depth; set it to 0."
    )
  options.check_input_stats("input_mean", settings.input_mean)
  options.check_input_stats("input_std", settings.input_std)


def _execution_fields(config: Any) -> dict[str, Any]:
  """A Mixer's or a BiT's remat, remat policy, dtype, head bias, input statistics, scan and
  stochastic depth, read from ``config`` (the last five at their defaults where absent)."""
  return dict(
    remat=_bool(_read(config, "remat", "model"), "remat"),
    remat_policy=_read(config, "remat_policy", "model"),
    dtype=dtype_name(_read(config, "dtype", "model")),
    head_bias_init=_finite(config.get("head_bias_init", 0.0), "head_bias_init"),
    input_mean=tuple(config.get("input_mean", OFFICIAL_INPUT_MEAN)),
    input_std=tuple(config.get("input_std", OFFICIAL_INPUT_STD)),
    scan=_bool(config.get("scan", False), "scan"),
    stoch_depth=_rate(config.get("stoch_depth", 0.0), "stoch_depth"),
  )


@dataclasses.dataclass(frozen=True, kw_only=True)
class _FamilySettings:
  """The fields an MLP-Mixer's and a BiT's settings share: how they run, the head's bias,
  the inputs the weights expect, and the ViT fields they read as they are (no scan,
  stochastic depth or attention; global average pooling)."""

  remat: bool
  remat_policy: Optional[str]
  dtype: str
  head_bias_init: float = 0.0
  input_mean: tuple[float, ...] = OFFICIAL_INPUT_MEAN
  input_std: tuple[float, ...] = OFFICIAL_INPUT_STD
  scan: bool = False
  stoch_depth: float = 0.0
  attention_impl: Optional[str] = None
  classifier: str = "gap"

  get = ModelSettings.get
  replace = ModelSettings.replace

  def execution_options(self) -> execution.ExecutionOptions:
    """How the model runs: its remat, remat policy and dtype (no dropout or scan)."""
    return execution.ExecutionOptions(
      remat=self.remat, remat_policy=self.remat_policy, dtype=execution.compute_dtype(self.dtype)
    )


@dataclasses.dataclass(frozen=True)
class MixerSettings(_FamilySettings):
  """Every field of an MLP-Mixer config (`variants.py`'s ``_mixer``), checked when built."""

  name: str
  patches: PatchSettings
  hidden_dim: int
  num_blocks: int
  tokens_mlp_dim: int
  channels_mlp_dim: int
  gelu_approximate: bool  # tanh GELU (official); False: exact (timm)
  model_type: str = mixer.MIXER
  resnet: None = None

  def __post_init__(self):
    _check_convolutional_family(self, "the Mixer's blocks are", "the official Mixer has")

  @classmethod
  def from_config(cls, config: Any) -> "MixerSettings":
    if isinstance(config, MixerSettings):
      return config
    patch = tuple(_read(_read(config, "patches", "model"), "size", "model.patches"))
    if len(patch) != 2:
      raise errors.ConfigError(f"config.model.patches.size={patch!r} must be (height, width).")
    ints = {
      key: _int(_read(config, key, "model"), key)
      for key in ("hidden_dim", "num_blocks", "tokens_mlp_dim", "channels_mlp_dim")
    }
    return cls(
      name=str(_read(config, "name", "model")),
      patches=PatchSettings((_int(patch[0], "patches.size"), _int(patch[1], "patches.size"))),
      **ints,
      gelu_approximate=_bool(_read(config, "gelu_approximate", "model"), "gelu_approximate"),
      **_execution_fields(config),
    )


@dataclasses.dataclass(frozen=True)
class BitSettings(_FamilySettings):
  """Every field of a BiT ResNet-v2 config (`variants.py`'s ``_bit``), checked when built."""

  name: str
  resnet: ResNetSettings  # units per stage (1 to 4 stages), an integer width factor
  model_type: str = bit.BIT

  def __post_init__(self):
    _check_convolutional_family(self, "a ResNet's units are", "the BiT ResNet has")
    units, width = self.resnet.num_layers, self.resnet.width_factor
    if not 1 <= len(units) <= 4:
      raise errors.ConfigError(
        f"config.model.resnet.num_layers={units!r} must give the units of 1 to 4 stages, "
        "e.g. (3, 4, 6, 3) for a ResNet-50."
      )
    if not (width >= 1 and float(width).is_integer()):
      raise errors.ConfigError(
        f"config.model.resnet.width_factor={width!r} must be a whole number >= 1 (the x in "
        "R50x2), as timm's BiT."
      )

  @classmethod
  def from_config(cls, config: Any) -> "BitSettings":
    if isinstance(config, BitSettings):
      return config
    resnet = _read(config, "resnet", "model")
    return cls(
      name=str(_read(config, "name", "model")),
      resnet=ResNetSettings(
        num_layers=tuple(
          _int(n, "resnet.num_layers") for n in _read(resnet, "num_layers", "model.resnet")
        ),
        width_factor=_finite(_read(resnet, "width_factor", "model.resnet"), "resnet.width_factor"),
      ),
      **_execution_fields(config),
    )


Settings = ModelSettings | MixerSettings | BitSettings
