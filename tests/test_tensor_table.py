"""The two-way tables between our trees and timm's state dicts (`weights/tensor_table.py`,
`vit_table`, `mixer_table`, `bit_table`): one table read both ways gives back every array
bit for bit, fused arrays split where they were stacked, and a missing array is named."""

import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest
from flax import traverse_util

from vit_jax import models
from vit_jax.infra import errors
from vit_jax.weights import tensor_table
from vit_jax.weights.tensor_table import Row
from vit_jax.weights.timm import bit as timm_bit
from vit_jax.weights.timm import mixer as timm_mixer
from vit_jax.weights.timm import vit as timm_vit


def test_parts_are_stacked_in_order_and_split_back():
  table = [Row(f"{n}/bias", "qkv.bias", part=(i, 3)) for i, n in enumerate("qkv")]
  flat = {f"{n}/bias": np.full(2, i, np.float32) for i, n in enumerate("qkv")}
  torch = tensor_table.to_torch(table, flat)
  np.testing.assert_array_equal(torch["qkv.bias"], [0, 0, 1, 1, 2, 2])
  back = traverse_util.flatten_dict(tensor_table.from_torch(table, torch, "x", "ViT"), sep="/")
  assert {k: v.tolist() for k, v in back.items()} == {k: v.tolist() for k, v in flat.items()}


def test_layouts_invert_each_other():
  rng = np.random.default_rng(0)
  for layout, shape in [
    (tensor_table.CONV, (3, 2, 5, 7)),
    (tensor_table.DENSE, (5, 7)),
    (tensor_table.DENSE_AS_CONV, (5, 7)),
    (tensor_table.heads_in(2), (6, 2, 3)),
    (tensor_table.heads_out(2), (2, 3, 6)),
    (tensor_table.heads_bias(2), (2, 3)),
  ]:
    x = rng.standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(layout.from_torch(layout.to_torch(x)), x)


def test_a_missing_array_and_an_unknown_one_are_named():
  table = [Row("a", "x.weight"), Row("b", "y.weight", required=False)]
  with pytest.raises(errors.CheckpointError, match=r"no \['x.weight'\]; this is not a timm ViT"):
    tensor_table.from_torch(table, {"y.weight": np.ones(1)}, "src", "ViT")
  with pytest.raises(errors.CheckpointError, match=r"1 timm arrays have no place.*'z'"):
    tensor_table.from_torch(table, {"x.weight": np.ones(1), "z": np.ones(1)}, "src", "ViT")


def _tree(config, num_classes=3, size=16):
  """Random arrays in the shapes of the model's parameters (nothing is run)."""
  module = models.create_model(config, num_classes=num_classes)
  image = jax.ShapeDtypeStruct((1, size, size, 3), np.float32)
  shapes = jax.eval_shape(lambda x: module.init(jax.random.PRNGKey(0), x, train=False), image)
  rng = np.random.default_rng(0)
  return jax.tree.map(
    lambda s: rng.standard_normal(s.shape).astype(np.float32), nn.unbox(shapes["params"])
  )


def _vit(**options):
  config = models.get_model_config("testing")
  config.update(options)
  return config


@pytest.mark.parametrize(
  "options",
  [
    dict(),
    dict(classifier="gap", num_registers=2, layer_scale_init=1e-5, posemb_patches_only=True),
    dict(classifier="map", fc_norm=True),
  ],
  ids=["token", "gap_registers_layerscale", "map_fc_norm"],
)
def test_a_vit_goes_to_timm_and_back_bit_for_bit(options):
  config = _vit(**options)
  params = _tree(config)
  tensors = timm_vit.to_timm(params, config)
  _assert_equal_trees(timm_vit.from_timm(tensors, config.transformer.num_heads, "x"), params)


def _assert_equal_trees(got, want):
  got = traverse_util.flatten_dict(got, sep="/")
  want = tensor_table.flat_float32(want)
  assert set(got) == set(want)
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_the_mixer_and_bit_tables_go_both_ways_bit_for_bit():
  mixer = models.get_model_config("Mixer-B_16")
  mixer.patches.size, mixer.hidden_dim, mixer.num_blocks = (8, 8), 16, 2
  mixer.tokens_mlp_dim, mixer.channels_mlp_dim = 8, 32
  bit = models.get_model_config("BiT-R50x1")
  bit.resnet.num_layers = (1, 1)
  for config, family in ((mixer, timm_mixer), (bit, timm_bit)):
    params = _tree(config)
    _assert_equal_trees(family.from_timm(family.to_timm(params, config), "x"), params)


def test_the_timm_keyword_arguments_are_settings_fields():
  fields = {f.name for f in dataclasses.fields(models.ModelSettings)}
  assert set(timm_vit.FIELD_ARGS) <= fields


def test_an_export_under_a_name_unsets_what_the_name_registers():
  """The generic CLIP name registers pre_norm: a model without norm_pre says so."""
  spec = timm_vit.model_spec(_vit(layer_norm_epsilon=1e-5), num_classes=3, image_size=(16, 16))
  assert spec["model_name"] == "vit_base_patch16_clip_224"
  assert spec["kwargs"]["pre_norm"] is False
  plain = timm_vit.model_spec(_vit(), num_classes=3, image_size=(16, 16))
  assert "pre_norm" not in plain["kwargs"]
