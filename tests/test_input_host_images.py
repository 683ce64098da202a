"""The Grain pipeline's host image ops (`data/host_images.py`) against TensorFlow's."""

import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from vit_jax.data import data_config, host_images, preprocess


def _jpeg(pixels: np.ndarray) -> bytes:
  out = io.BytesIO()
  Image.fromarray(pixels).save(out, "JPEG", quality=95)
  return out.getvalue()


@pytest.mark.parametrize("shape, size", [((37, 53), (224, 224)), ((375, 500), (16, 16))])
def test_resize_bilinear_equals_tensorflow(shape, size):
  # The official eval resize: tf.image.resize's half-pixel bilinear, no antialiasing.
  pixels = np.random.default_rng(0).integers(0, 256, (*shape, 3), dtype=np.uint8)
  expected = tf.image.resize(pixels, size, method="bilinear").numpy()
  np.testing.assert_allclose(host_images.resize_bilinear(pixels, size), expected, atol=1e-4)


def test_eval_image_equals_the_tf_data_eval_image():
  pixels = np.random.default_rng(1).integers(0, 256, (40, 30, 3), dtype=np.uint8)
  encoded = _jpeg(pixels)
  config = data_config.official((24, 24))
  expected = preprocess.eval_image(tf.constant(encoded), config).numpy()
  np.testing.assert_allclose(host_images.eval_image(encoded, config), expected, atol=1e-5)
  np.testing.assert_allclose(host_images.prepare([encoded], config)[0], expected, atol=1e-5)


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
  # The tf.data stage's ops on the window the host drew: decode, crop, resize (bilinear, no
  # antialiasing), flip. OpenCV's float resize is within 0.01 of TensorFlow's values (0..255;
  # 8e-5 after normalisation); the decoded pixels are the same. The tf.data stage decodes
  # with decode_and_crop_jpeg, whose chroma upsampling differs from its own whole-image
  # decode on a window's edge columns (up to 7 levels on about 0.5% of the pixels), so the
  # reference here crops TensorFlow's whole decode.
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
  want = preprocess.resize(tf.image.flip_left_right(window) if flipped else window, 224)
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
