"""The input pipeline's host image ops (`data/host_images.py`) against TensorFlow's, the ops
of the official recipe (big_vision's `decode`, `resize`, `value_range`, `inception_crop`),
built here."""

import dataclasses
import io
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from vit_jax.data import data_config, decode_stage, host_images
from vit_jax.data import settings as data_settings
from vit_jax.infra import errors


def _jpeg(pixels: np.ndarray) -> bytes:
  out = io.BytesIO()
  Image.fromarray(pixels).save(out, "JPEG", quality=95)
  return out.getvalue()


def _tf_official_eval(encoded: bytes, size: tuple[int, int], method: str = "bilinear"):
  """The official eval image by TensorFlow: the whole image decoded as RGB, resized without
  antialiasing, (x - 127.5) / 127.5 clipped to [-1, 1]."""
  image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
  resized = tf.cast(tf.image.resize(image, size, method=method), tf.float32)
  return tf.clip_by_value((resized - 127.5) / 127.5, -1.0, 1.0).numpy()


@pytest.mark.parametrize(
  "shape, size", [((37, 53), (224, 224)), ((375, 500), (16, 16)), ((600, 800), (224, 224))]
)
def test_resize_bilinear_matches_tensorflow(shape, size):
  # The official eval resize: tf.image.resize's half-pixel bilinear, no antialiasing.
  pixels = np.random.default_rng(0).integers(0, 256, (*shape, 3), dtype=np.uint8)
  expected = tf.image.resize(pixels, size, method="bilinear").numpy()
  got = host_images.resize_bilinear(pixels, size)
  np.testing.assert_allclose(got, expected, rtol=0, atol=0.015)  # OpenCV's float32 round-off


@pytest.mark.parametrize("method", ["bilinear", "bicubic", "nearest"])
def test_eval_image_equals_tensorflows_official_eval_image(method):
  pixels = np.random.default_rng(1).integers(0, 256, (40, 30, 3), dtype=np.uint8)
  encoded = _jpeg(pixels)
  config = data_config.official((24, 24))
  config = dataclasses.replace(config, interpolation=method)
  expected = _tf_official_eval(encoded, (24, 24), method)
  np.testing.assert_allclose(host_images.eval_image(encoded, config), expected, atol=1e-4)
  np.testing.assert_allclose(host_images.prepare([encoded], config)[0], expected, atol=1e-4)


def test_a_tensorflow_resize_method_without_tensorflow_is_one_error_up_front(monkeypatch):
  config = dataclasses.replace(data_config.official((8, 8)), interpolation="bicubic")
  monkeypatch.setitem(sys.modules, "tensorflow", None)  # `import tensorflow` fails
  with pytest.raises(errors.ConfigError, match=r"'bicubic'.*\[tf\].*'bilinear'"):
    host_images.prepare(_jpeg(np.zeros((8, 8, 3), np.uint8)), config)
  settings = data_settings.Settings.for_evaluation(config, crop=8, batch=2)
  with pytest.raises(errors.ConfigError, match=r"'bicubic'.*\[tf\]"):  # before any image
    decode_stage.Stage(settings, "path", num_classes=2, train=False)


@pytest.mark.parametrize("value", [0, 255, None])
def test_images_lie_within_minus_one_one_exactly(value):
  noise = np.random.default_rng(0).integers(0, 256, (75, 100, 3), dtype=np.uint8)
  pixels = noise if value is None else np.full_like(noise, value)
  png = io.BytesIO()
  Image.fromarray(pixels).save(png, "PNG")
  outputs = [host_images.eval_image(png.getvalue(), data_config.official((32, 32)))]
  for uid in range(4):
    crop = host_images.train_crop(
      png.getvalue(), host_images.example_rng(7, uid), crop=32, min_area=0.05, flip=True
    )
    host_images.normalize_into(crop, crop, False)
    outputs.append(crop)
  for out in outputs:
    assert out.shape == (32, 32, 3) and out.dtype == np.float32
    assert out.min() >= -1.0 and out.max() <= 1.0
    if value is not None:
      np.testing.assert_array_equal(out, np.full_like(out, -1.0 if value == 0 else 1.0))


def test_flip_off_keeps_orientation():
  ramp = np.tile(np.arange(0, 256, 8, dtype=np.uint8)[None, :, None], (32, 1, 3))
  png = io.BytesIO()
  Image.fromarray(ramp).save(png, "PNG")
  for uid in range(6):  # With min_area=1 the crop is the whole image.
    out = host_images.train_crop(
      png.getvalue(), host_images.example_rng(0, uid), crop=32, min_area=1.0, flip=False
    )
    assert out[0, 0, 0] < out[0, -1, 0]


def test_crop_window_bounds_and_determinism():
  for uid in range(200):
    y, x, h, w = host_images.crop_window(300, 400, host_images.example_rng(3, uid), 0.05)
    assert 0 <= y and y + h <= 300 and 0 <= x and x + w <= 400
    assert h * w >= 0.04 * 300 * 400 and 3 / 4 - 0.02 <= w / h <= 4 / 3 + 0.02
  window = lambda seed, uid: host_images.crop_window(
    300, 400, host_images.example_rng(seed, uid), 0.05
  )
  assert window(3, 7) == window(3, 7) != window(4, 7)
  # No proposal fits a 1-pixel-high strip at these aspects: the whole image.
  assert host_images.crop_window(1, 400, host_images.example_rng(0, 0), 0.5) == (0, 0, 1, 400)


@pytest.mark.parametrize(
  "mean, std", [((0.5,) * 3, (0.5,) * 3), ((0.4, 0.5, 0.6), (0.2, 0.3, 0.4))]
)
def test_normalize_into_equals_normalize(mean, std):
  pixels = np.random.default_rng(2).integers(0, 256, (8, 8, 3), dtype=np.uint8)
  out = np.empty(pixels.shape, np.float32)
  host_images.normalize_into(pixels, out, False, mean, std)
  np.testing.assert_allclose(out, host_images.normalize(pixels, mean, std), atol=1e-6)
  assert out.min() >= -1 and out.max() <= 1 or mean != (0.5,) * 3
  host_images.normalize_into(pixels, out, True, mean, std)
  np.testing.assert_array_equal(out, pixels)


@pytest.mark.parametrize("uid", range(4))
def test_train_crop_equals_tensorflow_on_its_window(uid):
  # TensorFlow's ops on the window the host drew: decode, crop, resize (bilinear, no
  # antialiasing), flip. OpenCV's float resize is within 0.01 of TensorFlow's values (0..255;
  # 8e-5 after normalisation); the decoded pixels are the same. TensorFlow's
  # decode_and_crop_jpeg (big_vision's fused crop) upsamples chroma differently from its own
  # whole-image decode on a window's edge columns (up to 7 levels on about 0.5% of the
  # pixels), so the reference here crops TensorFlow's whole decode.
  rng = np.random.default_rng(uid)
  coarse = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
  pixels = np.asarray(Image.fromarray(coarse).resize((500, 375), Image.BICUBIC))
  encoded = _jpeg(pixels)
  drawn = host_images.example_rng(7, uid)
  y, x, h, w = host_images.crop_window(375, 500, drawn, min_area=0.05)
  flipped = drawn.random() < 0.5
  got = host_images.train_crop(
    encoded, host_images.example_rng(7, uid), crop=224, min_area=0.05, flip=True
  )
  window = tf.image.decode_jpeg(encoded, channels=3)[y : y + h, x : x + w]
  window = tf.image.flip_left_right(window) if flipped else window
  want = tf.image.resize(window, [224, 224], method="bilinear")
  np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=0.01)


def test_train_crop_of_grey_cmyk_and_png_is_rgb():
  grey = np.full((20, 30), 77, np.uint8)
  cmyk = io.BytesIO()
  Image.fromarray(np.full((20, 30, 3), 77, np.uint8)).convert("CMYK").save(cmyk, "JPEG")
  png = io.BytesIO()
  Image.fromarray(grey).convert("RGBA").save(png, "PNG")
  for data in (_jpeg(grey), cmyk.getvalue(), png.getvalue()):
    crop = host_images.train_crop(
      data, host_images.example_rng(0, 0), crop=8, min_area=0.5, flip=True
    )
    assert crop.shape == (8, 8, 3) and crop.dtype == np.float32
    assert abs(int(crop.mean()) - 77) <= 3


def test_refused_and_damaged_images_say_why():
  with pytest.raises(ValueError, match="not a JPEG, PNG"):
    host_images.eval_image(b"text", data_config.official((8, 8)))
  with pytest.raises(ValueError):
    host_images.train_crop(
      b"\xff\xd8\xff garbage", host_images.example_rng(0, 0), crop=8, min_area=0.5, flip=False
    )
