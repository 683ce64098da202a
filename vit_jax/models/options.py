"""The ViT's model options checked once: the paper's (classifier, heads) and the later
family's (`variants.family_options`).

Each rule is one ``check_*`` function raising `ConfigError` with 'config.model.KEY=VALUE:
why'; `vit_jax.models.settings.ModelSettings` runs them all through `check_model_config`
(one error listing every bad value), and the modules call the same functions for a module
constructed directly. The position embeddings and the execution options are checked by
their modules' own functions (`posemb.check_posemb`, `execution.remat_policy`, ...).
`with_family_defaults` fills the options into a config written before they existed (a
run's `config.json`), so every reader sees the official values.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Optional

import ml_collections

from vit_jax import errors
from vit_jax.models import heads, layers, variants


def with_family_defaults(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``config`` (unchanged) when it has every option, else a copy with the missing ones
  at their official values."""
  missing = {k: v for k, v in variants.family_options().items() if k not in config}
  if not missing:
    return config
  config = ml_collections.ConfigDict(config.to_dict())
  config.update(missing)
  return config


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


def check_fc_norm(fc_norm: bool, classifier: str) -> None:
  if not isinstance(fc_norm, bool):
    raise _bad("fc_norm", fc_norm, "True or False")
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


def _rgb(value: Any) -> bool:
  return isinstance(value, (tuple, list)) and len(value) == 3 and all(_real(v) for v in value)


def check_input_stats(key: str, value: Any) -> None:
  """``input_mean`` or ``input_std``: three numbers on the 0..1 scale (std positive)."""
  if not _rgb(value):
    raise _bad(key, value, "three numbers, one per RGB channel, on the 0..1 scale")
  if key == "input_std" and min(value) <= 0:
    raise _bad(key, value, "every value must be positive")


def _checks(c: Any) -> list[Callable[[], None]]:
  defaults = variants.family_options()

  def get(key: str) -> Any:
    default = defaults[key]
    if isinstance(default, ml_collections.FieldReference):
      default = default.get()
    return c.get(key, default)

  classifier = c.get("classifier")
  has_class_token = classifier == heads.TOKEN if get("class_token") is None else get("class_token")
  registers = get("num_registers") if isinstance(get("num_registers"), numbers.Integral) else 0
  return [
    lambda: check_axial(c.get("axial", False), int(bool(has_class_token)) + registers),
    lambda: check_class_token(classifier, get("class_token")),
    lambda: check_num_registers(get("num_registers")),
    lambda: check_flag("posemb_patches_only", get("posemb_patches_only")),
    lambda: check_flag("norm_pre", get("norm_pre")),
    lambda: check_fc_norm(get("fc_norm"), classifier),
    lambda: check_activation(get("activation")),
    lambda: check_layer_norm_epsilon(get("layer_norm_epsilon")),
    lambda: check_layer_scale_init(get("layer_scale_init")),
    lambda: check_input_stats("input_mean", get("input_mean")),
    lambda: check_input_stats("input_std", get("input_std")),
  ]


def problems(config: Any) -> list[str]:
  """Every family option of ``config`` (a ConfigDict or `ModelSettings`; a missing one is
  at its official value) that no model has, as 'config.model.KEY=VALUE: why'."""
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
