"""The eval transform (`host_images.prepare`) against timm's and transformers' own, on
photo-like images made here; the data config read from timm and transformers folders.

Measured tolerances: against timm's `create_transform(**resolve_data_config(...))` and
transformers' PIL image processors (ViT, CLIP, SigLIP, BiT) the inputs are identical (max
difference 0.0: the same PIL resize, crop offsets and float32 arithmetic). transformers'
default processors resize torch tensors (torchvision, antialiased) instead of PIL images:
within 0.079 of ours (one to ten 8-bit levels after normalisation by std 0.5), FAST_ATOL.
"""

import dataclasses
import io
import sys

import numpy as np
import pytest
from PIL import Image

from tests import interop_fixtures as fx
from vit_jax.data import data_config, host_images
from vit_jax.infra import errors

sys.modules.setdefault("triton", None)  # see tests/test_export.py: triton beside TensorFlow
timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
EXACT_ATOL = 1e-6
FAST_ATOL = 0.08
SIZES = [(300, 400), (257, 191), (61, 47)]  # landscape, portrait (odd edges), small


def _timm_input(cfg: dict, image: np.ndarray) -> np.ndarray:
  """timm's eval transform of ``image`` (its resolve_data_config on ``cfg``), NHWC."""
  resolved = timm.data.resolve_data_config(pretrained_cfg=cfg)
  transform = timm.data.create_transform(**resolved)
  return transform(Image.fromarray(image)).permute(1, 2, 0).numpy()


@pytest.mark.parametrize("crop_mode", ["center", "squash", "border"])
@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
@pytest.mark.parametrize("crop_pct", [0.875, 0.9, 1.0])
@pytest.mark.parametrize("input_size", [(32, 32), (24, 40)])
def test_prepare_equals_timm(crop_mode, interpolation, crop_pct, input_size):
  cfg = {
    "input_size": (3, *input_size),
    "crop_pct": crop_pct,
    "interpolation": interpolation,
    "crop_mode": crop_mode,
    "mean": (0.485, 0.456, 0.406),
    "std": (0.229, 0.224, 0.225),
  }
  config = data_config.from_timm(cfg, (224, 224))
  for height, width in SIZES:
    image = fx.photo(height, width)
    got = host_images.prepare(image, config)
    assert got.shape == (1, *input_size, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got[0], _timm_input(cfg, image), rtol=0, atol=EXACT_ATOL)


def test_timm_defaults_fill_what_a_pretrained_cfg_leaves_out():
  config = data_config.from_timm({}, (32, 32))
  resolved = timm.data.resolve_data_config(pretrained_cfg={"input_size": (3, 32, 32)})
  assert (config.crop_pct, config.interpolation, config.crop_mode) == (
    resolved["crop_pct"],
    resolved["interpolation"],
    resolved["crop_mode"],
  )
  assert (config.mean, config.std) == (tuple(resolved["mean"]), tuple(resolved["std"]))


def _processors():
  """(name, processor class, its kwargs): resize to height x width (ViT, SigLIP) or the
  shortest edge then a centre crop (CLIP, BiT), each in its PIL and default form."""
  whole = {"size": {"height": 32, "width": 48}}
  crop = {"size": {"shortest_edge": 40}, "crop_size": {"height": 32, "width": 32}}
  for name, kwargs in (("ViT", whole), ("Siglip", whole), ("CLIP", crop), ("Bit", crop)):
    for suffix, atol in (("ImageProcessorPil", EXACT_ATOL), ("ImageProcessor", FAST_ATOL)):
      yield pytest.param(name + suffix, kwargs, atol, id=name + suffix)


@pytest.mark.parametrize("name, kwargs, atol", _processors())
def test_prepare_equals_transformers_processors(name, kwargs, atol):
  processor = getattr(transformers, name)(**kwargs)
  config = data_config.from_hf_processor(processor.to_dict(), (224, 224), name)
  for height, width in SIZES + [(101, 150)]:  # 101 x 150: an odd crop margin (offsets differ)
    image = fx.photo(height, width)
    want = processor(images=Image.fromarray(image), return_tensors="np")["pixel_values"][0]
    np.testing.assert_allclose(
      host_images.prepare(image, config)[0], want.transpose(1, 2, 0), rtol=0, atol=atol
    )


def test_every_kind_of_image_gives_the_same_input(tmp_path):
  config = data_config.DataConfig((32, 32), 0.9, "bicubic", "center", resizer="pil")
  pixels = fx.photo(50, 70)
  path = tmp_path / "a.png"
  Image.fromarray(pixels).save(path)
  want = host_images.prepare(pixels, config)  # [1, 32, 32, 3]
  for image in (str(path), path, path.read_bytes(), Image.fromarray(pixels)):
    np.testing.assert_array_equal(host_images.prepare(image, config), want)
  batch = host_images.prepare([pixels, path, np.stack([pixels, pixels])], config)
  np.testing.assert_array_equal(batch, np.concatenate([want] * 4))
  rgba = np.concatenate([pixels, np.full((50, 70, 1), 7, np.uint8)], axis=-1)
  np.testing.assert_array_equal(host_images.prepare(rgba, config), want)  # alpha dropped


def test_eval_pipeline_prepares_a_crop_as_prepare_does():
  config = data_config.DataConfig((32, 32), 0.875, "bicubic", "center", resizer="pil")
  encoded = []
  for seed, (height, width) in enumerate(SIZES):
    buf = io.BytesIO()
    Image.fromarray(fx.photo(height, width, seed)).save(buf, "PNG")
    encoded.append(buf.getvalue())
  got = np.stack([host_images.eval_image(data, config) for data in encoded])  # the pipeline's
  np.testing.assert_array_equal(got, host_images.prepare(encoded, config))


def test_run_config_asks_for_a_crop(tiny_config):
  from vit_jax.data import settings as data_settings

  assert data_settings.Settings.from_config(tiny_config).eval_data_config() == data_config.official(
    (tiny_config.pp.crop,) * 2
  )
  tiny_config.pp.crop_pct = 0.875
  tiny_config.pp.interpolation = "bicubic"
  settings = dataclasses.replace(data_settings.Settings.from_config(tiny_config), crop=24)
  assert settings.eval_data_config() == data_config.DataConfig(
    (24, 24), 0.875, "bicubic", resizer="pil"
  )
  tiny_config.pp.crop_mode = "zoom"
  with pytest.raises(errors.ConfigError, match=r"config.pp: .*crop_mode='zoom'"):
    data_settings.Settings.from_config(tiny_config)


@pytest.mark.parametrize(
  "image, message",
  [
    (np.zeros((8, 8, 3), np.float32), "dtype float32 is not read"),
    (np.zeros((8, 8, 5), np.uint8), "shape (8, 8, 5) is not read"),
    (b"not an image", "not an image PIL decodes"),
    ([], "No images"),
    (3, "A int is not an image"),
  ],
)
def test_bad_images_are_one_clear_error(image, message):
  config = data_config.DataConfig((8, 8), resizer="pil")
  with pytest.raises(errors.InputFileError, match=message.replace("(", r"\(").replace(")", r"\)")):
    host_images.prepare(image, config)


@pytest.mark.parametrize(
  "fields, message",
  [
    (dict(crop_pct=0.9), "resizer='tf' with crop_pct=0.9"),
    (dict(crop_mode="zoom", resizer="pil"), "crop_mode='zoom'"),
    (dict(interpolation="cubic", resizer="pil"), "interpolation='cubic'"),
    (dict(mean=(0.5, 0.5)), r"mean=\(0.5, 0.5\)"),
  ],
)
def test_invalid_data_config_names_the_value(fields, message):
  with pytest.raises(errors.ConfigError, match=message):
    data_config.DataConfig((32, 32), **fields)


@pytest.fixture(scope="module")
def timm_crop_folder(tmp_path_factory):
  return fx.timm_crop_folder(str(tmp_path_factory.mktemp("timm_crop")))


def test_timm_folder_logits_with_its_own_preprocessing(timm_crop_folder):
  from vit_jax import weights  # pylint: disable=g-import-not-at-top

  directory, net = timm_crop_folder
  loaded = weights.load(directory)
  assert loaded.data_config == data_config.DataConfig(
    (32, 32),
    0.9,
    "bicubic",
    "center",
    (0.485, 0.456, 0.406),
    (0.229, 0.224, 0.225),
    resizer="pil",
  )
  images = [fx.photo(h, w, seed) for seed, (h, w) in enumerate(SIZES)]
  transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=net))
  theirs = np.stack([transform(Image.fromarray(i)).permute(1, 2, 0).numpy() for i in images])
  want = fx.torch_logits(net, theirs)
  got = fx.our_logits(loaded, host_images.prepare(images, loaded.data_config))
  assert fx.relative_error(got, want) <= fx.TOLERANCE


def test_official_names_keep_the_official_recipe(timm_crop_folder, monkeypatch):
  from vit_jax import weights  # pylint: disable=g-import-not-at-top
  from vit_jax.weights import hub  # pylint: disable=g-import-not-at-top

  directory, _ = timm_crop_folder
  monkeypatch.setattr(hub, "download", lambda repo, revision=None: directory)
  by_repo = weights.load("hf-hub:org/name").data_config  # timm's own config: its crop
  assert (by_repo.crop_pct, by_repo.interpolation) == (0.9, "bicubic")
  # The paper's name for the weights: the paper's whole-image resize, whatever timm's
  # copy of them says.
  official = weights.load("ViT-B_16").data_config
  assert official == data_config.official((32, 32), by_repo.mean, by_repo.std)


def test_fewshot_evaluates_a_checkpoint_with_its_data_config(timm_crop_folder):
  from vit_jax import fewshot  # pylint: disable=g-import-not-at-top

  directory, _ = timm_crop_folder
  values = {
    "model": None,
    "crop": None,
    "seq_len": None,
    "batch": 8,
    "data_dir": None,
    "checkpoint": directory,
  }
  settings = fewshot._config(values)[1]  # pylint: disable=protected-access
  want = data_config.DataConfig(
    (32, 32), 0.9, "bicubic", "center", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), "pil"
  )
  assert settings.eval_data_config() == want
  values["crop"] = 48  # --crop: the same recipe at another size
  settings = fewshot._config(values)[1]  # pylint: disable=protected-access
  assert settings.eval_data_config() == want.at_size((48, 48))
