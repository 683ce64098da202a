"""Flax models of the official repository: `VisionTransformer` (plain and hybrid),
`MlpMixer`, the paper's BiT ResNet baselines (`BitResNet`), and the builder that picks one
from a config through the family registry (`families.FAMILIES`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import flax.linen as nn
import ml_collections

from vit_jax.models.bit import BIT, BitResNet
from vit_jax.models.execution import EXECUTION_FIELDS, ExecutionOptions
from vit_jax.models.families import (
  FAMILIES,
  Family,
  family_of,
  image_params,
  image_settings,
  is_bit,
  is_mixer,
  is_two_tower,
  model_settings,
  variant_settings,
)
from vit_jax.models.heads import CLASSIFIERS
from vit_jax.models.image_text import TwoTowerSettings, two_tower_config, two_tower_settings
from vit_jax.models.mixer import MIXER, MlpMixer
from vit_jax.models.options import check_model_config
from vit_jax.models.posemb import POSEMB_KINDS, resize_grid, sincos_2d
from vit_jax.models.settings import BitSettings, MixerSettings, ModelSettings, Settings
from vit_jax.models.settings_config import to_config
from vit_jax.models.variants import MODEL_NAMES, get_model_config
from vit_jax.models.vit import VisionTransformer


def create_model(
  model_config: ml_collections.ConfigDict | Settings,
  *,
  num_classes: Optional[int],
  **overrides: Any,
) -> nn.Module:
  """The module of a model config in the layout of `variants.py` (a ConfigDict, checked
  here by `model_settings`, or the settings themselves), built by its family.

  ``overrides`` replace fields of its `ExecutionOptions` (``dropout_rate=0.1``,
  ``scan=True``, ``dtype=jnp.bfloat16``) or top-level fields of its settings
  (``classifier="gap"``, checked again). A
  config saved before an option existed builds the official model (the settings read each
  missing option at its official value).
  """
  settings = model_settings(model_config)
  execution = {name: overrides.pop(name) for name in EXECUTION_FIELDS & overrides.keys()}
  execution_options = dataclasses.replace(settings.execution_options(), **execution)
  build = family_of(settings).build
  return build(settings, num_classes=num_classes, execution=execution_options, **overrides)


__all__ = [
  "BIT",
  "BitResNet",
  "BitSettings",
  "CLASSIFIERS",
  "ExecutionOptions",
  "FAMILIES",
  "Family",
  "MIXER",
  "MODEL_NAMES",
  "MixerSettings",
  "MlpMixer",
  "ModelSettings",
  "POSEMB_KINDS",
  "VisionTransformer",
  "check_model_config",
  "create_model",
  "family_of",
  "get_model_config",
  "image_params",
  "image_settings",
  "is_bit",
  "is_mixer",
  "is_two_tower",
  "model_settings",
  "resize_grid",
  "sincos_2d",
  "to_config",
  "TwoTowerSettings",
  "two_tower_config",
  "two_tower_settings",
  "variant_settings",
]
