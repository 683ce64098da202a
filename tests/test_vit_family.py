"""The ViTs fine-tuned today, from checkpoints written here by timm and transformers
themselves (tiny configs of each family, every array perturbed): import with the library's
logits, export back to timm with ours, each checkpoint's own input normalisation recorded
and used, and a few fine-tuning steps on the built-in digits.

`python -m pytest tests/test_vit_family.py -k logits -s` prints the README's parity table.
"""

from __future__ import annotations

import functools
import os
import sys

import jax
import numpy as np
import pytest
from flax import traverse_util

from configs import vit
from tests import interop_fixtures as fx
from tests import train_fixtures
from vit_jax import models
from vit_jax.infra import errors
from vit_jax.weights import npz, sources
from vit_jax.weights.timm import vit as timm_export

sys.modules.setdefault("triton", None)  # see tests/test_export.py: triton beside TensorFlow
torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

IMAGENET_MEAN = (0.485, 0.456, 0.406)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_SMALL = dict(depth=1, embed_dim=64, num_heads=2)

# name -> (timm architecture, tiny keyword arguments, image size, what the import records)
FAMILIES = {
  "dinov2_reg4": (
    "vit_small_patch14_reg4_dinov2",
    dict(depth=2),
    28,
    dict(
      num_registers=4, posemb_patches_only=True, layer_scale_init=1e-5, input_mean=IMAGENET_MEAN
    ),
  ),
  "siglip": (
    "vit_base_patch16_siglip_224",
    _SMALL,
    32,
    dict(classifier="map", input_mean=(0.5,) * 3),
  ),
  "clip": (
    "vit_base_patch16_clip_224",
    _SMALL,
    32,
    dict(norm_pre=True, layer_norm_epsilon=1e-5, activation="gelu", input_mean=CLIP_MEAN),
  ),
  "clip_quickgelu": (
    "vit_base_patch16_clip_quickgelu_224",
    _SMALL,
    32,
    dict(norm_pre=True, layer_norm_epsilon=1e-5, activation="quick_gelu"),
  ),
  "gap": ("vit_base_patch16_gap_224", _SMALL, 32, dict(classifier="gap", fc_norm=False)),
  "reg4_gap": (
    "vit_base_patch16_reg4_gap_256",
    _SMALL,
    32,
    dict(classifier="gap", fc_norm=True, num_registers=4, posemb_patches_only=True),
  ),
  "gap_with_class_token": (
    "vit_tiny_patch16_224",
    dict(depth=1, global_pool="avg", fc_norm=True),
    32,
    dict(classifier="gap", class_token=True, fc_norm=True),
  ),
  "deit": ("deit_tiny_patch16_224", dict(depth=1), 32, dict(input_mean=IMAGENET_MEAN)),
}


def perturb(model) -> None:
  """Every array away from its init (timm zero-inits some; LayerScale starts at 1e-5):
  matrices 5x and every array plus N(0, 0.1^2) noise."""
  gen = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for p in model.parameters():
      if p.ndim == 2:
        p.mul_(5.0)
      p.add_(0.1 * torch.randn(p.shape, generator=gen))


@functools.lru_cache(maxsize=None)
def _timm_source(name: str, root: str):
  """(checkpoint folder in the hub's layout, timm model, image size), written once."""
  torch.manual_seed(0)
  arch, kwargs, size, _ = FAMILIES[name]
  model = timm.create_model(
    arch, pretrained=False, img_size=size, num_classes=fx.NUM_CLASSES, **kwargs
  ).eval()
  perturb(model)
  directory = os.path.join(root, name)
  timm.models.save_for_hf(model, directory, safe_serialization=True)
  return directory, model, size


@pytest.fixture(scope="module")
def timm_sources(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("families"))
  return lambda name: _timm_source(name, root)


@pytest.mark.parametrize("name", FAMILIES)
def test_timm_family_gives_the_librarys_logits_and_exports_back(timm_sources, name):
  directory, model, size = timm_sources(name)
  loaded = sources.load(directory)
  for key, value in FAMILIES[name][3].items():
    got = getattr(loaded.config, key)
    assert (tuple(got) if isinstance(value, tuple) else got) == value, key
  images = fx.images(2, size)
  want = fx.torch_logits(model, images)
  ours = fx.our_logits(loaded, images)
  imported = fx.relative_error(ours, want)

  # Export: timm builds the exported architecture, loads the arrays strictly, gives ours.
  spec = timm_export.model_spec(loaded.config, num_classes=fx.NUM_CLASSES, image_size=(size, size))
  rebuilt = fx.timm_rebuilt(spec, timm_export.to_timm(loaded.params, loaded.config))
  exported = fx.relative_error(fx.torch_logits(rebuilt, images), ours)
  print(f"| timm `{FAMILIES[name][0]}` | {imported:.1e} | {exported:.1e} |")
  assert imported <= fx.TOLERANCE and exported <= fx.TOLERANCE
  assert spec["pretrained_cfg_overlay"]["mean"] == list(loaded.config.input_mean)


def test_the_options_are_seen_in_the_logits(timm_sources):
  """Each recorded option matters: the other value moves the logits well past the bound."""
  cases = {
    "clip": dict(layer_norm_epsilon=1e-6),
    "clip_quickgelu": dict(activation="gelu"),
    "reg4_gap": dict(fc_norm=False, classifier="gap"),
  }
  for name, overrides in cases.items():
    directory, model, size = timm_sources(name)
    loaded = sources.load(directory)
    images = fx.images(2, size)
    if "fc_norm" in overrides:  # the same arrays under the encoder's norm instead
      flat = traverse_util.flatten_dict(loaded.params, sep="/")
      for part in ("scale", "bias"):
        flat[f"Transformer/encoder_norm/{part}"] = flat.pop(f"fc_norm/{part}")
      loaded.params = traverse_util.unflatten_dict(flat, sep="/")
    other = fx.our_logits(loaded, images, **overrides)
    assert fx.relative_error(other, fx.torch_logits(model, images)) > 5 * fx.TOLERANCE, name


def test_transformers_vit_reads_its_epsilon_and_image_processor(tmp_path):
  model = fx.hf_vit_classifier(layer_norm_eps=1e-12)  # what google/vit-* configs say
  perturb(model)
  model.save_pretrained(tmp_path)
  std = (0.229, 0.224, 0.225)
  transformers.ViTImageProcessor(
    image_mean=list(IMAGENET_MEAN), image_std=list(std)
  ).save_pretrained(tmp_path)
  loaded = sources.load(str(tmp_path))
  assert loaded.config.layer_norm_epsilon == 1e-12
  assert tuple(loaded.config.input_mean) == IMAGENET_MEAN and tuple(loaded.config.input_std) == std
  images = fx.images(2, 32)
  want = fx.torch_logits(model, images)
  error = fx.relative_error(fx.our_logits(loaded, images), want)
  print(f"| transformers `ViTForImageClassification`, `layer_norm_eps=1e-12` | {error:.1e} | - |")
  assert error <= fx.TOLERANCE
  other_epsilon = fx.our_logits(loaded, images, layer_norm_epsilon=1e-6)
  assert fx.relative_error(other_epsilon, want) > fx.TOLERANCE


def test_what_has_no_place_is_refused_with_one_error(timm_sources, tmp_path):
  distilled = timm.create_model(
    "deit_tiny_distilled_patch16_224", pretrained=False, img_size=32, depth=1, num_classes=3
  )
  timm.models.save_for_hf(distilled, str(tmp_path / "distilled"), safe_serialization=True)
  with pytest.raises(errors.CheckpointError, match="distilled DeiT.*non-distilled deit_"):
    sources.load(str(tmp_path / "distilled"))

  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top

  directory = timm_sources("deit")[0]
  tensors = load_file(os.path.join(directory, "model.safetensors"))
  tensors["blocks.0.attn.q_norm.weight"] = np.ones(64, np.float32)
  tensors["blocks.0.attn.k_norm.weight"] = np.ones(64, np.float32)
  save_file(tensors, str(tmp_path / "model.safetensors"))
  with pytest.raises(errors.CheckpointError) as raised:
    sources.load(str(tmp_path / "model.safetensors"))
  message = str(raised.value)
  assert "2 timm arrays have no place" in message and "k_norm.weight" in message
  assert "q_norm.weight" in message and "\n" not in message


def test_predict_normalises_with_the_checkpoints_mean_and_std(timm_sources, tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from vit_jax import predict  # pylint: disable=g-import-not-at-top

  directory, model, size = timm_sources("deit")
  loaded = sources.load(directory)
  colour = np.array([200, 100, 30], np.uint8)
  path = str(tmp_path / "flat.png")
  tf.io.write_file(path, tf.io.encode_png(np.broadcast_to(colour, (size, size, 3)).copy()))
  classifier = predict.Classifier(loaded, (size, size))
  prepared = classifier.prepare(path)
  std = np.array(loaded.config.input_std, np.float32)
  want = (colour / np.float32(255) - np.array(IMAGENET_MEAN, np.float32)) / std
  np.testing.assert_allclose(prepared, np.broadcast_to(want, prepared.shape), atol=1e-6)
  # The prepared image gives timm's probabilities on the same input.
  probs = classifier.probabilities(prepared[None])
  theirs = torch.softmax(torch.from_numpy(fx.torch_logits(model, prepared[None])), -1).numpy()
  np.testing.assert_allclose(probs, theirs, atol=1e-5)


def _finetune_config(loaded: sources.LoadedModel, source: str, digits_dir: str, crop: int):
  config = vit.get_config("ti16,digits")  # the fine-tuning recipe (SGD), shrunk
  config.model = models.to_config(loaded.config)
  config.data_dir, config.pp.crop, config.pretrained = digits_dir, crop, source
  config.batch, config.batch_eval, config.shuffle_buffer = 8, 32, 64
  config.test_split = "test[:32]"
  config.total_steps, config.lr.warmup_steps = 3, 1
  config.log_every, config.eval_every, config.checkpoint_every = 1, 100, 100
  return config


# name -> fine-tuning resolution: a 3x3 grid where the checkpoint has 2x2.
FINETUNE = {"dinov2_reg4": 42, "siglip": 48, "clip": 48}


@pytest.mark.parametrize("name", FINETUNE)
def test_family_finetunes_on_digits_with_a_new_head_and_grid(
  timm_sources, name, digits_dir, monkeypatch
):
  from vit_jax import weights  # pylint: disable=g-import-not-at-top

  directory, _, _ = timm_sources(name)
  loaded = sources.load(directory)
  config = _finetune_config(loaded, directory, digits_dir, FINETUNE[name])
  adapted = {}
  real_load = weights.load_pretrained

  def spy(*args, **kwargs):
    adapted.update(
      traverse_util.flatten_dict(npz.scanned_to_layers(real_load(*args, **kwargs)), sep="/")
    )
    return traverse_util.unflatten_dict(dict(adapted), sep="/")

  monkeypatch.setattr(weights, "load_pretrained", spy)
  _, losses = train_fixtures.fit_and_learn(config)

  imported = traverse_util.flatten_dict(loaded.params, sep="/")
  assert adapted["head/kernel"].shape[-1] == 10 and not adapted["head/kernel"].any()
  posemb = "Transformer/posembed_input/pos_embedding"
  prefix = imported[posemb].shape[1] - 4  # the checkpoints' grid is 2x2
  assert adapted[posemb].shape == (1, prefix + 9, imported[posemb].shape[-1])
  np.testing.assert_array_equal(adapted[posemb][:, :prefix], imported[posemb][:, :prefix])
  for key, value in imported.items():  # everything else as stored (registers, MAP, norms)
    if not key.startswith("head/") and key != posemb:
      np.testing.assert_array_equal(adapted[key], value, err_msg=key)
  assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("name", ["siglip", "dinov2_reg4"])
def test_map_and_registers_export_to_saved_model_and_stablehlo(timm_sources, name, tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from vit_jax import export  # pylint: disable=g-import-not-at-top
  from vit_jax.weights import serving  # pylint: disable=g-import-not-at-top

  loaded = sources.load(timm_sources(name)[0])
  images = fx.images(3, loaded.image_size[0])
  ours = fx.our_logits(loaded, images)
  export.export_model(loaded, "stablehlo", str(tmp_path / "hlo"))
  exported = jax.export.deserialize((tmp_path / "hlo" / serving.JAX_EXPORTED).read_bytes())
  assert fx.relative_error(np.asarray(exported.call(images)), ours) <= fx.TOLERANCE
  export.export_model(loaded, "saved_model", str(tmp_path / "sm"))
  serve = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
  got = next(iter(serve(images=tf.constant(images)).values())).numpy()
  assert fx.relative_error(got, ours) <= fx.TOLERANCE
