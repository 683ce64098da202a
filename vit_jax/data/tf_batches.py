"""The tf.data stage of the input pipeline: a reader's chunks -> preprocessed numpy batches
(`config.input_pipeline='tf'`; TensorFlow's decoders and `preprocess`'s graph ops).

tf.data pulls a reader's chunks through `from_generator`, decodes and preprocesses every
example on all cores in order (`preprocess.train_image` / `eval_image`), drops those whose
image fails (`ignore_errors`: `pipeline._realign` finds their positions and
`Stage.reason` recovers the decoder's message), and batches.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import tensorflow as tf

from vit_jax.data import decodable, preprocess, readers
from vit_jax.data.dataset import Settings


def _options() -> tf.data.Options:
  """No autotuning thread: deleting an iterator waits for that thread to wake up, which
  held the end of a run for 2-14 s (closing the train iterator). Without it the map still
  runs on every core (AUTOTUNE then means the core count) and prefetch still grows its
  buffer by itself."""
  options = tf.data.Options()
  options.autotune.enabled = False
  return options


_OPTIONS = _options()
_SPEC = (
  tf.TensorSpec([None], tf.int64),
  tf.TensorSpec([None], tf.int64),
  tf.TensorSpec([None], tf.string),
  tf.TensorSpec([None], tf.int64),
  tf.TensorSpec([None], tf.string),
)


class Stage:
  """Preprocessing of one split's examples in tf.data: train (crop, flip) or eval."""

  def __init__(self, settings: Settings, kind: str, num_classes: int, train: bool):
    self._kind = kind
    self._fn = _example_fn(settings, kind, num_classes, train)

  def batches(self, reader: readers.Reader, local_batch: int) -> Callable[[], Iterator[tuple]]:
    """A function giving a fresh stream of (positions, images, labels, texts, uids)
    batches (failed images left out); the tf.data pipeline is built once."""
    ds = tf.data.Dataset.from_generator(reader, output_signature=_SPEC).prefetch(1).unbatch()
    ds = ds.map(self._fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.ignore_errors()  # Missing positions are found and reported by _realign.
    ds = ds.batch(local_batch).prefetch(tf.data.AUTOTUNE).with_options(_OPTIONS)
    return ds.as_numpy_iterator

  def reason(self, value: Any, uid: int, label: int) -> str:
    """Why the example (value, uid, label) fails, from the header check or the decoder."""
    try:
      if self._kind == "path":
        reason = decodable.refusal(tf.io.read_file(value).numpy())
        if reason:
          return reason
      # Run the same function again, eagerly, to recover the decoder's message.
      self._fn(
        tf.constant(0, tf.int64),
        tf.constant(uid, tf.int64),
        tf.constant(value),
        tf.constant(label, tf.int64),
        tf.constant(b""),
      )
    except (tf.errors.OpError, ValueError) as e:
      return getattr(e, "message", str(e)).strip().splitlines()[0]
    return "it failed inside the input pipeline"


def _example_fn(settings: Settings, kind: str, num_classes: int, train: bool):
  """(position, uid, value, label, text) -> (position, image [crop, crop, 3], label [K],
  text, uid); with RandAugment the train image is the crop's uint8 values, for the train
  step to augment and normalise (`preprocess.train_image`)."""
  seed = tf.constant(settings.seed, tf.int64)

  def fn(position, uid, value, label, text):
    data = decodable.decodable(tf.io.read_file(value)) if kind == "path" else value
    if train:
      image = preprocess.train_image(
        data,
        tf.stack([seed, uid]),
        crop=settings.crop,
        min_area=settings.min_area,
        flip=settings.flip,
        randaug=settings.randaug,
        mean=settings.input_mean,
        std=settings.input_std,
      )
    else:
      image = preprocess.eval_image(data, settings.eval_data_config())
    return position, image, preprocess.one_hot(label, num_classes), text, uid

  return fn
