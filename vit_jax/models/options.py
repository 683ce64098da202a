"""The model config's options checked once, for `create_model` and the run's settings.

`check_model_config` raises one `ConfigError` listing every bad value with its key;
`with_family_defaults` fills the options of `variants.family_options` into a config written
before they existed (a run's `config.json`), so every reader sees the official values.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from vit_jax import errors
from vit_jax.models import heads, layers, posemb, variants


def with_family_defaults(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``config`` (unchanged) when it has every option, else a copy with the missing ones
  at their official values."""
  missing = {k: v for k, v in variants.family_options().items() if k not in config}
  if not missing:
    return config
  config = ml_collections.ConfigDict(config.to_dict())
  config.update(missing)
  return config


def _rgb(value: Any) -> bool:
  return (
    isinstance(value, (tuple, list))
    and len(value) == 3
    and all(isinstance(v, (int, float)) for v in value)
  )


def problems(config: ml_collections.ConfigDict) -> list[str]:
  """Every option of ``config`` that no model has, as 'config.model.KEY=VALUE: why'."""
  c = with_family_defaults(config)
  found = []

  def bad(key: str, why: str) -> None:
    found.append(f"config.model.{key}={c[key]!r}: {why}")

  if c.classifier not in heads.CLASSIFIERS:
    bad("classifier", f"choose one of {heads.CLASSIFIERS}")
  if c.classifier == heads.TOKEN and c.class_token is False:
    bad("class_token", "classifier='token' pools the class token; set class_token=True or None")
  if c.fc_norm and c.classifier not in heads.POOLINGS:
    bad("fc_norm", f"the norm after pooling needs a pooling classifier {heads.POOLINGS}")
  if c.posemb not in posemb.POSEMB_KINDS:
    bad("posemb", f"choose one of {posemb.POSEMB_KINDS}")
  if not isinstance(c.num_registers, int) or c.num_registers < 0:
    bad("num_registers", "a whole number >= 0")
  if c.activation not in layers.ACTIVATIONS:
    bad("activation", f"choose one of {layers.ACTIVATIONS}")
  if not c.layer_norm_epsilon > 0:
    bad("layer_norm_epsilon", "a positive number (official: 1e-6)")
  if c.layer_scale_init is not None and not c.layer_scale_init > 0:
    bad("layer_scale_init", "None (no LayerScale) or a positive initial scale (DINOv2: 1e-5)")
  for key in ("input_mean", "input_std"):
    if not _rgb(c[key]):
      bad(key, "three numbers, one per RGB channel, on the 0..1 scale")
  if _rgb(c.input_std) and min(c.input_std) <= 0:
    bad("input_std", "every value must be positive")
  return found


def check_model_config(config: ml_collections.ConfigDict) -> None:
  """One `ConfigError` naming every bad model option (see `problems`)."""
  if found := problems(config):
    raise errors.ConfigError("Invalid model options: " + "; ".join(found) + ".")
