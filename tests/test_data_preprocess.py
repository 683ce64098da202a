"""Preprocessing: pure TF functions, tested on encoded images made here (no tfds)."""

import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from vit_jax.data import data_config, preprocess


def _encode(array: np.ndarray, fmt: str) -> tf.Tensor:
  buf = io.BytesIO()
  Image.fromarray(array).save(buf, fmt)  # Mode from the shape: L, RGB or RGBA.
  return tf.constant(buf.getvalue())


def _seed(uid: int) -> tf.Tensor:
  return tf.constant([7, uid], tf.int64)


NOISE = np.random.default_rng(0).integers(0, 256, (75, 100, 3), dtype=np.uint8)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
@pytest.mark.parametrize("value", [0, 255, None])
def test_output_within_minus_one_one_exactly(fmt, value):
  array = NOISE if value is None else np.full((75, 100, 3), value, np.uint8)
  data = _encode(array, fmt)
  outputs = [preprocess.eval_image(data, data_config.official((32, 32)))] + [
    preprocess.train_image(data, _seed(u), crop=32, min_area=0.05, flip=True, randaug=None)
    for u in range(4)
  ]
  for out in outputs:
    out = out.numpy()
    assert out.shape == (32, 32, 3) and out.dtype == np.float32
    assert out.min() >= -1.0 and out.max() <= 1.0
    if value == 0:
      assert np.all(out == -1.0)
    if value == 255:
      assert np.all(out == 1.0)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_official_eval_image_is_the_whole_image_resized_bilinearly(fmt):
  data = _encode(NOISE, fmt)
  expected = preprocess.normalize(preprocess.resize(preprocess.decode_rgb(data), 32))
  got = preprocess.eval_image(data, data_config.official((32, 32)))
  np.testing.assert_array_equal(got.numpy(), expected.numpy())  # bit-identical


@pytest.mark.parametrize(
  "mode,shape", [("L", (20, 30)), ("RGBA", (20, 30, 4)), ("RGB", (20, 30, 3))]
)
def test_grey_and_rgba_become_rgb(mode, shape):
  array = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
  image = preprocess.decode_rgb(_encode(array, "PNG"))
  assert image.shape == (20, 30, 3)
  rgb = np.asarray(Image.fromarray(array).convert("RGB"))  # Grey repeated, alpha dropped.
  np.testing.assert_array_equal(image.numpy(), rgb)


def test_augmentation_is_a_function_of_the_seed():
  data = _encode(NOISE, "JPEG")
  aug = lambda u: preprocess.train_image(
    data, _seed(u), crop=16, min_area=0.05, flip=True, randaug=None
  ).numpy()
  np.testing.assert_array_equal(aug(3), aug(3))
  assert not np.array_equal(aug(3), aug(4))


def test_jpeg_fused_crop_equals_decode_then_crop():
  data_jpeg = _encode(NOISE, "JPEG")
  window = preprocess.inception_crop_window(tf.constant([75, 100, 3]), _seed(5), 0.05)
  y, x, h, w = window.numpy()
  fused = preprocess.decode_inception_crop(data_jpeg, _seed(5), 0.05).numpy()
  whole = tf.io.decode_jpeg(data_jpeg, channels=3).numpy()[y : y + h, x : x + w]
  assert fused.shape == whole.shape
  # Same window; only chroma upsampling at the window's edge columns may differ.
  assert np.mean(np.abs(fused.astype(int) - whole)) < 1.0


def test_inception_crop_window_respects_area_and_aspect():
  shape = tf.constant([300, 400, 3])
  fractions = []
  for u in range(40):
    y, x, h, w = preprocess.inception_crop_window(shape, _seed(u), 0.2).numpy()
    assert 0 <= y and y + h <= 300 and 0 <= x and x + w <= 400
    area = h * w / (300 * 400)
    fractions.append(area)
    if area < 1.0:  # The whole image is the fallback when no proposal fits.
      assert area >= 0.2 * 0.95
      assert 0.75 * 0.95 <= w / h <= (4 / 3) * 1.05
  assert min(fractions) < 0.5  # The range is used, not only the full image.


def test_flip_off_keeps_orientation():
  ramp = np.tile(np.arange(0, 256, 8, dtype=np.uint8)[None, :, None], (32, 1, 3))
  data = _encode(ramp, "PNG")
  for u in range(6):  # With min_area=1 the crop is the whole image.
    out = preprocess.train_image(data, _seed(u), crop=32, min_area=1.0, flip=False, randaug=None)
    assert out.numpy()[0, 0, 0] < out.numpy()[0, -1, 0]


def test_one_hot():
  np.testing.assert_array_equal(
    preprocess.one_hot(tf.constant(2), 4).numpy(), np.array([0, 0, 1, 0], np.float32)
  )
