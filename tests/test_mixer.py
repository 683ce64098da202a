"""MLP-Mixer: the official parameter tree, its function (against a numpy version of the
official formulas), logical axes the partitioning rules shard, official `.npz` files read
with the architecture inferred, and timm's `MlpMixer` (written by timm in the test with
perturbed weights) imported and exported with its logits."""

from __future__ import annotations

import json
import math
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

TOLERANCE = 1e-5  # relative logit difference, float32


def tiny_config(**changes):
  """A 2-block, width-32 Mixer on 4x4 patches (16x16 images: 16 patches)."""
  config = models.get_model_config("Mixer-B_16")
  config.name = "Mixer-tiny"
  config.patches.size = (4, 4)
  config.update(dict(hidden_dim=32, num_blocks=2, tokens_mlp_dim=16, channels_mlp_dim=64))
  config.update(changes)
  return config


def random_params(config, num_classes=5, size=16, seed=0):
  return fx.random_tree(config, num_classes, size, seed)


def apply(config, params, images, num_classes=5, **overrides):
  return fx.logits(config, params, images, num_classes, **overrides)


def test_b16_tree_equals_the_official_layout():
  model = models.create_model(models.get_model_config("Mixer-B_16"), num_classes=1000)
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 224, 224, 3)))
  flat = traverse_util.flatten_dict(nn.unbox(shapes["params"]), sep="/")
  block = {
    "LayerNorm_0/scale": (768,),
    "LayerNorm_0/bias": (768,),
    "token_mixing/Dense_0/kernel": (196, 384),
    "token_mixing/Dense_0/bias": (384,),
    "token_mixing/Dense_1/kernel": (384, 196),
    "token_mixing/Dense_1/bias": (196,),
    "LayerNorm_1/scale": (768,),
    "LayerNorm_1/bias": (768,),
    "channel_mixing/Dense_0/kernel": (768, 3072),
    "channel_mixing/Dense_0/bias": (3072,),
    "channel_mixing/Dense_1/kernel": (3072, 768),
    "channel_mixing/Dense_1/bias": (768,),
  }
  expected = {
    "stem/kernel": (16, 16, 3, 768),
    "stem/bias": (768,),
    "pre_head_layer_norm/scale": (768,),
    "pre_head_layer_norm/bias": (768,),
    "head/kernel": (768, 1000),
    "head/bias": (1000,),
  }
  expected.update({f"MixerBlock_{i}/{k}": v for i in range(12) for k, v in block.items()})
  assert {k: tuple(v.shape) for k, v in flat.items()} == expected


def _gelu(x, approximate):
  if approximate:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
  return 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))


def _layer_norm(x, p, eps=1e-6):
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _mlp(x, p, approximate):
  h = _gelu(x @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"], approximate)
  return h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"]


def reference_logits(params, images, approximate):
  """The official Mixer's formulas in float64 numpy (models_mixer.py, written out)."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  kernel = p["stem"]["kernel"]  # [ph, pw, C, D]
  ph, pw, c, d = kernel.shape
  b, h, w, _ = images.shape
  patches = images.astype(np.float64).reshape(b, h // ph, ph, w // pw, pw, c)
  patches = patches.transpose(0, 1, 3, 2, 4, 5).reshape(b, -1, ph * pw * c)
  x = patches @ kernel.reshape(-1, d) + p["stem"]["bias"]  # [B, N, D]
  for i in range(sum(k.startswith("MixerBlock_") for k in p)):
    block = p[f"MixerBlock_{i}"]
    y = _layer_norm(x, block["LayerNorm_0"]).transpose(0, 2, 1)  # [B, D, N]
    x = x + _mlp(y, block["token_mixing"], approximate).transpose(0, 2, 1)
    x = x + _mlp(_layer_norm(x, block["LayerNorm_1"]), block["channel_mixing"], approximate)
  x = _layer_norm(x, p["pre_head_layer_norm"]).mean(1)
  return x @ p["head"]["kernel"] + p["head"]["bias"]


@pytest.mark.parametrize("approximate", [True, False])
def test_the_official_function(approximate):
  config = tiny_config(gelu_approximate=approximate)
  params = random_params(config)
  images = fx.images(2, 16)
  got = apply(config, params, images)
  want = reference_logits(params, images, approximate)
  assert fx.relative_error(got, want) <= TOLERANCE
  other = reference_logits(params, images, not approximate)
  assert fx.relative_error(got, other) > 10 * fx.relative_error(got, want)


def test_head_is_zero_and_remat_and_bfloat16_keep_the_function():
  config = tiny_config()
  model = models.create_model(config, num_classes=5)
  fresh = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)))["params"])
  assert not np.any(fresh["head"]["kernel"]) and "MixerBlock_1" in fresh
  params, images = random_params(config), fx.images(2, 16)
  want = apply(config, params, images)
  np.testing.assert_allclose(apply(tiny_config(remat=True), params, images), want, atol=1e-6)
  bf16 = apply(config, params, images, dtype=jnp.bfloat16)
  assert fx.relative_error(bf16, want) < 0.05
  assert apply(config, params, images, num_classes=0).shape == (2, 32)  # no head
  with pytest.raises(errors.ConfigError, match="not a multiple of the patch size 4x4"):
    apply(config, params, fx.images(1, 18))
  with pytest.raises(errors.ConfigError, match="scan=True"):
    models.create_model(tiny_config(scan=True), num_classes=5)


@pytest.mark.parametrize(
  "strategy, sharded",
  [
    ("fsdp", {"stem/kernel": 3, "MixerBlock_0/channel_mixing/Dense_0/kernel": 0}),
    (
      "tensor_parallel",
      {
        "MixerBlock_0/token_mixing/Dense_0/kernel": 1,
        "MixerBlock_0/token_mixing/Dense_1/kernel": 0,
        "MixerBlock_0/channel_mixing/Dense_0/kernel": 1,
        "MixerBlock_0/channel_mixing/Dense_1/kernel": 0,
      },
    ),
  ],
)
def test_every_parameter_has_logical_axes_the_rules_shard(strategy, sharded):
  fx.check_logical_axes(models.create_model(tiny_config(), num_classes=5), 16, strategy, sharded)


def test_an_official_npz_loads_with_the_mixer_inferred(tmp_path):
  config = tiny_config()
  params = random_params(config)
  npz.save_npz(tmp_path / "mixer.npz", params)
  loaded = sources.load(tmp_path / "mixer.npz")
  assert models.is_mixer(loaded.config) and loaded.config.name == "custom"
  assert (loaded.config.hidden_dim, loaded.config.num_blocks) == (32, 2)
  assert (loaded.config.tokens_mlp_dim, loaded.config.channels_mlp_dim) == (16, 64)
  assert loaded.image_size == (16, 16) and loaded.num_classes == 5
  images = fx.images(2, 16)
  np.testing.assert_array_equal(
    apply(loaded.config, loaded.params, images), apply(config, params, images)
  )
  with pytest.raises(errors.CheckpointError, match="an MLP-Mixer has no scanned layout"):
    npz.save_npz(tmp_path / "scanned.npz", params, scanned=True)
  official = jax.eval_shape(
    models.create_model(models.get_model_config("Mixer-L_16"), num_classes=0).init,
    jax.random.key(0),
    jnp.zeros((1, 224, 224, 3)),
  )["params"]
  assert architecture.infer_model_config(official).name == "Mixer-L_16"


def test_a_mixer_npz_of_another_number_of_patches_is_one_fit_error(tmp_path):
  from vit_jax import weights  # pylint: disable=g-import-not-at-top

  config = tiny_config()
  npz.save_npz(tmp_path / "mixer.npz", random_params(config))
  model = models.create_model(config, num_classes=7)
  init = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))["params"])
  with pytest.raises(ValueError, match=r"(?s)patches: checkpoint 16 vs model 64.*token-mixing"):
    weights.load_pretrained(tmp_path / "mixer.npz", init, config)
  init16 = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)))["params"])
  adapted = weights.load_pretrained(tmp_path / "mixer.npz", init16, config)
  assert adapted["head"]["kernel"].shape == (32, 7) and not adapted["head"]["kernel"].any()


# timm: tiny MlpMixers of the two families (their factories fix the full size, so the
# class is built directly and given the family's pretrained config, as the hub's files
# name it): width, blocks, image size; 16x16 patches.
timm_families = pytest.mark.parametrize(
  "family, kwargs",
  [
    ("mixer_b16_224.goog_in21k_ft_in1k", dict(embed_dim=48, num_blocks=2, img_size=64)),
    ("mixer_l16_224.goog_in21k_ft_in1k", dict(embed_dim=32, num_blocks=1, img_size=48)),
  ],
)


def _timm_logits(net, images):
  import torch  # pylint: disable=g-import-not-at-top

  with torch.no_grad():
    return net(torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))).numpy()


def _act(tanh: bool) -> dict:
  import timm  # pylint: disable=g-import-not-at-top

  return dict(act_layer=timm.layers.get_act_layer("gelu_tanh")) if tanh else {}


@timm_families
@pytest.mark.parametrize("tanh", [False, True])
def test_timm_import_gives_timms_logits(tmp_path, family, kwargs, tanh):
  timm = pytest.importorskip("timm")
  torch = pytest.importorskip("torch")
  from timm.models import mlp_mixer  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)
  net = mlp_mixer.MlpMixer(num_classes=5, patch_size=16, **kwargs, **_act(tanh)).eval()
  net.pretrained_cfg = timm.models.get_pretrained_cfg(family).to_dict()
  fx.perturb_torch(net)
  # timm records its model arguments; an activation class needs a name in their place.
  model_args = dict(act_layer="gelu_tanh") if tanh else None
  timm.models.save_for_hf(net, str(tmp_path), safe_serialization=True, model_args=model_args)
  assert json.loads((tmp_path / "config.json").read_text())["architecture"] == family.split(".")[0]
  loaded = sources.load(str(tmp_path))
  size = kwargs["img_size"]
  assert models.is_mixer(loaded.config) and loaded.config.gelu_approximate is tanh
  assert loaded.image_size == (size, size) and loaded.num_classes == 5
  images = fx.images(2, size)
  want = _timm_logits(net, images)
  assert fx.relative_error(apply(loaded.config, loaded.params, images), want) <= TOLERANCE
  other = apply(loaded.config, loaded.params, images, gelu_approximate=not tanh)
  assert fx.relative_error(other, want) > 5 * TOLERANCE


@pytest.mark.parametrize("tanh", [False, True])
def test_timm_export_gives_our_logits(tmp_path, tanh):
  pytest.importorskip("timm")
  from safetensors.torch import load_file  # pylint: disable=g-import-not-at-top
  from timm.models import mlp_mixer  # pylint: disable=g-import-not-at-top

  config = tiny_config(gelu_approximate=tanh, tokens_mlp_dim=13)  # a ratio timm rounds
  model = sources.LoadedModel(config, random_params(config), 5, (16, 16), None, "tiny")
  export.export_model(model, "timm", str(tmp_path / "timm"))
  spec = json.loads((tmp_path / "timm" / "timm_model.json").read_text())
  assert spec["model_name"] is None and ("act_layer" in spec) is tanh  # no timm name: the class
  net = mlp_mixer.MlpMixer(**spec["kwargs"], **_act(tanh)).eval()
  net.load_state_dict(load_file(str(tmp_path / "timm" / "model.safetensors")))
  images = fx.images(2, 16)
  ours = apply(config, model.params, images)
  assert fx.relative_error(_timm_logits(net, images), ours) <= TOLERANCE
  # Our export reads back as it was, GELU included.
  back = sources.load(str(tmp_path / "timm"))
  assert back.config.gelu_approximate is tanh
  np.testing.assert_array_equal(apply(back.config, back.params, images), ours)
  with pytest.raises(errors.CommandLineError, match="transformers has no MLP-Mixer"):
    export.export_model(model, "hf", str(tmp_path / "hf"))


def test_an_official_shape_exports_under_its_timm_name():
  timm = pytest.importorskip("timm")
  from vit_jax.weights.timm import mixer as timm_mixer  # pylint: disable=g-import-not-at-top

  for name, timm_name in (("Mixer-B_16", "mixer_b16_224"), ("Mixer-B_32", "mixer_b32_224")):
    config = models.get_model_config(name)
    spec = timm_mixer.model_spec(config, num_classes=10, image_size=(224, 224))
    assert spec["model_name"] == timm_name and spec["act_layer"] == "gelu_tanh"
    net = timm.create_model(spec["model_name"], pretrained=False, **spec["kwargs"])
    ours = jax.eval_shape(
      models.create_model(config, num_classes=10).init,
      jax.random.key(0),
      jnp.zeros((1, 224, 224, 3)),
    )
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(ours["params"])))
    assert sum(p.numel() for p in net.parameters()) == count


def _run_config(digits_dir: str, **overrides):
  """The quickstart shrunk to seconds (`train_fixtures.TINY`) with the tiny Mixer at 8x8."""
  from tests import train_fixtures  # pylint: disable=g-import-not-at-top

  config = train_fixtures.tiny_config(digits_dir, **overrides)
  config.model = tiny_config()
  return config


def test_a_run_fine_tunes_a_mixer_with_a_fresh_head(digits_dir, tmp_path, caplog):
  """Stored Mixer weights with reset_head: the fit's notes, then the tiny run learns."""
  import logging  # pylint: disable=g-import-not-at-top

  from tests import train_fixtures  # pylint: disable=g-import-not-at-top

  config = _run_config(digits_dir, reset_head=True)
  npz.save_npz(tmp_path / "mixer.npz", random_params(config.model, num_classes=10, size=8))
  config.pretrained = str(tmp_path / "mixer.npz")
  with caplog.at_level(logging.INFO, logger="absl"):
    _, losses = train_fixtures.fit_and_learn(config)
  assert train_fixtures.fit_notes(caplog.records) == [
    "head: using the fresh one from init_params (reset_head=True)"
  ]
  assert losses[-1] < losses[0], losses


def test_the_mixer_config_is_the_official_recipe():
  from configs import mixer, vit  # pylint: disable=g-import-not-at-top

  config, recipe = mixer.get_config("b16,cifar10"), vit.get_config("b16,cifar10")
  assert config.model.name == "Mixer-B_16" and config.pp.crop == 224
  assert config.dataset == "cifar10" and config.train_split == "train[:98%]"
  assert (config.total_steps, config.lr.base, config.optim.name) == (10_000, 0.03, "sgd")
  assert config.lr.warmup_steps == recipe.lr.warmup_steps and config.batch == 512
  with pytest.raises(ValueError, match="b16, b32, l16"):
    mixer.get_config("s16,cifar10")


@pytest.mark.skipif(
  __import__("importlib").util.find_spec("libtpu") is None, reason="libtpu is not installed"
)
def test_plan_compiles_a_mixer_for_a_tpu_slice():
  from configs import pretrain  # pylint: disable=g-import-not-at-top
  from vit_jax.plan import planner, topology  # pylint: disable=g-import-not-at-top

  config = pretrain.get_config("b16,imagenet21k")  # Adam, batch 4096 -> shrunk below
  config.model = tiny_config(hidden_dim=256, tokens_mlp_dim=128, channels_mlp_dim=1024)
  config.num_classes, config.pp.crop, config.batch, config.batch_eval = 10, 32, 64, 64
  plan = planner.make_plan(config, topology.parse("v5e:2x2"))
  assert plan.fits and plan.flops_source == "xla" and plan.model == "Mixer-tiny"
  assert plan.step_flops == pytest.approx(plan.model_flops_per_image * plan.batch, rel=0.05)
  assert plan.train.collectives.bytes["all-reduce"] == pytest.approx(plan.params_bytes, rel=0.02)


def test_stablehlo_export_gives_our_logits_for_any_batch(tmp_path):
  from vit_jax.weights import serving  # pylint: disable=g-import-not-at-top

  config = tiny_config()
  model = sources.LoadedModel(config, random_params(config), 5, (16, 16), None, "tiny")
  export.export_model(model, "stablehlo", str(tmp_path / "hlo"))
  exported = jax.export.deserialize((tmp_path / "hlo" / serving.JAX_EXPORTED).read_bytes())
  for batch in (1, 3):
    images = fx.images(batch, 16)
    got = np.asarray(exported.call(images))
    assert fx.relative_error(got, apply(config, model.params, images)) <= TOLERANCE
