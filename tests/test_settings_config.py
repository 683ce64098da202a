"""The typed settings and the config layout meet at one edge, `models.to_config`: every
registered variant and a two-tower model go there and back unchanged, and what comes back
is a config the command line and `config.json` take (typed fields, the family's layout)."""

from __future__ import annotations

import json

import ml_collections
import pytest

from vit_jax import models


def _layout(config: ml_collections.ConfigDict) -> dict:
  """A config as `config.json` holds it (tuples as lists)."""
  return json.loads(config.to_json_best_effort(sort_keys=True))


@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_every_variant_goes_to_settings_and_back_unchanged(name):
  config = models.get_model_config(name)  # a ViT's: every option after the paper
  settings = models.model_settings(config)
  back = models.to_config(settings)
  assert _layout(back) == _layout(config)
  assert models.model_settings(back) == settings


def test_a_changed_setting_is_a_field_the_command_line_still_types():
  settings = models.model_settings(models.get_model_config("testing"))
  config = models.to_config(settings.replace(dtype="bfloat16", representation_size=16))
  assert config.dtype == "bfloat16" and config.representation_size == 16
  config = models.to_config(settings)
  config.dtype = "float32"  # an unset dtype stays a typed None: a string parses onto it
  with pytest.raises(TypeError):
    config.representation_size = "wide"


def test_a_two_tower_model_goes_to_settings_and_back_unchanged():
  config = models.two_tower_config(
    models.get_model_config("testing"),
    text=dict(width=32, depth=1, mlp_dim=64, num_heads=2, vocab_size=100, pool="first"),
    text_len=8,
    embed_dim=16,
    loss="softmax",
    image_head="linear",
  )
  settings = models.model_settings(config)
  back = models.to_config(settings)
  assert models.model_settings(back) == settings
  assert back.bias_init is None and back.text.pool == "first" and back.image_head == "linear"
  assert back.image.hidden_size == 32 and back.model_type == models.TwoTowerSettings.model_type
