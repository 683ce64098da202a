"""MLP-Mixer: the official parameter tree, its function (against a numpy version of the
official formulas), its fit errors, the GELU timm's weights were trained with, timm's
official names built by timm, the recipe's config and a StableHLO export; the tiny Mixer
and timm's builders of it for the checks every timm family shares
(tests/test_families_timm.py: sharding, `.npz`, timm both ways, names, a fine-tuning run,
configs, a plan)."""

from __future__ import annotations

import math
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from tests import interop_fixtures as fx
from vit_jax import export, models
from vit_jax.infra import errors
from vit_jax.weights import npz, sources

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


def test_a_mixer_takes_whole_patches_only():
  """(A zero head, remat, bfloat16 and scan: tests/test_families_timm.py.)"""
  config = tiny_config()
  model = models.create_model(config, num_classes=5)
  fresh = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 16, 16, 3)))["params"]
  assert "MixerBlock_1" in fresh
  with pytest.raises(errors.ConfigError, match="not a multiple of the patch size 4x4"):
    apply(config, random_params(config), fx.images(1, 18))


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
  with pytest.raises(errors.CheckpointError, match="an MLP-Mixer has no scanned layout"):
    npz.save_npz(tmp_path / "scanned.npz", random_params(config), scanned=True)


# timm: tiny MlpMixers of the two families (their factories fix the full size, so the
# class is built directly and given the family's pretrained config, as the hub's files
# name it): width, blocks, image size; 16x16 patches.
TIMM_FAMILIES = (
  ("mixer_b16_224.goog_in21k_ft_in1k", dict(embed_dim=48, num_blocks=2, img_size=64)),
  ("mixer_l16_224.goog_in21k_ft_in1k", dict(embed_dim=32, num_blocks=1, img_size=48)),
)


def _act(tanh: bool) -> dict:
  import timm  # pylint: disable=g-import-not-at-top

  return dict(act_layer=timm.layers.get_act_layer("gelu_tanh")) if tanh else {}


def write_timm_mixer(directory, pretrained: str, tanh: bool, **kwargs):
  """A tiny timm MlpMixer with perturbed weights, saved as timm's hub folder (config.json
  naming the architecture of ``pretrained``, model.safetensors); returns the torch model."""
  timm = pytest.importorskip("timm")
  torch = pytest.importorskip("torch")
  from timm.models import mlp_mixer  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)
  net = mlp_mixer.MlpMixer(num_classes=5, patch_size=16, **kwargs, **_act(tanh)).eval()
  net.pretrained_cfg = timm.models.get_pretrained_cfg(pretrained).to_dict()
  fx.perturb_torch(net)
  # timm records its model arguments; an activation class needs a name in their place.
  model_args = dict(act_layer="gelu_tanh") if tanh else None
  timm.models.save_for_hf(net, str(directory), safe_serialization=True, model_args=model_args)
  return net


def rebuild_timm(spec: dict):
  """timm's `MlpMixer` of our export's ``spec`` (no timm name: the class), with the tanh
  GELU where the spec states it apart."""
  from timm.models import mlp_mixer  # pylint: disable=g-import-not-at-top

  return mlp_mixer.MlpMixer(**spec["kwargs"], **_act("act_layer" in spec)).eval()


@pytest.mark.parametrize("pretrained, kwargs", TIMM_FAMILIES)
@pytest.mark.parametrize("tanh", [False, True])
def test_timm_import_reads_the_gelu_the_weights_were_trained_with(
  tmp_path, pretrained, kwargs, tanh
):
  """The other GELU gives other logits (timm's logits: tests/test_families_timm.py)."""
  net = write_timm_mixer(tmp_path, pretrained, tanh, **kwargs)
  loaded = sources.load(str(tmp_path))
  assert loaded.config.gelu_approximate is tanh
  images = fx.images(2, kwargs["img_size"])
  want = fx.torch_logits(net, images)
  other = apply(loaded.config, loaded.params, images, gelu_approximate=not tanh)
  assert fx.relative_error(other, want) > 5 * TOLERANCE


def test_an_official_shape_builds_in_timm_with_our_parameter_count():
  """Under timm's name with the tanh GELU stated apart (the names of every family:
  tests/test_families_timm.py)."""
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


def test_the_mixer_config_is_the_official_recipe():
  """Its warmup the ViT recipe's; other sizes refused (its names: tests/test_families_timm.py)."""
  from configs import mixer, vit  # pylint: disable=g-import-not-at-top

  config, recipe = mixer.get_config("b16,cifar10"), vit.get_config("b16,cifar10")
  assert config.lr.warmup_steps == recipe.lr.warmup_steps
  with pytest.raises(ValueError, match="b16, b32, l16"):
    mixer.get_config("s16,cifar10")


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
