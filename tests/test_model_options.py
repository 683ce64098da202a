"""The later family's model options (`vit_jax.models.variants.family_options`): their
parameter names, what pooling sees, the one error for bad values, and configs written
before the options existed. Parity with timm: tests/test_vit_family.py."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import traverse_util

from vit_jax import models
from vit_jax.infra import errors


def _config(**options):
  config = models.get_model_config("testing")
  config.update(options)
  return config


def _init(config, size: int = 8):
  model = models.create_model(config, num_classes=3)
  images = jax.random.uniform(jax.random.key(1), (2, size, size, 3), minval=-1, maxval=1)
  params = nn.unbox(model.init(jax.random.key(0), images)["params"])
  return model, params, images


def test_every_option_on_gives_the_documented_parameter_names():
  config = _config(
    classifier="map",
    class_token=True,
    num_registers=3,
    posemb_patches_only=True,
    norm_pre=True,
    layer_scale_init=1e-5,
  )
  _, params, _ = _init(config)  # a 2x2 grid of 4x4 patches
  shapes = {k: v.shape for k, v in traverse_util.flatten_dict(params, sep="/").items()}
  assert shapes["cls"] == (1, 1, 32) and shapes["registers"] == (1, 3, 32)
  assert shapes["Transformer/posembed_input/pos_embedding"] == (1, 4, 32)  # patches only
  assert shapes["Transformer/norm_pre/scale"] == (32,)
  block = "Transformer/encoderblock_1/"
  assert shapes[block + "LayerScale_attention/scale"] == shapes[block + "LayerScale_mlp/scale"]
  assert shapes["MAPHead_0/probe"] == (1, 1, 32)
  assert shapes["MAPHead_0/MultiHeadDotProductAttention_0/query/kernel"] == (32, 2, 16)
  assert shapes["MAPHead_0/MlpBlock_0/Dense_0/kernel"] == (32, 64)
  assert "fc_norm/scale" not in shapes and "Transformer/encoder_norm/scale" in shapes
  fc = _init(_config(classifier="gap", fc_norm=True))[1]
  assert "fc_norm" in fc and "encoder_norm" not in fc["Transformer"]


@pytest.mark.parametrize("classifier", ["gap", "map"])
def test_pooling_leaves_the_class_token_and_registers_out(classifier):
  model, params, images = _init(_config(classifier=classifier, class_token=True, num_registers=2))
  logits = model.apply({"params": params}, images)
  tokens = model.apply({"params": params}, images, pool=False)  # [B, 1 + 2 + 4, D]
  assert tokens.shape == (2, 7, 32)
  # The same logits with the prefix tokens' outputs replaced: pooling never reads them.
  head = params["head"]
  patches = tokens[:, 3:]
  if classifier == "gap":
    pooled = patches.mean(axis=1)
  else:
    map_head = models.heads.MAPHead(2, 64, True, "gelu", 1e-6, model.execution)
    pooled = map_head.apply({"params": params["MAPHead_0"]}, patches)
  np.testing.assert_allclose(logits, pooled @ head["kernel"] + head["bias"], rtol=1e-5, atol=1e-6)


def test_quick_gelu_and_epsilon_change_the_function():
  base = _config(classifier="gap")
  model, params, images = _init(base)
  leaves, tree = jax.tree.flatten(params)  # every array away from its init (the head: zero)
  keys = jax.random.split(jax.random.key(2), len(leaves))
  noise = [p + 0.5 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)]
  params = jax.tree.unflatten(tree, noise)
  want = model.apply({"params": params}, images)
  for options in (dict(activation="quick_gelu"), dict(layer_norm_epsilon=1.0)):
    other = models.create_model(_config(classifier="gap", **options), num_classes=3)
    assert not np.allclose(other.apply({"params": params}, images), want, atol=1e-4), options


def test_bad_options_are_one_error_naming_each():
  config = _config(
    classifier="token",
    class_token=False,
    num_registers=-1,
    activation="relu",
    layer_norm_epsilon=0.0,
  )
  with pytest.raises(errors.ConfigError) as raised:
    models.create_model(config, num_classes=3)
  message = str(raised.value)
  for key in (
    "class_token=False",
    "num_registers=-1",
    "activation='relu'",
    "layer_norm_epsilon=0.0",
  ):
    assert f"config.model.{key}" in message, key
  assert models.options.problems(_config()) == []


def test_a_config_written_before_the_options_builds_the_official_model():
  config = _config()
  old = config.to_dict()
  for key in models.variants.family_options():
    del old[key]
  model = models.create_model(ml_collections.ConfigDict(old), num_classes=3)
  assert model.config.num_registers == 0 and model.config.layer_norm_epsilon == 1e-6
  assert model.has_class_token
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 8, 8, 3)))["params"]
  assert set(shapes) == {"cls", "embedding", "Transformer", "head"}
