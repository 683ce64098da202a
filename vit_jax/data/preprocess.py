"""Per-example image preprocessing: pure TensorFlow functions, no tfds, no files.

Every function maps tensors to tensors and is usable inside `tf.data.Dataset.map`.
Randomness comes only from stateless ops keyed by an explicit seed (int64 [2]); the
pipeline derives it from (config.seed, epoch, example index), so the same example in
the same epoch always gets the same crop and flip, whatever the batch size or the step
the run was resumed at. (RandAugment runs in the train step: data/randaug.py.)

The eval transform of files, bytes, PIL images and arrays is `host_images.prepare`
(without TensorFlow; its PIL half, timm's transform, is `vit_jax.data.eval_images`);
`eval_image` is the same inside a `tf.data` pipeline.

Output convention (shared with the official checkpoints): float32 [crop, crop, 3] with
values (x - 127.5) / 127.5, clipped so they lie within [-1, 1] exactly. Weights trained
with another normalisation (timm's ImageNet or CLIP mean/std; the model config's
``input_mean``/``input_std``) get (x / 255 - mean) / std per channel instead.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from vit_jax import errors
from vit_jax.data import eval_images
from vit_jax.data.data_config import DataConfig
from vit_jax.image_constants import OFFICIAL_INPUT_MEAN, OFFICIAL_INPUT_STD

# Aspect ratios (width / height) of the inception crop, as in Szegedy et al. (2015).
CROP_ASPECT_RANGE = (3.0 / 4.0, 4.0 / 3.0)
RGB = tuple[float, float, float]
_CROP_ATTEMPTS = 10  # Proposals tried before the crop falls back to the whole image.


def decode_rgb(data: tf.Tensor) -> tf.Tensor:
  """Encoded JPEG/PNG/GIF/BMP bytes (scalar string) -> uint8 [H, W, 3].

  Grey images are repeated on three channels; an alpha channel is dropped.
  """
  image = tf.io.decode_image(data, channels=3, expand_animations=False)
  image.set_shape([None, None, 3])
  return image


def inception_crop_window(image_shape: tf.Tensor, seed: tf.Tensor, min_area: float) -> tf.Tensor:
  """A random crop window [y, x, h, w] (int32 [4]) for an image of shape [H, W, C].

  The window covers `min_area`..100% of the image area with aspect ratio in
  CROP_ASPECT_RANGE; when no proposal fits it is the whole image.
  """
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
    image_shape,
    bounding_boxes=tf.zeros([0, 0, 4], tf.float32),
    seed=seed,
    min_object_covered=0.0,
    aspect_ratio_range=CROP_ASPECT_RANGE,
    area_range=(min_area, 1.0),
    max_attempts=_CROP_ATTEMPTS,
    use_image_if_no_bounding_boxes=True,
  )
  return tf.stack([begin[0], begin[1], size[0], size[1]])


def decode_inception_crop(data: tf.Tensor, seed: tf.Tensor, min_area: float) -> tf.Tensor:
  """Encoded bytes -> uint8 [h, w, 3], a random inception crop of the image.

  JPEGs are cropped while decoding (only the window's blocks are decoded, the main
  cost of the train pipeline); other formats are decoded whole, then cropped.
  """

  def jpeg() -> tf.Tensor:
    window = inception_crop_window(tf.image.extract_jpeg_shape(data), seed, min_area)
    return tf.image.decode_and_crop_jpeg(data, window, channels=3)

  def other() -> tf.Tensor:
    image = decode_rgb(data)
    y, x, h, w = tf.unstack(inception_crop_window(tf.shape(image), seed, min_area))
    return image[y : y + h, x : x + w]

  image = tf.cond(tf.io.is_jpeg(data), jpeg, other)
  image.set_shape([None, None, 3])
  return image


def resize(image: tf.Tensor, crop: int) -> tf.Tensor:
  """uint8 [H, W, 3] -> float32 [crop, crop, 3], about 0..255 (bilinear; aspect not kept).

  Float round-off may step a hair outside 0..255; normalize() clips.
  """
  return tf.image.resize(image, [crop, crop], method="bilinear")


def normalize(
  image: tf.Tensor, mean: RGB = OFFICIAL_INPUT_MEAN, std: RGB = OFFICIAL_INPUT_STD
) -> tf.Tensor:
  """float32 in 0..255 -> (x - 127.5) / 127.5, clipped to [-1, 1] exactly; with another
  ``mean``/``std`` (per RGB channel, 0..1 scale) -> (x / 255 - mean) / std."""
  if tuple(mean) == OFFICIAL_INPUT_MEAN and tuple(std) == OFFICIAL_INPUT_STD:
    image = (tf.cast(image, tf.float32) - 127.5) / 127.5
    return tf.clip_by_value(image, -1.0, 1.0)
  scaled = tf.cast(image, tf.float32) / 255.0
  return (scaled - tf.constant(mean, tf.float32)) / tf.constant(std, tf.float32)


def train_crop(
  data: tf.Tensor, seed: tf.Tensor, *, crop: int, min_area: float, flip: bool
) -> tf.Tensor:
  """Encoded bytes -> float32 [crop, crop, 3] about 0..255, before normalisation.

  Inception crop (area min_area..1, aspect 3/4..4/3), optional horizontal flip, bilinear
  resize to `crop`. `seed`: int64 [2]; the crop and the flip use independent seeds
  derived from it.
  """
  crop_seed, flip_seed = tf.unstack(
    tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=2)
  )
  image = decode_inception_crop(data, crop_seed, min_area)  # [h, w, 3]
  if flip:
    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
  return resize(image, crop)  # [crop, crop, 3] float32


def train_image(
  data: tf.Tensor,
  seed: tf.Tensor,
  *,
  randaug: tuple[int, float] | None,
  mean: RGB = OFFICIAL_INPUT_MEAN,
  std: RGB = OFFICIAL_INPUT_STD,
  **crop_options,
) -> tf.Tensor:
  """Encoded bytes -> float32 [crop, crop, 3], randomly cropped and flipped (train_crop,
  `crop_options`: its crop, min_area and flip), normalised (`normalize`).

  With `randaug` (config.pp.randaug) the crop rounded to its uint8 values instead, not
  normalised: the train step applies RandAugment to them and normalises on the device
  (`randaug.make_augmenter`), as big_vision's `inception_crop | flip_lr | randaug`.
  """
  image = train_crop(data, seed, **crop_options)
  if randaug is None:
    return normalize(image, mean, std)
  return tf.clip_by_value(tf.round(image), 0.0, 255.0)


def eval_image(data: tf.Tensor, data_config: DataConfig) -> tf.Tensor:
  """Encoded bytes -> float32 [H, W, 3] as ``data_config`` says: with the official
  recipe (resizer 'tf') the whole image resized by TensorFlow and normalised; otherwise
  `eval_images.prepare_pil` (PIL, timm's crop) run on the bytes from the graph."""
  if data_config.resizer == "tf":
    return resize_normalize(decode_rgb(data), data_config)

  def pil_prepare(encoded: bytes) -> np.ndarray:
    return eval_images.prepare_pil([encoded], data_config)[0]

  image = tf.numpy_function(pil_prepare, [data], tf.float32, stateful=False)
  image.set_shape([*data_config.input_size, 3])
  return image


def official(item: eval_images.ImageLike, data_config: DataConfig) -> np.ndarray:
  """One image as the official recipe prepares it, by TensorFlow: float32 [H, W, 3]
  (`host_images.prepare` for the 'tf' resize methods other than bilinear)."""
  if isinstance(item, (str, os.PathLike)):
    with open(item, "rb") as f:
      item = f.read()
  try:
    image = decode_rgb(tf.constant(item)) if isinstance(item, bytes) else None
  except tf.errors.OpError as e:
    why = e.message.splitlines()[0]
    raise errors.InputFileError(f"not an image TensorFlow decodes ({why}).") from None
  if image is None:  # pixels: an array or a PIL image
    image = tf.constant(np.asarray(eval_images.to_pil(item)))
  return resize_normalize(image, data_config).numpy()  # [H, W, 3]


def resize_normalize(image: tf.Tensor, data_config: DataConfig) -> tf.Tensor:
  """uint8 [h, w, 3] -> float32 [H, W, 3]: the whole image resized by TensorFlow (no
  antialiasing, big_vision's ``resize``) with the config's interpolation, normalised."""
  resized = tf.image.resize(image, data_config.input_size, method=data_config.interpolation)
  return normalize(resized, data_config.mean, data_config.std)


def one_hot(label: tf.Tensor, num_classes: int) -> tf.Tensor:
  """int label -> float32 [num_classes]."""
  return tf.one_hot(label, num_classes, dtype=tf.float32)
