"""RandAugment (Cubuk et al. 2020) as big_vision trains ViTs with it: TensorFlow ops on uint8.

big_vision's `randaug(layers, magnitude)` is a fork of tensorflow/tpu's `autoaugment.py`
(which needs the defunct `tensorflow_addons`); this module computes the same policy with
core TensorFlow ops, written anew:

  * each of `layers` rounds picks one of the 16 ops of `OPS` uniformly and applies it
    always (no probability of skipping, as in big_vision's RandAugment);
  * `magnitude` m (0..10, larger allowed) sets every op's strength on big_vision's scale
    (`_MAX_LEVEL` = 10): rotate 3m degrees, shear 0.03m, translate 10m pixels (absolute,
    as at big_vision's 224-pixel crops), cutout a square of half side int(4m) pixels,
    colour/contrast/brightness/sharpness factor 0.18m + 0.1, posterize to int(0.4m) bits,
    solarize-add int(11m); rotate, shear and translate take a random sign;
  * pixels uncovered by rotate, shear, translate and cutout are grey (128, 128, 128).

Two ops differ from big_vision on purpose (docs/architecture.md, "RandAugment"):

  * Contrast blends towards the mean of the grey image, as PIL's ImageEnhance.Contrast
    does; big_vision's blends towards sum(histogram) / 256 = H * W / 256 (196 at 224x224),
    whatever the image (big_vision issue #109).
  * Solarize inverts pixels >= 256 - int(25.6m): stronger with m, as every other op.
    big_vision's threshold int(25.6m) grows with m, and its uint8 comparison wraps it
    modulo 256, so m = 10 and 20 invert everything (as here) while m < 10 weakens as m
    grows and m = 15 inverts only pixels >= 128 (big_vision issue #110).

Every random choice comes from an explicit seed (int64 [2]) through stateless ops, so an
image's augmentation is a function of its seed alone (the pipeline keys it by run seed,
epoch and example). The single ops compute Pillow's equivalents (tests/test_randaug.py
compares each on photo-like images; rotate and shear may round a half-pixel tie the
other way).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import tensorflow as tf

_MAX_LEVEL = 10.0  # The magnitude at which each op reaches its reference strength.
_REPLACE = 128  # Grey for the pixels that geometric ops and cutout uncover.
_ROTATE_DEGREES = 30.0  # At magnitude 10.
_SHEAR = 0.3
_TRANSLATE_PIXELS = 100.0
_CUTOUT_HALF_SIZE = 40
_POSTERIZE_BITS = 4
_SOLARIZE_ADD = 110
_SOLARIZE_ADD_THRESHOLD = 128


# The single ops: uint8 [H, W, 3] -> uint8 [H, W, 3], each Pillow's equivalent.


def _blend(degenerate: tf.Tensor, image: tf.Tensor, factor: float) -> tf.Tensor:
  """PIL's Image.blend(degenerate, image, factor): d + factor * (i - d), clipped and
  truncated to uint8 (factor > 1 extrapolates away from `degenerate`)."""
  degenerate = tf.cast(degenerate, tf.float32)
  mixed = degenerate + factor * (tf.cast(image, tf.float32) - degenerate)
  return tf.cast(tf.clip_by_value(mixed, 0.0, 255.0), tf.uint8)


def _grey(image: tf.Tensor) -> tf.Tensor:
  """uint8 [H, W, 3] -> float32 [H, W, 1]: PIL's convert('L'), ITU-R 601-2 luma in 16-bit
  fixed point, rounded down after adding 1/2. Exact in float32: every partial sum is an
  integer below 2**24."""
  x = tf.cast(image, tf.float32)
  luma = x[..., 0:1] * 19595.0 + x[..., 1:2] * 38470.0 + x[..., 2:3] * 7471.0
  return tf.math.floor((luma + 32768.0) / 65536.0)


def _histograms(image: tf.Tensor) -> tf.Tensor:
  """uint8 [H, W, 3] -> int32 [3, 256]: the pixel count of each value, per channel."""
  pixels = tf.cast(image, tf.int32)
  return tf.stack([tf.histogram_fixed_width(pixels[..., c], [0, 255], nbins=256) for c in range(3)])


def _apply_luts(image: tf.Tensor, luts: tf.Tensor) -> tf.Tensor:
  """uint8 [H, W, 3], int [3, 256] lookup tables (clipped to 0..255) -> uint8 [H, W, 3]."""
  luts = tf.cast(tf.clip_by_value(luts, 0, 255), tf.uint8)
  flat = tf.reshape(luts, [-1])  # [768]: channel c's table at c * 256.
  return tf.gather(flat, tf.cast(image, tf.int32) + tf.range(3) * 256)


def autocontrast(image: tf.Tensor) -> tf.Tensor:
  """PIL's ImageOps.autocontrast: each channel stretched so its min is 0 and max 255."""
  lo = tf.cast(tf.reduce_min(image, axis=[0, 1]), tf.float64)  # [3]
  hi = tf.cast(tf.reduce_max(image, axis=[0, 1]), tf.float64)
  # PIL's formula in float64, x * scale + offset truncated: the same values to the last
  # truncation. A flat channel keeps its values (scale 1, offset 0).
  scale = tf.where(hi > lo, 255.0 / tf.maximum(hi - lo, 1.0), 1.0)
  offset = tf.where(hi > lo, -lo * scale, 0.0)
  stretched = tf.cast(image, tf.float64) * scale + offset
  return tf.cast(tf.clip_by_value(stretched, 0.0, 255.0), tf.uint8)


def equalize(image: tf.Tensor) -> tf.Tensor:
  """PIL's ImageOps.equalize: each channel's histogram spread evenly over 0..255."""
  counts = _histograms(image)  # [3, 256]
  last = tf.reduce_max(tf.where(counts > 0, tf.range(256), -1), axis=1)  # highest value
  last_count = tf.gather(counts, last, batch_dims=1)
  step = (tf.reduce_sum(counts, axis=1) - last_count) // 255  # [3]
  safe = tf.maximum(step, 1)[:, None]
  below = tf.cumsum(counts, axis=1, exclusive=True)  # pixels below each value
  table = (safe // 2 + below) // safe
  identity = tf.range(256)[None, :]
  return _apply_luts(image, tf.where((step > 0)[:, None], table, identity))


def invert(image: tf.Tensor) -> tf.Tensor:
  """PIL's ImageOps.invert: 255 - x."""
  return 255 - image


def posterize(image: tf.Tensor, bits: int) -> tf.Tensor:
  """PIL's ImageOps.posterize: keep the `bits` high bits, 1..8. Fewer (magnitude < 2.5)
  keep 1, as big_vision's shift by 8 does (TensorFlow clamps uint8 shifts to 7 bits);
  more (magnitude >= 20) keep all 8."""
  shift = 8 - min(max(bits, 1), 8)
  return tf.bitwise.left_shift(tf.bitwise.right_shift(image, shift), shift)


def solarize(image: tf.Tensor, threshold: int) -> tf.Tensor:
  """PIL's ImageOps.solarize: invert the pixels >= threshold (256: none, 0: all)."""
  if threshold >= 256:
    return image
  flip = tf.cast(image >= max(threshold, 0), tf.uint8)  # 1 where inverted
  return image + flip * (255 - 2 * image)  # uint8 arithmetic wraps: x + 255 - 2x = 255 - x


def solarize_add(image: tf.Tensor, addition: int, threshold: int) -> tf.Tensor:
  """Add `addition` to the pixels below `threshold`, clipped to 0..255 (big_vision's
  SolarizeAdd; no PIL op, timm's is a table of the same rule)."""
  pixels = tf.cast(image, tf.int32)
  below = tf.cast(pixels < threshold, tf.int32)
  return tf.cast(tf.clip_by_value(pixels + below * addition, 0, 255), tf.uint8)


def color(image: tf.Tensor, factor: float) -> tf.Tensor:
  """PIL's ImageEnhance.Color: blend from the grey image (0) through the image (1)."""
  return _blend(_grey(image), image, factor)  # the grey image broadcast over channels


def contrast(image: tf.Tensor, factor: float) -> tf.Tensor:
  """PIL's ImageEnhance.Contrast: blend from a flat image of the grey image's mean,
  rounded (0) through the image (1)."""
  mean = tf.math.floor(tf.reduce_mean(tf.cast(_grey(image), tf.float64)) + 0.5)
  return _blend(tf.cast(mean, tf.float32), image, factor)


def brightness(image: tf.Tensor, factor: float) -> tf.Tensor:
  """PIL's ImageEnhance.Brightness: blend from black (0) through the image (1), i.e. the
  image times `factor`, clipped and truncated."""
  return tf.cast(tf.clip_by_value(factor * tf.cast(image, tf.float32), 0.0, 255.0), tf.uint8)


def sharpness(image: tf.Tensor, factor: float) -> tf.Tensor:
  """PIL's ImageEnhance.Sharpness: blend from the image smoothed by PIL's SMOOTH filter
  (3x3, centre 5, others 1, / 13, rounded; border pixels kept) (0) through the image (1)."""
  if image.shape[0] is not None and min(image.shape[0], image.shape[1]) < 3:
    return image  # Only border pixels: nothing is smoothed.
  x = tf.cast(image, tf.float32)
  rows = x[:, :-2] + x[:, 1:-1] + x[:, 2:]  # [H, W-2, 3] sums of 3 horizontal neighbours
  box = rows[:-2] + rows[1:-1] + rows[2:]  # [H-2, W-2, 3] 3x3 sums, exact in float32
  smooth = tf.round((box + 4.0 * x[1:-1, 1:-1]) / 13.0)  # never a tie: 13 is odd
  middle = tf.concat([x[1:-1, :1], smooth, x[1:-1, -1:]], axis=1)
  return _blend(tf.concat([x[:1], middle, x[-1:]], axis=0), image, factor)


def _affine(image: tf.Tensor, matrix: list) -> tf.Tensor:
  """Output pixel (x, y) takes input pixel floor(a x + b y + c + 1/2, d x + e y + f + 1/2)
  (pixel indices: the nearest, halves rounded up as PIL does), or grey outside the image;
  matrix = [a, b, c, d, e, f].

  One gather of whole pixels by computed indices: 2-3x cheaper than TensorFlow's
  ImageProjectiveTransformV3 (nearest), which maps each channel of each pixel anew.
  """
  shape = tf.shape(image)
  height, width = shape[0], shape[1]
  a, b, c, d, e, f = [tf.cast(v, tf.float32) for v in matrix]
  xs = tf.range(tf.cast(width, tf.float32))[None, :]  # [1, W]
  ys = tf.range(tf.cast(height, tf.float32))[:, None]  # [H, 1]
  source_x = tf.cast(tf.math.floor(a * xs + b * ys + (c + 0.5)), tf.int32)  # [H, W]
  source_y = tf.cast(tf.math.floor(d * xs + e * ys + (f + 0.5)), tf.int32)
  inside = (source_x >= 0) & (source_x < width) & (source_y >= 0) & (source_y < height)
  index = tf.where(inside, source_y * width + source_x, height * width)  # else the grey pixel
  grey = tf.fill([1, 3], tf.constant(_REPLACE, tf.uint8))
  pixels = tf.concat([tf.reshape(image, [-1, 3]), grey], axis=0)  # [H * W + 1, 3]
  out = tf.reshape(tf.gather(pixels, index), shape)
  out.set_shape(image.shape)
  return out


def rotate(image: tf.Tensor, degrees: float | tf.Tensor) -> tf.Tensor:
  """PIL's Image.rotate(degrees) (counter-clockwise about the image centre, nearest
  pixel), uncovered pixels grey."""
  radians = tf.cast(degrees, tf.float32) * (math.pi / 180.0)
  cos, sin = tf.cos(radians), tf.sin(radians)
  shape = tf.cast(tf.shape(image), tf.float32)
  cx, cy = (shape[1] - 1.0) / 2.0, (shape[0] - 1.0) / 2.0  # the centre, in pixel indices
  return _affine(image, [cos, -sin, cx - cos * cx + sin * cy, sin, cos, cy - sin * cx - cos * cy])


def shear_x(image: tf.Tensor, level: float | tf.Tensor) -> tf.Tensor:
  """Output (x, y) takes input (x + level * y, y): rows shifted in proportion to their
  index (pixel indices from the top-left pixel, as big_vision)."""
  return _affine(image, [1.0, level, 0.0, 0.0, 1.0, 0.0])


def shear_y(image: tf.Tensor, level: float | tf.Tensor) -> tf.Tensor:
  """Output (x, y) takes input (x, level * x + y)."""
  return _affine(image, [1.0, 0.0, 0.0, level, 1.0, 0.0])


def _shift(image: tf.Tensor, pixels: float | tf.Tensor, axis: int) -> tf.Tensor:
  """Output index i takes input index i + round(pixels) along `axis` (0: rows, 1:
  columns), grey beyond the edges: a nearest-pixel translation, done by slicing."""
  size = tf.shape(image)[axis]
  shift = tf.cast(tf.math.floor(tf.cast(pixels, tf.float32) + 0.5), tf.int32)
  begin, end = tf.clip_by_value(shift, 0, size), tf.clip_by_value(size + shift, 0, size)
  kept = image[begin:end] if axis == 0 else image[:, begin:end]
  padding = [[0, 0], [0, 0], [0, 0]]
  padding[axis] = [tf.clip_by_value(-shift, 0, size), tf.clip_by_value(shift, 0, size)]
  out = tf.pad(kept, padding, constant_values=_REPLACE)
  out.set_shape(image.shape)
  return out


def translate_x(image: tf.Tensor, pixels: float | tf.Tensor) -> tf.Tensor:
  """Output (x, y) takes input (x + pixels, y): the content moves left by `pixels`."""
  return _shift(image, pixels, axis=1)


def translate_y(image: tf.Tensor, pixels: float | tf.Tensor) -> tf.Tensor:
  """Output (x, y) takes input (x, y + pixels): the content moves up by `pixels`."""
  return _shift(image, pixels, axis=0)


def cutout(image: tf.Tensor, half_size: int, seed: tf.Tensor) -> tf.Tensor:
  """Grey square of side 2 * half_size, cut by the image's edges, centred on a pixel
  drawn uniformly from the image (big_vision's Cutout)."""
  height, width = tf.shape(image)[0], tf.shape(image)[1]
  y_seed, x_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
  cy = tf.random.stateless_uniform([], y_seed, maxval=height, dtype=tf.int32)
  cx = tf.random.stateless_uniform([], x_seed, maxval=width, dtype=tf.int32)
  y0, y1 = tf.maximum(cy - half_size, 0), tf.minimum(cy + half_size, height)
  x0, x1 = tf.maximum(cx - half_size, 0), tf.minimum(cx + half_size, width)
  grey = tf.fill(tf.stack([y1 - y0, x1 - x0, 3]), tf.constant(_REPLACE, tf.uint8))
  band = tf.concat([image[y0:y1, :x0], grey, image[y0:y1, x1:]], axis=1)  # rows y0..y1-1
  out = tf.concat([image[:y0], band, image[y1:]], axis=0)
  out.set_shape(image.shape)
  return out


# The policy: magnitude -> each op's argument (big_vision's scale), random op per layer.


def _signed(value: float, seed: tf.Tensor) -> tf.Tensor:
  """`value` or `-value`, each with probability 1/2."""
  negate = tf.random.stateless_uniform([], seed) < 0.5
  return tf.where(negate, -value, value)


def _enhance_factor(m: float) -> float:
  return m / _MAX_LEVEL * 1.8 + 0.1


@dataclasses.dataclass(frozen=True)
class Op:
  """One RandAugment op: name (big_vision's) and (image, magnitude, seed) -> image."""

  name: str
  apply: Callable[[tf.Tensor, float, tf.Tensor], tf.Tensor]


# big_vision's list, in its order (the order decides which op a random index picks).
OPS = (
  Op("AutoContrast", lambda x, m, s: autocontrast(x)),
  Op("Equalize", lambda x, m, s: equalize(x)),
  Op("Invert", lambda x, m, s: invert(x)),
  Op("Rotate", lambda x, m, s: rotate(x, _signed(m / _MAX_LEVEL * _ROTATE_DEGREES, s))),
  Op("Posterize", lambda x, m, s: posterize(x, int(m / _MAX_LEVEL * _POSTERIZE_BITS))),
  Op("Solarize", lambda x, m, s: solarize(x, max(0, 256 - int(m / _MAX_LEVEL * 256)))),
  Op("Color", lambda x, m, s: color(x, _enhance_factor(m))),
  Op("Contrast", lambda x, m, s: contrast(x, _enhance_factor(m))),
  Op("Brightness", lambda x, m, s: brightness(x, _enhance_factor(m))),
  Op("Sharpness", lambda x, m, s: sharpness(x, _enhance_factor(m))),
  Op("ShearX", lambda x, m, s: shear_x(x, _signed(m / _MAX_LEVEL * _SHEAR, s))),
  Op("ShearY", lambda x, m, s: shear_y(x, _signed(m / _MAX_LEVEL * _SHEAR, s))),
  Op("TranslateX", lambda x, m, s: translate_x(x, _signed(m / _MAX_LEVEL * _TRANSLATE_PIXELS, s))),
  Op("TranslateY", lambda x, m, s: translate_y(x, _signed(m / _MAX_LEVEL * _TRANSLATE_PIXELS, s))),
  Op("Cutout", lambda x, m, s: cutout(x, int(m / _MAX_LEVEL * _CUTOUT_HALF_SIZE), s)),
  Op(
    "SolarizeAdd",
    lambda x, m, s: solarize_add(x, int(m / _MAX_LEVEL * _SOLARIZE_ADD), _SOLARIZE_ADD_THRESHOLD),
  ),
)


def choices(seed: tf.Tensor, layers: int) -> tuple[tf.Tensor, tf.Tensor]:
  """The ops of an image's rounds: (int32 [layers] indices into OPS, int64 [layers, 2]
  seeds of their random arguments), all from `seed` (int64 [2])."""
  pick, argument = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
  indices = tf.random.stateless_uniform([layers], pick, maxval=len(OPS), dtype=tf.int32)
  return indices, tf.random.experimental.stateless_split(argument, num=layers)


def _branches(magnitude: float) -> list:
  """Each op of OPS at `magnitude` as a concrete function of (image, seed)."""
  specs = (tf.TensorSpec([None, None, 3], tf.uint8), tf.TensorSpec([2], tf.int64))
  return [
    tf.function(
      lambda x, s, op=op: op.apply(x, magnitude, s), autograph=False
    ).get_concrete_function(*specs)
    for op in OPS
  ]


def randaugment(image: tf.Tensor, seed: tf.Tensor, layers: int, magnitude: float) -> tf.Tensor:
  """uint8 [H, W, 3] -> uint8 [H, W, 3]: `layers` ops drawn from OPS, each at `magnitude`.

  seed: int64 [2]; the image's augmentation is a function of it alone. Each layer is one
  `Case` op over the 16 ops, made directly: `tf.switch_case` marks its Case for lowering
  to Switch/Merge, and the lowered graph walks every branch's nodes (dead) on each call,
  ~0.75 CPU ms per layer at 224 px against ~0.15 for the unlowered call.
  """
  if layers <= 0:
    return image
  shape = image.shape
  indices, arguments = choices(seed, layers)
  branches = _branches(float(magnitude))
  for k in range(layers):
    (image,) = tf.raw_ops.Case(
      branch_index=indices[k], input=[image, arguments[k]], Tout=[tf.uint8], branches=branches
    )
    image.set_shape(shape)
  return image
