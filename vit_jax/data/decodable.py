"""`image_header.decodable` inside tf.data: an image file's bytes, checked before decoding.

JPEG and PNG (nearly every image of a training folder) are checked in the graph, from
the JPEG frame header (`tf.image.extract_jpeg_shape`) and the PNG ``IHDR``: a Python call
per image (`tf.numpy_function`) added about a quarter to the CPU time of decoding and
resizing a 256x256 JPEG. Every other format goes through `image_header.decodable` in
Python (a GIF is cut after its first frame there). What is refused becomes b"", which
fails to decode like any damaged file: an error raised in the graph would be logged
with its Python traceback. `refusal` gives the reason, for the one error that names the
file.
"""

from __future__ import annotations

import tensorflow as tf

from vit_jax.data import image_header

_PNG = b"\x89PNG\r\n\x1a\n"


def refusal(data: bytes) -> str:
  """Why `image_header.decodable` refuses ``data``; "" when it does not."""
  try:
    image_header.decodable(data)
  except ValueError as e:
    return str(e)
  return ""


@tf.autograph.experimental.do_not_convert
def _checked_bytes(data: tf.Tensor) -> tf.Tensor:
  """`image_header.decodable` of ``data`` (an eager tensor: a numpy string would drop the
  file's trailing zero bytes), or b"" when it refuses it."""
  try:
    return tf.constant(image_header.decodable(data.numpy()))
  except ValueError:
    return tf.constant(b"")


def _within_bound(data: tf.Tensor, height: tf.Tensor, width: tf.Tensor) -> tf.Tensor:
  decoded = tf.cast(height, tf.int64) * tf.cast(width, tf.int64) * 3
  return tf.where(decoded <= image_header.MAX_DECODED_BYTES, data, tf.constant(b""))


def _jpeg(data: tf.Tensor) -> tf.Tensor:
  shape = tf.image.extract_jpeg_shape(data, output_type=tf.int64)
  return _within_bound(data, shape[0], shape[1])


def _png(data: tf.Tensor, header: tf.Tensor) -> tf.Tensor:
  ihdr = tf.cast(tf.io.decode_raw(tf.strings.substr(header, 16, 8), tf.uint8), tf.int64)
  big_endian = tf.constant([2**24, 2**16, 2**8, 1], tf.int64)
  width, height = tf.unstack(tf.reduce_sum(tf.reshape(ihdr, [2, 4]) * big_endian, axis=1))
  return _within_bound(data, height, width)


def _other(data: tf.Tensor) -> tf.Tensor:
  return tf.ensure_shape(tf.py_function(_checked_bytes, [data], tf.string), [])


def decodable(data: tf.Tensor) -> tf.Tensor:
  """An image file's bytes (scalar string) ready to decode: unchanged, a GIF cut after its
  first frame, or b"" when `image_header.decodable` refuses it."""
  header = tf.strings.join([tf.strings.substr(data, 0, 24), b"\0" * 24])  # 24 bytes at least
  is_png = tf.logical_and(
    tf.strings.substr(header, 0, 8) == _PNG, tf.strings.substr(header, 12, 4) == b"IHDR"
  )
  is_png = tf.logical_and(is_png, tf.strings.length(data) >= 24)
  return tf.case(
    [(tf.io.is_jpeg(data), lambda: _jpeg(data)), (is_png, lambda: _png(data, header))],
    default=lambda: _other(data),
  )
