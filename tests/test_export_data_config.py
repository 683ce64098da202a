"""Exports state the model's true preprocessing: timm's `local-dir:` folder (its
`resolve_data_config`), transformers' image processor, and our `.npz` sidecar; each read
back gives the same data config and the same logits."""

import dataclasses
import sys

import numpy as np
import pytest
from PIL import Image

from tests import interop_fixtures as fx
from vit_jax import export, weights
from vit_jax.data import host_images

sys.modules.setdefault("triton", None)  # see tests/test_export.py: triton beside TensorFlow
timm = pytest.importorskip("timm")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
FAST_ATOL = 0.08  # transformers' default (torchvision) processors vs PIL: test_eval_preprocess


@pytest.fixture(scope="module")
def timm_crop(tmp_path_factory):
  """The loaded model of a tiny crop_pct=0.9 bicubic timm folder."""
  directory, _ = fx.timm_crop_folder(str(tmp_path_factory.mktemp("timm_crop")))
  return weights.load(directory)


@pytest.fixture(scope="module")
def official_vit(tmp_path_factory):
  """A 32x32 official-layout ViT (.npz, no sidecar): the official recipe."""
  path = tmp_path_factory.mktemp("npz") / "vit.npz"
  fx.write_npz(path, "vit_ti16")
  return weights.load(path)


def _images(n: int = 3) -> list[np.ndarray]:
  return [fx.photo(40 + 17 * i, 60 - 9 * i, seed=i) for i in range(n)]


def _exported(request, which: str, tmp_path, fmt: str):
  """(the fixture ``which``'s model, the folder it is exported to as ``fmt``)."""
  model = request.getfixturevalue(which)
  out = str(tmp_path / fmt)
  export.export_model(model, fmt, out)
  return model, out


def _timm_inputs(net, images) -> np.ndarray:
  """timm's own eval inputs (NHWC) for ``net``, from its resolved data config."""
  transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=net))
  return np.stack([transform(Image.fromarray(i)).permute(1, 2, 0).numpy() for i in images])


@pytest.mark.parametrize("which", ["official_vit", "timm_crop"])
def test_timm_export_is_a_local_dir_with_the_true_data_config(tmp_path, request, which):
  model, out = _exported(request, which, tmp_path, "timm")
  net = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
  resolved = timm.data.resolve_data_config({}, model=net)
  want = model.data_config
  assert tuple(resolved["input_size"]) == (3, *want.input_size)  # 32x32, not 224
  assert resolved["crop_pct"] == want.crop_pct and resolved["crop_mode"] == want.crop_mode
  assert resolved["interpolation"] == want.interpolation
  assert tuple(resolved["mean"]) == want.mean and tuple(resolved["std"]) == want.std
  images = _images()
  ours = fx.our_logits(model, host_images.prepare(images, model.data_config))
  theirs = fx.torch_logits(net, _timm_inputs(net, images))
  if want.resizer == "pil":  # timm's transform is ours: the whole path agrees
    assert fx.relative_error(theirs, ours) <= fx.TOLERANCE
  same_inputs = host_images.prepare(images, model.data_config)
  assert fx.relative_error(fx.torch_logits(net, same_inputs), ours) <= fx.TOLERANCE
  again = weights.load(out)  # our reader of the export: timm's equivalent (PIL resize)
  assert again.data_config == dataclasses.replace(want, resizer="pil")


def test_hf_export_writes_the_crop_as_an_image_processor(tmp_path, request):
  model, out = _exported(request, "timm_crop", tmp_path, "hf")
  processor = transformers.AutoImageProcessor.from_pretrained(out)
  again = weights.load(out)
  assert again.data_config.input_size == model.data_config.input_size
  assert again.data_config.scale_size == model.data_config.scale_size  # the resize, 35
  assert (again.data_config.interpolation, again.data_config.crop_mode) == ("bicubic", "center")
  assert again.data_config.mean == model.data_config.mean
  images = _images()
  theirs = processor(images=[Image.fromarray(i) for i in images], return_tensors="np")
  np.testing.assert_allclose(
    host_images.prepare(images, again.data_config),
    theirs["pixel_values"].transpose(0, 2, 3, 1),
    rtol=0,
    atol=FAST_ATOL,
  )


def test_official_hf_export_keeps_the_whole_image_processor(tmp_path, request):
  _, out = _exported(request, "official_vit", tmp_path, "hf")
  processor = transformers.AutoImageProcessor.from_pretrained(out)
  assert type(processor).__name__.startswith("ViTImageProcessor")
  assert processor.size == {"height": 32, "width": 32} and processor.resample == 2


@pytest.mark.parametrize("which", ["official_vit", "timm_crop"])
def test_npz_round_trip_keeps_gelu_stats_and_data_config(tmp_path, request, which):
  model, out = _exported(request, which, tmp_path, "npz")
  again = weights.load(f"{out}/{export.NPZ_FILE}")
  assert again.data_config == model.data_config
  for key in ("gelu_approximate", "input_mean", "input_std"):
    got, want = getattr(again.config, key), getattr(model.config, key)
    assert tuple(np.atleast_1d(got)) == tuple(np.atleast_1d(want))
  images = host_images.prepare(_images(), model.data_config)
  np.testing.assert_array_equal(fx.our_logits(again, images), fx.our_logits(model, images))
