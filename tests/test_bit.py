"""BiT ResNet-v2 (the paper's ResNet baselines): parameter counts equal to timm's
``resnetv2_*_bit``, logical axes the partitioning rules shard, timm's state dicts (written
by timm in the test with perturbed weights) imported and exported with timm's logits,
official-layout `.npz` files read with the architecture inferred, and training, fine-tuning,
few-shot, prediction and planning of a tiny BiT."""

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
from vit_jax import errors, export, models
from vit_jax.weights import architecture, npz, sources

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
def test_parameter_counts_equal_timms(name):
  pytest.importorskip("timm")
  units, width, *pinned = BIT[name]
  config = models.get_model_config(name)
  assert (config.resnet.num_layers, config.resnet.width_factor) == (units, width)
  assert count(config, CLASSES[1]) == pinned[1]  # 1000 classes: tests/test_models.py
  for classes, expected in zip(CLASSES, pinned):
    net = timm_bit(units, width, classes, device="meta")  # shapes only, no memory
    assert sum(p.numel() for p in net.parameters()) == expected, classes


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


def test_head_is_zero_and_remat_bfloat16_and_any_size_work():
  config = tiny_config()
  model = models.create_model(config, num_classes=5)
  fresh = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))["params"])
  assert not np.any(fresh["head"]["kernel"])
  params, images = random_params(config), fx.images(2, 32)
  want = apply(config, params, images)
  np.testing.assert_allclose(apply(tiny_config(remat=True), params, images), want, atol=1e-6)
  assert fx.relative_error(apply(config, params, images, dtype=jnp.bfloat16), want) < 0.05
  assert apply(config, params, images, num_classes=0).shape == (2, 512)  # pooled features
  assert apply(config, params, fx.images(1, 37)).shape == (1, 5)  # any size: padded strides
  assert model.input_stride == (8, 8) and model.grid_hw((37, 40)) == (5, 5)
  with pytest.raises(errors.ConfigError, match="scan=True"):
    models.create_model(tiny_config(scan=True), num_classes=5)
  as_dict = tiny_config().to_dict()
  as_dict["resnet"]["width_factor"] = 1.5
  with pytest.raises(errors.ConfigError, match="width_factor=1.5 must be a whole number"):
    models.create_model(as_dict, num_classes=5)


@pytest.mark.parametrize(
  "strategy, sharded",
  [
    (
      "fsdp",
      {"root_block/conv_root/kernel": 3, "block1/unit01/conv2/kernel": 3, "head/kernel": 0},
    ),
    (
      "tensor_parallel",
      {
        "block1/unit01/conv1/kernel": 3,
        "block1/unit01/conv2/kernel": 3,
        "block1/unit01/conv3/kernel": 2,
        "block1/unit01/gn2/scale": 0,
      },
    ),
  ],
)
def test_every_parameter_has_logical_axes_the_rules_shard(strategy, sharded):
  fx.check_logical_axes(models.create_model(tiny_config(), num_classes=5), 32, strategy, sharded)


def test_an_npz_loads_with_the_bit_inferred(tmp_path):
  config = tiny_config()
  params = random_params(config)
  npz.save_npz(tmp_path / "bit.npz", params)
  loaded = sources.load(tmp_path / "bit.npz")
  assert models.is_bit(loaded.config) and loaded.config.name == "custom"
  assert loaded.config.resnet.num_layers == (2, 1) and loaded.num_classes == 5
  assert loaded.image_size is None  # a ResNet does not fix it: predict asks for --resolution
  images = fx.images(2, 32)
  np.testing.assert_array_equal(
    apply(loaded.config, loaded.params, images), apply(config, params, images)
  )
  # Fine-tuning from it: a fresh head for 7 classes; another BiT shape is one fit error.
  from vit_jax import weights  # pylint: disable=g-import-not-at-top

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
  for name in ("BiT-R50x1", "BiT-R152x4"):
    official = jax.eval_shape(
      models.create_model(models.get_model_config(name), num_classes=0).init,
      jax.random.key(0),
      jnp.zeros((1, 32, 32, 3)),
    )["params"]
    assert architecture.infer_model_config(official).name == name


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


def test_timm_import_gives_timms_logits(tmp_path):
  net = write_timm_bit(tmp_path)
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["architecture"] == "resnetv2_50x1_bit"
  loaded = sources.load(str(tmp_path))
  assert models.is_bit(loaded.config) and loaded.config.resnet.num_layers == (2, 1, 1, 1)
  assert loaded.image_size == (448, 448) and loaded.num_classes == 5  # timm's input_size
  assert tuple(loaded.config.input_mean) == (0.5, 0.5, 0.5)
  for size in (64, 45):  # 45: every strided layer pads unevenly
    images = fx.images(2, size)
    got, want = fx.our_logits(loaded, images), fx.torch_logits(net, images)
    assert fx.relative_error(got, want) <= fx.TOLERANCE, size
  # Another ResNet-v2 of timm (BatchNorm, another stem) is refused by its name.
  config["architecture"] = "resnetv2_50"
  (tmp_path / "config.json").write_text(json.dumps(config))
  with pytest.raises(errors.CheckpointError, match="'resnetv2_50' is a ResNet-v2 that is not BiT"):
    sources.load(str(tmp_path))


def test_timm_export_gives_our_logits(tmp_path):
  pytest.importorskip("timm")
  from safetensors.torch import load_file  # pylint: disable=g-import-not-at-top

  config = tiny_config()
  model = sources.LoadedModel(config, random_params(config), 5, (32, 32), None, "tiny")
  export.export_model(model, "timm", str(tmp_path / "timm"))
  spec = json.loads((tmp_path / "timm" / "timm_model.json").read_text())
  assert spec["model_name"] is None  # no timm name: the class, as _create_resnetv2_bit
  # As the spec says: timm's class with the BiT weight standardisation.
  from timm.layers import StdConv2d  # pylint: disable=g-import-not-at-top
  from timm.models import resnetv2  # pylint: disable=g-import-not-at-top

  conv = functools.partial(StdConv2d, eps=1e-8)
  net = resnetv2.ResNetV2(**spec["kwargs"], conv_layer=conv).eval()
  net.load_state_dict(load_file(str(tmp_path / "timm" / "model.safetensors")))
  images = fx.images(2, 32)
  ours = apply(config, model.params, images)
  assert fx.relative_error(fx.torch_logits(net, images), ours) <= fx.TOLERANCE
  back = sources.load(str(tmp_path / "timm"))  # our export reads back as it was
  np.testing.assert_array_equal(apply(back.config, back.params, images), ours)
  assert back.image_size == (32, 32)
  with pytest.raises(errors.CommandLineError, match="--format=hf writes ViTs only"):
    export.export_model(model, "hf", str(tmp_path / "hf"))


def test_an_official_shape_exports_under_its_timm_name():
  from vit_jax.weights.timm import bit as timm_bit  # pylint: disable=g-import-not-at-top

  names = {"BiT-R50x1": "resnetv2_50x1_bit", "BiT-R152x4": "resnetv2_152x4_bit"}
  for name in BIT:
    spec = timm_bit.model_spec(models.get_model_config(name), num_classes=10, image_size=(224,) * 2)
    assert spec["model_name"] == names.get(name, spec["model_name"])
    assert (spec["model_name"] is None) == (name in ("BiT-R50x2", "BiT-R152x1", "BiT-R200x3"))


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


def _run_config(digits_dir: str, **overrides):
  """The quickstart shrunk to seconds (`train_fixtures.TINY`) with the tiny BiT at 8x8."""
  from tests import train_fixtures  # pylint: disable=g-import-not-at-top

  config = train_fixtures.tiny_config(digits_dir, **overrides)
  config.model = tiny_config(units=(1, 1))
  return config


def test_a_run_fine_tunes_timms_bit_with_a_new_head(digits_dir, tmp_path, caplog):
  """timm's weights with their 5-class head: the fit's notes, then the tiny run learns."""
  import logging  # pylint: disable=g-import-not-at-top

  from tests import train_fixtures  # pylint: disable=g-import-not-at-top

  write_timm_bit(tmp_path / "timm", units=(1, 1))
  config = _run_config(digits_dir)
  config.pretrained = str(tmp_path / "timm")
  with caplog.at_level(logging.INFO, logger="absl"):
    _, losses = train_fixtures.fit_and_learn(config)
  assert train_fixtures.fit_notes(caplog.records) == [
    "head: using the fresh one from init_params (5 classes stored, 10 in the model)"
  ]
  assert losses[-1] < losses[0], losses


def test_the_configs_take_the_bit_names():
  from configs import pretrain, vit  # pylint: disable=g-import-not-at-top

  config = pretrain.get_config("bit_r50x1,imagenet21k")
  assert config.model.name == "BiT-R50x1" and config.optim.name == "adamw"
  assert "representation_size" not in config.model and config.pp.crop == 224
  config = vit.get_config("bit_r152x4,cifar10")
  assert config.model.name == "BiT-R152x4" and config.pp.crop == 384
  assert vit.get_config("r50_b32,cifar10").model.name == "R50+ViT-B_32"


@pytest.mark.skipif(
  __import__("importlib").util.find_spec("libtpu") is None, reason="libtpu is not installed"
)
def test_plan_compiles_a_bit_for_a_tpu_slice():
  from configs import pretrain  # pylint: disable=g-import-not-at-top
  from vit_jax.plan import planner, topology  # pylint: disable=g-import-not-at-top

  config = pretrain.get_config("bit_r50x1,imagenet21k")  # Adam, batch 4096 -> shrunk below
  config.model = tiny_config()
  config.num_classes, config.pp.crop, config.batch, config.batch_eval = 10, 32, 64, 64
  plan = planner.make_plan(config, topology.parse("v5e:2x2"))
  assert plan.fits and plan.flops_source == "xla" and plan.model == "BiT-tiny"
  # The analytic count (cost.resnet_flops_per_image) near XLA's count of the step.
  assert plan.model_flops_per_image * 64 == pytest.approx(plan.step_flops, rel=0.25)
  assert plan.train.collectives.bytes["all-reduce"] == pytest.approx(plan.params_bytes, rel=0.02)
