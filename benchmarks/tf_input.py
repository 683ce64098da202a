"""The benchmarks' own tf.data input pipeline: what a user writes with tf.data, the
comparison row "tf.data" beside the package's decoding stage.

Train, per JPEG: an inception crop window (`tf.image.stateless_sample_distorted_bounding_box`,
area (min_area, 1), aspect 3/4..4/3, the whole image when no proposal fits), decoding only
that window (`decode_and_crop_jpeg`), a random horizontal flip, a bilinear resize to the
crop (no antialiasing), normalised to [-1, 1]. The crop and flip are stateless, seeded by
(seed, the example's index in the stream). Eval: the whole image decoded, resized bilinear
to the crop, normalised. The same work as big_vision's `decode_jpeg_and_inception_crop |
flip_lr` and `decode | resize` preprocessing; JPEG input only (the benchmarks write JPEGs).
"""

from __future__ import annotations

import tensorflow as tf

CROP_ASPECT_RANGE = (3.0 / 4.0, 4.0 / 3.0)  # width / height, Szegedy et al. (2015)
_CROP_ATTEMPTS = 10


def normalize(image: tf.Tensor) -> tf.Tensor:
  """float32 0..255 -> (x - 127.5) / 127.5 within [-1, 1]."""
  return tf.clip_by_value((tf.cast(image, tf.float32) - 127.5) / 127.5, -1.0, 1.0)


def train_image(data: tf.Tensor, seed: tf.Tensor, crop: int, min_area: float, flip: bool):
  """JPEG bytes, int64 seed [2] -> float32 [crop, crop, 3] in [-1, 1]."""
  crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
    tf.image.extract_jpeg_shape(data),
    bounding_boxes=tf.zeros([0, 0, 4], tf.float32),
    seed=crop_seed,
    min_object_covered=0.0,
    aspect_ratio_range=CROP_ASPECT_RANGE,
    area_range=(min_area, 1.0),
    max_attempts=_CROP_ATTEMPTS,
    use_image_if_no_bounding_boxes=True,
  )
  window = tf.stack([begin[0], begin[1], size[0], size[1]])
  image = tf.image.decode_and_crop_jpeg(data, window, channels=3)  # [h, w, 3]
  if flip:
    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
  return normalize(tf.image.resize(image, [crop, crop], method="bilinear"))


def eval_image(data: tf.Tensor, crop: int) -> tf.Tensor:
  """JPEG bytes -> float32 [crop, crop, 3] in [-1, 1]: the whole image, resized."""
  image = tf.io.decode_jpeg(data, channels=3)
  return normalize(tf.image.resize(image, [crop, crop], method="bilinear"))


def train_batches(
  paths: list[str],
  labels: list[int],
  num_classes: int,
  batch: int,
  *,
  crop: int = 224,
  min_area: float = 0.05,
  flip: bool = True,
  seed: int = 0,
) -> tf.data.Dataset:
  """Endless (images [batch, crop, crop, 3], one-hot labels [batch, K]) batches of the
  files, reshuffled each epoch; the map runs on every core, in order."""
  seed_ = tf.constant(seed, tf.int64)

  def example(index, path_label):
    path, label = path_label
    image = train_image(tf.io.read_file(path), tf.stack([seed_, index]), crop, min_area, flip)
    return image, tf.one_hot(label, num_classes)

  ds = tf.data.Dataset.from_tensor_slices((paths, labels))
  ds = ds.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True).repeat().enumerate()
  ds = ds.map(example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return ds.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def eval_batches(
  paths: list[str], labels: list[int], num_classes: int, batch: int, *, crop: int = 224
) -> tf.data.Dataset:
  """One pass of (images [b, crop, crop, 3], one-hot labels [b, K]) batches, in order."""

  def example(path, label):
    return eval_image(tf.io.read_file(path), crop), tf.one_hot(label, num_classes)

  ds = tf.data.Dataset.from_tensor_slices((paths, labels))
  ds = ds.map(example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return ds.batch(batch).prefetch(tf.data.AUTOTUNE)
