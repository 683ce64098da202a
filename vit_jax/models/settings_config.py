"""Typed settings back to the config layout of `variants.py`: the one way out of the
settings, for what is written or edited as fields (a run's ``config.json``, ``config.model``
of a fine-tuning run, an export's config).

    config = models.to_config(loaded.config)   # a ConfigDict; model_settings(config) == settings

The config starts from its family's registered template (`Family.template`), so every
field keeps the type the command line parses (an unset ``dtype`` stays a typed None), and
a field the template does not have is written only where it differs from its default (a
Mixer's settings read ``scan=False`` without the Mixer config having it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from vit_jax.models import families, image_text, variants
from vit_jax.models.settings import Settings


def to_config(settings: Settings) -> ml_collections.ConfigDict:
  """The ConfigDict of ``settings`` (a two-tower model's image tower by its own family)."""
  if isinstance(settings, image_text.TwoTowerSettings):
    config = image_text.two_tower_config(
      to_config(settings.image),
      text=dataclasses.asdict(settings.text),
      text_len=settings.text_len,
      embed_dim=settings.embed_dim,
      name=settings.name,
      image_head=settings.image_head,
    )
    config.temperature_init = settings.temperature_init
    config.bias_init = settings.bias_init
    return config
  config = variants.get_model_config(families.family_of(settings).template)
  for field in dataclasses.fields(settings):
    value = getattr(settings, field.name)
    if field.name not in config and value == field.default:
      continue  # a field this family's configs leave out, at its default
    config[field.name] = _config_value(value)
  return config


def _config_value(value: Any) -> Any:
  """A nested settings record (patches, transformer, resnet) as a ConfigDict."""
  if dataclasses.is_dataclass(value):
    return ml_collections.ConfigDict(
      {f.name: _config_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    )
  return value
