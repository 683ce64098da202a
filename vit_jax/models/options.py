"""The ViT's model options checked once: the paper's (classifier, heads) and those that
came after it (the optional fields of `settings.ModelSettings`).

Each rule is one ``check_*`` function raising `ConfigError` with 'config.model.KEY=VALUE:
why'; `vit_jax.models.settings.ModelSettings` runs them all through `check_model_config`
(one error listing every bad value), and the modules call the same functions for a module
constructed directly. The position embeddings and the execution options are checked by
their modules' own functions (`posemb.check_posemb`, `execution.remat_policy`, ...).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Callable, Optional

from vit_jax.infra import errors
from vit_jax.models import heads, layers, naflex
from vit_jax.models import rope as rope_lib

MLP = "mlp"  # Dense -> GELU -> Dense, the paper's
SWIGLU = "swiglu"  # silu(fc1_g x) * fc1_x x -> fc2 (timm's SwiGLU)
SWIGLU_FUSED = "swiglu_fused"  # one fc1 holding the gate then the value (timm's GluMlp)
MLP_KINDS: tuple[str, ...] = (MLP, SWIGLU, SWIGLU_FUSED)
QKV_BIAS_ALL, QKV_BIAS_NONE, QKV_BIAS_QV = "all", "none", "qv"  # qv: no key bias (EVA)
QKV_BIASES: tuple[str, ...] = (QKV_BIAS_ALL, QKV_BIAS_NONE, QKV_BIAS_QV)


def _bad(key: str, value: Any, why: str) -> errors.ConfigError:
  return errors.ConfigError(f"config.model.{key}={value!r}: {why}")


def _real(value: Any) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_classifier(classifier: str) -> None:
  if classifier not in heads.CLASSIFIERS:
    raise errors.ConfigError(
      f"Unknown config.model.classifier={classifier!r}; choose one of {heads.CLASSIFIERS}."
    )


def check_heads(width: int, num_heads: int) -> None:
  if num_heads < 1 or width % num_heads:
    raise errors.ConfigError(
      f"Width {width} (config.model.hidden_size) is not divisible by "
      f"config.model.transformer.num_heads={num_heads}."
    )


def num_prefix_tokens(classifier: str, class_token: Optional[bool], num_registers: int) -> int:
  """Tokens before the patches: the class token (``class_token`` None: only with
  classifier='token') and the registers."""
  has_class_token = classifier == heads.TOKEN if class_token is None else class_token
  return int(has_class_token) + num_registers


def check_class_token(classifier: str, class_token: Optional[bool]) -> None:
  if class_token not in (None, True, False):
    raise _bad("class_token", class_token, "None (only with classifier='token'), True or False")
  if classifier == heads.TOKEN and class_token is False:
    raise _bad(
      "class_token", class_token, "classifier='token' pools the class token; set True or None"
    )


def check_axial(axial: Any, num_prefix_tokens: int) -> None:
  """Axial-ViT keeps the patches as a 2-D grid: a class token or registers have no row or
  column, so it pools the grid (paper Appendix D.6 names no class token for it)."""
  if not isinstance(axial, bool):
    raise _bad("axial", axial, "True or False")
  if axial and num_prefix_tokens:
    raise _bad(
      "axial",
      axial,
      f"Axial-ViT has no prefix tokens ({num_prefix_tokens} here): set "
      "config.model.classifier='gap' (or 'map'), class_token=None and num_registers=0",
    )


def check_fc_norm(fc_norm: bool, classifier: str, final_norm: Any = True) -> None:
  if not isinstance(fc_norm, bool):
    raise _bad("fc_norm", fc_norm, "True or False")
  if fc_norm and final_norm is False:
    raise _bad("fc_norm", fc_norm, "the norm after pooling is the final norm: final_norm=True")
  if fc_norm and classifier not in heads.POOLINGS:
    raise _bad(
      "fc_norm", fc_norm, f"the norm after pooling needs a pooling classifier {heads.POOLINGS}"
    )


def check_flag(key: str, value: Any) -> None:
  if not isinstance(value, bool):
    raise _bad(key, value, "True or False")


def check_num_registers(num_registers: Any) -> None:
  if not isinstance(num_registers, numbers.Integral) or isinstance(num_registers, bool):
    raise _bad("num_registers", num_registers, "a whole number >= 0")
  if num_registers < 0:
    raise _bad("num_registers", num_registers, "a whole number >= 0")


def check_activation(activation: Any) -> None:
  if activation not in layers.ACTIVATIONS:
    raise _bad("activation", activation, f"choose one of {layers.ACTIVATIONS}")


def check_layer_norm_epsilon(epsilon: Any) -> None:
  if not _real(epsilon) or not epsilon > 0:
    raise _bad("layer_norm_epsilon", epsilon, "a positive number (official: 1e-6)")


def check_layer_scale_init(value: Any) -> None:
  if value is not None and (not _real(value) or not value > 0):
    raise _bad(
      "layer_scale_init", value, "None (no LayerScale) or a positive initial scale (DINOv2: 1e-5)"
    )


def check_mlp(kind: Any, mlp_norm: Any) -> None:
  if kind not in MLP_KINDS:
    raise _bad("mlp", kind, f"choose one of {MLP_KINDS}")
  if mlp_norm is True and kind != SWIGLU:
    raise _bad("mlp_norm", mlp_norm, f"the inner LayerNorm is EVA-02's, in mlp={SWIGLU!r}")


def check_qkv_bias(value: Any) -> None:
  if value not in QKV_BIASES:
    raise _bad("qkv_bias", value, f"choose one of {QKV_BIASES} (qv: no key bias, as EVA)")


def check_rope(c: Any) -> None:
  """The rotary embedding's fields (`rope.Rope`), its head width, and no second kind of
  relative positions beside it."""
  kind = c.get("rope")
  if kind is None:
    return
  side = c.get("rope_ref_grid")
  if side is not None and (not isinstance(side, numbers.Integral) or side < 1):
    raise _bad("rope_ref_grid", side, "None or the pre-training grid's side, e.g. 16")
  temperature = c.get("rope_temperature")
  if not _real(temperature) or not _real(c.get("rope_grid_offset")):
    raise _bad("rope_temperature", temperature, "rope_temperature and rope_grid_offset are numbers")
  try:
    rope_lib.Rope(
      kind,
      temperature,
      c.get("rope_rotate_half") is True,
      c.get("rope_grid_offset"),
      c.get("rope_normalize_coords"),
      None if side is None else (side, side),
      c.get("rope_grid_indexing"),
    )
  except errors.ConfigError as e:
    raise _bad("rope", kind, str(e)) from None
  heads, width = c.get("transformer").num_heads, c.get("hidden_size")
  if isinstance(heads, int) and heads > 0 and (width // heads) % 4:
    raise _bad("rope", kind, f"RoPE needs a head width divisible by 4, not {width // heads}")
  if c.get("posemb") == "relative" or c.get("axial"):
    raise _bad(
      "rope", kind, "RoPE is the attention's positions: set posemb != 'relative', axial=False"
    )


def check_map_head(c: Any) -> None:
  """The 'map' head's heads (dividing the width) and MLP width: None or whole numbers."""
  heads_, mlp_dim, width = c.get("map_num_heads"), c.get("map_mlp_dim"), c.get("hidden_size")
  for key, value in (("map_num_heads", heads_), ("map_mlp_dim", mlp_dim)):
    if value is not None and (
      not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1
    ):
      raise _bad(key, value, "None (the encoder's) or a whole number >= 1")
  if heads_ is not None and isinstance(width, int) and width % heads_:
    raise _bad("map_num_heads", heads_, f"the width {width} must divide into that many heads")


def check_table_resample(c: Any) -> None:
  """``posemb_grid`` (None or a learned table's (rows, columns)) and ``posemb_resample``
  (`naflex.RESAMPLE_METHODS`, or None: one grid)."""
  method, grid = c.get("posemb_resample"), c.get("posemb_grid")
  if method is not None and method not in naflex.RESAMPLE_METHODS:
    raise _bad("posemb_resample", method, f"one of {naflex.RESAMPLE_METHODS}, or None")
  if grid is None:
    return
  if not (
    isinstance(grid, (tuple, list))
    and len(grid) == 2
    and all(isinstance(g, numbers.Integral) and not isinstance(g, bool) and g > 0 for g in grid)
  ):
    raise _bad("posemb_grid", grid, "None or the table's (rows, columns), whole numbers >= 1")
  if c.get("posemb") != "learn" or method is None:
    raise _bad(
      "posemb_grid",
      grid,
      "a table resized to each input takes posemb='learn' and a posemb_resample",
    )


def _rgb(value: Any) -> bool:
  return isinstance(value, (tuple, list)) and len(value) == 3 and all(_real(v) for v in value)


def check_input_stats(key: str, value: Any) -> None:
  """``input_mean`` or ``input_std``: three numbers on the 0..1 scale (std positive)."""
  if not _rgb(value):
    raise _bad(key, value, "three numbers, one per RGB channel, on the 0..1 scale")
  if key == "input_std" and min(value) <= 0:
    raise _bad(key, value, "every value must be positive")


def _flags(c: Any) -> tuple[str, ...]:
  """The boolean options of settings ``c`` whose only rule is True or False (every bool
  field with a default but those with a check of their own)."""
  if not dataclasses.is_dataclass(c):
    return ()
  own_check = ("axial", "fc_norm")
  return tuple(
    f.name
    for f in dataclasses.fields(c)
    if f.type == "bool" and f.default is not dataclasses.MISSING and f.name not in own_check
  )


def _checks(c: Any) -> list[Callable[[], None]]:
  classifier, class_token, registers = (
    c.get("classifier"),
    c.get("class_token"),
    c.get("num_registers"),
  )
  prefix = num_prefix_tokens(
    classifier,
    class_token if class_token in (None, True, False) else None,
    registers if isinstance(registers, numbers.Integral) and registers >= 0 else 0,
  )
  return [
    lambda: check_axial(c.get("axial"), prefix),
    lambda: check_class_token(classifier, class_token),
    lambda: check_num_registers(registers),
    *(lambda key=key: check_flag(key, c.get(key)) for key in _flags(c)),
    lambda: check_fc_norm(c.get("fc_norm"), classifier, c.get("final_norm", True)),
    lambda: check_activation(c.get("activation")),
    lambda: check_layer_norm_epsilon(c.get("layer_norm_epsilon")),
    lambda: check_layer_scale_init(c.get("layer_scale_init")),
    lambda: check_mlp(c.get("mlp"), c.get("mlp_norm")),
    lambda: check_qkv_bias(c.get("qkv_bias")),
    lambda: check_rope(c),
    lambda: check_map_head(c),
    lambda: check_table_resample(c),
    lambda: check_input_stats("input_mean", c.get("input_mean")),
    lambda: check_input_stats("input_std", c.get("input_std")),
  ]


def problems(config: Any) -> list[str]:
  """Every option of ``config`` (`ModelSettings`, or a config with every option) that no
  model has, as 'config.model.KEY=VALUE: why'."""
  found = []
  for check in _checks(config):
    try:
      check()
    except errors.ConfigError as e:
      found.append(str(e))
  return found


def check_model_config(config: Any) -> None:
  """One `ConfigError` naming every bad family option (see `problems`)."""
  if found := problems(config):
    raise errors.ConfigError("Invalid model options: " + "; ".join(found) + ".")
