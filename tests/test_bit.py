"""BiT ResNet-v2 (the paper's ResNet baselines): parameter counts equal to timm's
``resnetv2_*_bit``, big_vision's tree, any input size, fine-tuning from an `.npz`, another
timm ResNet-v2 refused by name, and prediction with a tiny BiT; the tiny BiT and timm's
builders of it for the checks every timm family shares (tests/test_families_timm.py:
sharding, `.npz`, timm both ways, names, a fine-tuning run, configs, a plan)."""

from __future__ import annotations

import functools
import json
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from tests import interop_fixtures as fx
from vit_jax import models
from vit_jax.infra import errors
from vit_jax.weights import npz, sources

sys.modules.setdefault("triton", None)  # see tests/test_export.py: triton beside TensorFlow

# name -> (units per stage, width factor, parameters with 1000 / 21843 classes), the
# counts taken once from timm's ResNetV2 as `_create_resnetv2_bit` builds it.
BIT = {
  "BiT-R50x1": ((3, 4, 6, 3), 1, 25_549_352, 68_256_659),
  "BiT-R50x2": ((3, 4, 6, 3), 2, 97_988_712, 183_382_483),
  "BiT-R101x1": ((3, 4, 23, 3), 1, 44_541_480, 87_248_787),
  "BiT-R152x1": ((3, 8, 36, 3), 1, 60_185_128, 102_892_435),
  "BiT-R152x2": ((3, 8, 36, 3), 2, 236_335_208, 321_728_979),
  "BiT-R152x4": ((3, 8, 36, 3), 4, 936_533_224, 1_107_299_923),
  "BiT-R200x3": ((3, 24, 36, 3), 3, 568_633_000, 696_713_235),
}
CLASSES = (1000, 21843)


def tiny_config(units=(2, 1), width_factor=1, **changes):
  """A BiT of two stages (a plain, a projecting and a strided unit): 64-channel root."""
  config = models.get_model_config("BiT-R50x1")
  config.name = "BiT-tiny"
  config.resnet.num_layers, config.resnet.width_factor = tuple(units), width_factor
  config.update(changes)
  return config


def count(config, num_classes, size=224) -> int:
  model = models.create_model(config, num_classes=num_classes)
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, size, size, 3)))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(shapes["params"])))


def random_params(config, num_classes=5, size=32):
  return fx.random_tree(config, num_classes, size)


def apply(config, params, images, num_classes=5, **overrides):
  return fx.logits(config, params, images, num_classes, **overrides)


def timm_bit(units, width_factor, num_classes, **kwargs):
  """timm's ResNetV2 as its `_create_resnetv2_bit` builds the resnetv2_*_bit models."""
  pytest.importorskip("torch")
  from timm.layers import StdConv2d  # pylint: disable=g-import-not-at-top
  from timm.models import resnetv2  # pylint: disable=g-import-not-at-top

  return resnetv2.ResNetV2(
    layers=list(units),
    width_factor=width_factor,
    num_classes=num_classes,
    stem_type="fixed",
    conv_layer=functools.partial(StdConv2d, eps=1e-8),
    **kwargs,
  )


@pytest.mark.parametrize("name", list(BIT))
def test_timms_parameter_counts_are_the_pinned_ones(name):
  """timm's model of each name (on the meta device: shapes only) has the pinned counts, and
  our config of the name its units per stage and width factor."""
  pytest.importorskip("timm")
  units, width, *pinned = BIT[name]
  config = models.get_model_config(name)
  assert (config.resnet.num_layers, config.resnet.width_factor) == (units, width)
  for classes, expected in zip(CLASSES, pinned):
    net = timm_bit(units, width, classes, device="meta")  # shapes only, no memory
    assert sum(p.numel() for p in net.parameters()) == expected, classes


# The two biggest traced only in the slow run (about 20 and 30 s each on CI's CPU): their
# 1000-class counts stay in tests/test_models.py::test_every_variant_has_its_pinned_parameter_count
# (the same stages and width), and the 21843-class head is counted with the others here.
_BIGGEST = ("BiT-R152x4", "BiT-R200x3")


@pytest.mark.parametrize(
  "name", [pytest.param(n, marks=pytest.mark.slow) if n in _BIGGEST else n for n in BIT]
)
def test_parameter_counts_with_21843_classes_equal_timms(name):
  """Ours (built abstractly) with ImageNet-21k's 21843 classes has timm's pinned count (1000
  classes: tests/test_models.py)."""
  assert count(models.get_model_config(name), CLASSES[1]) == BIT[name][3]


def test_tree_is_big_visions_bit_layout():
  config = tiny_config()
  flat = traverse_util.flatten_dict(random_params(config), sep="/")
  shapes = {k: v.shape for k, v in flat.items()}
  assert shapes["root_block/conv_root/kernel"] == (7, 7, 3, 64)
  assert shapes["block1/unit01/conv_proj/kernel"] == (1, 1, 64, 256)
  assert "block1/unit02/conv_proj/kernel" not in shapes  # same shape: the input is the shortcut
  assert shapes["block2/unit01/conv2/kernel"] == (3, 3, 128, 128)
  assert shapes["block2/unit01/gn1/scale"] == (256,) and shapes["block2/unit01/gn3/bias"] == (128,)
  assert shapes["norm-pre-head/scale"] == (512,) and shapes["head/kernel"] == (512, 5)
  assert not any("bias" in k and "conv" in k for k in shapes)  # bias-free convs


def test_any_size_works_and_the_width_factor_is_whole():
  """(A zero head, remat, bfloat16 and scan: tests/test_families_timm.py.)"""
  config = tiny_config()
  model = models.create_model(config, num_classes=5)
  params = random_params(config)
  assert apply(config, params, fx.images(1, 37)).shape == (1, 5)  # any size: padded strides
  assert model.input_stride == (8, 8) and model.grid_hw((37, 40)) == (5, 5)
  as_dict = tiny_config().to_dict()
  as_dict["resnet"]["width_factor"] = 1.5
  with pytest.raises(errors.ConfigError, match="width_factor=1.5 must be a whole number"):
    models.create_model(as_dict, num_classes=5)


def test_an_npz_fine_tunes_a_bit_of_its_shape_only(tmp_path):
  """A fresh head for 7 classes; another BiT shape is one fit error (the `.npz` read with
  the BiT inferred: tests/test_families_timm.py)."""
  from vit_jax import weights  # pylint: disable=g-import-not-at-top

  config = tiny_config()
  params = random_params(config)
  npz.save_npz(tmp_path / "bit.npz", params)
  for units, classes in (((2, 1), 7), ((1, 1), 5)):
    other = tiny_config(units=units)
    init = random_params(other, num_classes=classes)
    if units != (2, 1):
      with pytest.raises(errors.CheckpointError, match=r"units per stage: checkpoint \(2, 1\)"):
        weights.load_pretrained(tmp_path / "bit.npz", init, other)
      continue
    adapted = weights.load_pretrained(tmp_path / "bit.npz", init, other)
    assert adapted["head"]["kernel"].shape == (512, 7)
    np.testing.assert_array_equal(
      adapted["block2"]["unit01"]["conv2"]["kernel"], params["block2"]["unit01"]["conv2"]["kernel"]
    )


def write_timm_bit(directory, units=(2, 1, 1, 1), num_classes=5, seed=0):
  """A tiny timm BiT with perturbed weights, saved as timm's hub folder (config.json
  naming resnetv2_50x1_bit, model.safetensors); returns the torch model."""
  timm = pytest.importorskip("timm")
  torch = pytest.importorskip("torch")

  torch.manual_seed(seed)
  net = timm_bit(units, 1, num_classes).eval()
  net.pretrained_cfg = timm.models.get_pretrained_cfg(
    "resnetv2_50x1_bit.goog_in21k_ft_in1k"
  ).to_dict()
  fx.perturb_torch(net)
  timm.models.save_for_hf(net, str(directory), safe_serialization=True)
  return net


def rebuild_timm(spec: dict):
  """timm's model of our export's ``spec``: timm's class with the BiT weight
  standardisation, as the spec says (no timm name: `_create_resnetv2_bit`'s build)."""
  from timm.layers import StdConv2d  # pylint: disable=g-import-not-at-top
  from timm.models import resnetv2  # pylint: disable=g-import-not-at-top

  conv = functools.partial(StdConv2d, eps=1e-8)
  return resnetv2.ResNetV2(**spec["kwargs"], conv_layer=conv).eval()


def test_another_timm_resnet_v2_is_refused_by_its_name(tmp_path):
  """BatchNorm, another stem: not BiT (timm's BiT imported: tests/test_families_timm.py)."""
  write_timm_bit(tmp_path)
  config = json.loads((tmp_path / "config.json").read_text())
  config["architecture"] = "resnetv2_50"
  (tmp_path / "config.json").write_text(json.dumps(config))
  with pytest.raises(errors.CheckpointError, match="'resnetv2_50' is a ResNet-v2 that is not BiT"):
    sources.load(str(tmp_path))


def test_predict_classifies_with_a_bit(tmp_path):
  from PIL import Image  # pylint: disable=g-import-not-at-top

  from vit_jax import predict  # pylint: disable=g-import-not-at-top

  net = write_timm_bit(tmp_path / "timm")
  pixels = np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8)
  Image.fromarray(pixels).save(tmp_path / "a.png")
  loaded = sources.load(str(tmp_path / "timm"))
  classifier = predict.Classifier(loaded, (32, 32), batch=2)
  [(path, probs)] = list(classifier.classify([str(tmp_path / "a.png")]))
  image = classifier.prepare(str(tmp_path / "a.png"))[None]
  want = fx.torch_logits(net, image)
  np.testing.assert_allclose(probs, np.asarray(jax.nn.softmax(want[0])), atol=1e-5)
