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
import functools
import math
from typing import Callable, NamedTuple

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


# The single ops: uint8 [H, W, 3] -> uint8 [H, W, 3], each Pillow's equivalent. Each is
# one pass or two over the pixels once XLA fuses it (`randaugment` compiles them): integer
# arithmetic where Pillow's is integer, selects instead of index gathers where an op moves
# no pixel, a gather of whole pixels only for rotate and shear.


def _split(value: tf.Tensor | float, dtype: tf.DType, low_bits: int) -> tuple:
  """value -> (high, low) of `dtype`, high + low == value exactly, high with the last
  `low_bits` bits of its mantissa zero: so high * n and low * n are exact for integers
  |n| < 2**low_bits (for low, when its own bits fit as well), and the product
  value * n = fl(high * n + low * n) is rounded once, in the sum.

  Why: XLA contracts a product followed by a sum into one fused multiply-add (one
  rounding where PIL and TensorFlow's kernels round twice), and a truncated result whose
  exact value lies within round-off of an integer then falls on the other side. With
  exact partial products a contraction changes nothing.
  """
  value = tf.cast(value, dtype)
  bits = {tf.float32: tf.int32, tf.float64: tf.int64}[dtype]
  mask = tf.constant(-(1 << low_bits), bits)  # ...111000 (two's complement)
  high = tf.bitcast(tf.bitwise.bitwise_and(tf.bitcast(value, bits), mask), dtype)
  return high, value - high  # the low part is exact: high is value truncated


def _times(value: tuple, n: tf.Tensor) -> tf.Tensor:
  """fl(value * n) from value's (high, low) split (_split), n integer-valued."""
  high, low = value
  return high * n + low * n


def _blend(degenerate: tf.Tensor, image: tf.Tensor, factor: float) -> tf.Tensor:
  """PIL's Image.blend(degenerate, image, factor): d + factor * (i - d), clipped and
  truncated to uint8 (factor > 1 extrapolates away from `degenerate`); the product
  rounded before the sum, as PIL (_split: i - d is an integer, |i - d| < 2**9)."""
  degenerate = tf.cast(degenerate, tf.float32)
  difference = tf.cast(image, tf.float32) - degenerate
  mixed = degenerate + _times(_split(factor, tf.float32, 10), difference)
  return tf.cast(tf.clip_by_value(mixed, 0.0, 255.0), tf.uint8)


def _grey(image: tf.Tensor) -> tf.Tensor:
  """uint8 [H, W, 3] -> int32 [H, W, 1]: PIL's convert('L'), ITU-R 601-2 luma in 16-bit
  fixed point, rounded down after adding 1/2 (below 2**31: 255 * 65536 + 32768)."""
  x = tf.cast(image, tf.int32)
  luma = x[..., 0:1] * 19595 + x[..., 1:2] * 38470 + x[..., 2:3] * 7471
  return tf.bitwise.right_shift(luma + 32768, 16)


def _histograms(image: tf.Tensor) -> tf.Tensor:
  """uint8 [H, W, 3] -> int32 [3, 256]: the pixel count of each value, per channel."""
  index = tf.reshape(tf.cast(image, tf.int32) + tf.range(3) * 256, [-1])  # [H * W * 3]
  return tf.reshape(tf.math.unsorted_segment_sum(tf.ones_like(index), index, 768), [3, 256])


def _apply_luts(image: tf.Tensor, luts: tf.Tensor) -> tf.Tensor:
  """uint8 [H, W, 3], int [3, 256] lookup tables (clipped to 0..255) -> uint8 [H, W, 3]."""
  luts = tf.cast(tf.clip_by_value(luts, 0, 255), tf.uint8)
  flat = tf.reshape(luts, [-1])  # [768]: channel c's table at c * 256.
  return tf.gather(flat, tf.cast(image, tf.int32) + tf.range(3) * 256)


def _grey_fill(mask: tf.Tensor, image: tf.Tensor) -> tf.Tensor:
  """Grey (_REPLACE) where bool `mask` (broadcast to [H, W, 3]), else the image."""
  return tf.where(mask, tf.constant(_REPLACE, tf.uint8), image)


def autocontrast(image: tf.Tensor) -> tf.Tensor:
  """PIL's ImageOps.autocontrast: each channel stretched so its min is 0 and max 255."""
  pixels = tf.reshape(image, [-1, 3])
  lo = tf.cast(tf.reduce_min(pixels, axis=0), tf.float64)  # [3]
  hi = tf.cast(tf.reduce_max(pixels, axis=0), tf.float64)
  # PIL's formula in float64, x * scale + offset truncated, each product rounded before
  # the sum (_split): the same values to the last truncation. A flat channel keeps its
  # values (scale 1, offset 0).
  scale = _split(tf.where(hi > lo, 255.0 / tf.maximum(hi - lo, 1.0), 1.0), tf.float64, 9)
  offset = tf.where(hi > lo, -_times(scale, lo), 0.0)
  stretched = _times(scale, tf.cast(image, tf.float64)) + offset
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
  return tf.bitwise.bitwise_and(image, tf.constant((0xFF << shift) & 0xFF, tf.uint8))


def solarize(image: tf.Tensor, threshold: int) -> tf.Tensor:
  """PIL's ImageOps.solarize: invert the pixels >= threshold (256: none, 0: all)."""
  if threshold >= 256:
    return image
  return tf.where(image >= max(threshold, 0), 255 - image, image)


def solarize_add(image: tf.Tensor, addition: int, threshold: int) -> tf.Tensor:
  """Add `addition` to the pixels below `threshold`, clipped to 0..255 (big_vision's
  SolarizeAdd; no PIL op, timm's is a table of the same rule)."""
  pixels = tf.cast(image, tf.int32)
  added = tf.cast(tf.clip_by_value(pixels + addition, 0, 255), tf.uint8)
  return tf.where(pixels < threshold, added, image)


def color(image: tf.Tensor, factor: float) -> tf.Tensor:
  """PIL's ImageEnhance.Color: blend from the grey image (0) through the image (1)."""
  return _blend(_grey(image), image, factor)  # the grey image broadcast over channels


def contrast(image: tf.Tensor, factor: float) -> tf.Tensor:
  """PIL's ImageEnhance.Contrast: blend from a flat image of the grey image's mean,
  rounded (0) through the image (1)."""
  total = tf.reduce_sum(tf.cast(_grey(image), tf.int64))
  count = tf.cast(tf.shape(image)[0] * tf.shape(image)[1], tf.int64)
  # floor(total / count + 1/2), PIL's int(mean + 0.5), in integers: exact.
  return _blend((2 * total + count) // (2 * count), image, factor)


def brightness(image: tf.Tensor, factor: float) -> tf.Tensor:
  """PIL's ImageEnhance.Brightness: blend from black (0) through the image (1), i.e. the
  image times `factor`, clipped and truncated."""
  return tf.cast(tf.clip_by_value(factor * tf.cast(image, tf.float32), 0.0, 255.0), tf.uint8)


def sharpness(image: tf.Tensor, factor: float) -> tf.Tensor:
  """PIL's ImageEnhance.Sharpness: blend from the image smoothed by PIL's SMOOTH filter
  (3x3, centre 5, others 1, / 13, rounded; border pixels kept) (0) through the image (1)."""
  x = tf.cast(image, tf.int32)
  height, width = tf.shape(image)[0], tf.shape(image)[1]
  padded = tf.pad(x, [[1, 1], [1, 1], [0, 0]])  # [H + 2, W + 2, 3]; the pad is never kept
  rows = padded[:, :-2] + padded[:, 1:-1] + padded[:, 2:]  # [H + 2, W, 3] sums of 3 across
  box = rows[:-2] + rows[1:-1] + rows[2:]  # [H, W, 3] 3x3 sums
  smooth = (box + 4 * x + 6) // 13  # rounded; never a tie: 13 is odd
  ys, xs = tf.range(height)[:, None, None], tf.range(width)[None, :, None]
  border = (ys == 0) | (ys == height - 1) | (xs == 0) | (xs == width - 1)
  return _blend(tf.where(border, x, smooth), image, factor)


def _affine(image: tf.Tensor, matrix: list) -> tf.Tensor:
  """Output pixel (x, y) takes input pixel floor(a x + b y + c + 1/2, d x + e y + f + 1/2)
  (pixel indices: the nearest, halves rounded up as PIL does), or grey outside the image;
  matrix = [a, b, c, d, e, f].

  One gather of whole pixels by computed indices: 2-3x cheaper than TensorFlow's
  ImageProjectiveTransformV3 (nearest), which maps each channel of each pixel anew.
  """
  shape = tf.shape(image)
  height, width = shape[0], shape[1]
  a, b, d, e = [_split(v, tf.float32, 12) for v in (matrix[0], matrix[1], matrix[3], matrix[4])]
  c, f = [tf.cast(v, tf.float32) for v in (matrix[2], matrix[5])]
  xs = tf.range(tf.cast(width, tf.float32))[None, :]  # [1, W]
  ys = tf.range(tf.cast(height, tf.float32))[:, None]  # [H, 1]
  # Products rounded before the sums (_split; exact for indices below 4096).
  source_x = tf.cast(tf.math.floor(_times(a, xs) + _times(b, ys) + (c + 0.5)), tf.int32)
  source_y = tf.cast(tf.math.floor(_times(d, xs) + _times(e, ys) + (f + 0.5)), tf.int32)
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
  # cos * cx etc. rounded before the sums (_split: 2 cx and 2 cy are integers < 4096).
  cos_, sin_ = _split(cos, tf.float32, 12), _split(sin, tf.float32, 12)
  c = cx - _times(cos_, cx) + _times(sin_, cy)
  f = cy - _times(sin_, cx) - _times(cos_, cy)
  return _affine(image, [cos, -sin, c, sin, cos, f])


def shear_x(image: tf.Tensor, level: float | tf.Tensor) -> tf.Tensor:
  """Output (x, y) takes input (x + level * y, y): rows shifted in proportion to their
  index (pixel indices from the top-left pixel, as big_vision)."""
  return _affine(image, [1.0, level, 0.0, 0.0, 1.0, 0.0])


def shear_y(image: tf.Tensor, level: float | tf.Tensor) -> tf.Tensor:
  """Output (x, y) takes input (x, level * x + y)."""
  return _affine(image, [1.0, 0.0, 0.0, level, 1.0, 0.0])


def _shift(image: tf.Tensor, pixels: float | tf.Tensor, axis: int) -> tf.Tensor:
  """Output index i takes input index i + round(pixels) along `axis` (0: rows, 1:
  columns), grey beyond the edges: a nearest-pixel translation, as a roll and a select."""
  size = tf.shape(image)[axis]
  shift = tf.cast(tf.math.floor(tf.cast(pixels, tf.float32) + 0.5), tf.int32)
  source = tf.range(size) + shift  # [size]
  outside = (source < 0) | (source >= size)
  outside = outside[:, None, None] if axis == 0 else outside[None, :, None]
  return _grey_fill(outside, tf.roll(image, -shift, axis=axis))


def translate_x(image: tf.Tensor, pixels: float | tf.Tensor) -> tf.Tensor:
  """Output (x, y) takes input (x + pixels, y): the content moves left by `pixels`."""
  return _shift(image, pixels, axis=1)


def translate_y(image: tf.Tensor, pixels: float | tf.Tensor) -> tf.Tensor:
  """Output (x, y) takes input (x, y + pixels): the content moves up by `pixels`."""
  return _shift(image, pixels, axis=0)


def cutout(image: tf.Tensor, half_size: int, centre: tf.Tensor) -> tf.Tensor:
  """Grey square of side 2 * half_size centred on pixel `centre` (int32 [2]: row,
  column), cut by the image's edges (big_vision's Cutout)."""
  ys = tf.range(tf.shape(image)[0])[:, None, None] - centre[0]  # [H, 1, 1]
  xs = tf.range(tf.shape(image)[1])[None, :, None] - centre[1]  # [1, W, 1]
  inside = (ys >= -half_size) & (ys < half_size) & (xs >= -half_size) & (xs < half_size)
  return _grey_fill(inside, image)


# The policy: magnitude -> each op's argument (big_vision's scale), random op per layer.


@dataclasses.dataclass(frozen=True)
class Draws:
  """What a round draws from its seed, whichever op it applies: the sign of rotate, shear
  and translate, and the centre of cutout."""

  negate: tf.Tensor  # bool []
  centre: tf.Tensor  # int32 [2]: row, column


def draw(seed: tf.Tensor, height: tf.Tensor | int, width: tf.Tensor | int) -> Draws:
  """A round's draws from its seed (int64 [2]) for an image of height x width: negate
  with probability 1/2, the centre uniform over the pixels."""
  negate = tf.random.stateless_uniform([], seed) < 0.5
  y_seed, x_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
  cy = tf.random.stateless_uniform([], y_seed, maxval=height, dtype=tf.int32)
  cx = tf.random.stateless_uniform([], x_seed, maxval=width, dtype=tf.int32)
  return Draws(negate, tf.stack([cy, cx]))


def _signed(value: float, draws: Draws) -> tf.Tensor:
  return tf.where(draws.negate, -value, value)


def _enhance_factor(m: float) -> float:
  return m / _MAX_LEVEL * 1.8 + 0.1


@dataclasses.dataclass(frozen=True)
class Op:
  """One RandAugment op: name (big_vision's) and (image, magnitude, draws) -> image."""

  name: str
  apply: Callable[[tf.Tensor, float, Draws], tf.Tensor]


# big_vision's list, in its order (the order decides which op a random index picks).
OPS = (
  Op("AutoContrast", lambda x, m, d: autocontrast(x)),
  Op("Equalize", lambda x, m, d: equalize(x)),
  Op("Invert", lambda x, m, d: invert(x)),
  Op("Rotate", lambda x, m, d: rotate(x, _signed(m / _MAX_LEVEL * _ROTATE_DEGREES, d))),
  Op("Posterize", lambda x, m, d: posterize(x, int(m / _MAX_LEVEL * _POSTERIZE_BITS))),
  Op("Solarize", lambda x, m, d: solarize(x, max(0, 256 - int(m / _MAX_LEVEL * 256)))),
  Op("Color", lambda x, m, d: color(x, _enhance_factor(m))),
  Op("Contrast", lambda x, m, d: contrast(x, _enhance_factor(m))),
  Op("Brightness", lambda x, m, d: brightness(x, _enhance_factor(m))),
  Op("Sharpness", lambda x, m, d: sharpness(x, _enhance_factor(m))),
  Op("ShearX", lambda x, m, d: shear_x(x, _signed(m / _MAX_LEVEL * _SHEAR, d))),
  Op("ShearY", lambda x, m, d: shear_y(x, _signed(m / _MAX_LEVEL * _SHEAR, d))),
  Op("TranslateX", lambda x, m, d: translate_x(x, _signed(m / _MAX_LEVEL * _TRANSLATE_PIXELS, d))),
  Op("TranslateY", lambda x, m, d: translate_y(x, _signed(m / _MAX_LEVEL * _TRANSLATE_PIXELS, d))),
  Op("Cutout", lambda x, m, d: cutout(x, int(m / _MAX_LEVEL * _CUTOUT_HALF_SIZE), d.centre)),
  Op(
    "SolarizeAdd",
    lambda x, m, d: solarize_add(x, int(m / _MAX_LEVEL * _SOLARIZE_ADD), _SOLARIZE_ADD_THRESHOLD),
  ),
)


def choices(seed: tf.Tensor, layers: int) -> tuple[tf.Tensor, tf.Tensor]:
  """The ops of an image's rounds: (int32 [layers] indices into OPS, int64 [layers, 2]
  seeds of their draws), all from `seed` (int64 [2])."""
  pick, argument = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
  indices = tf.random.stateless_uniform([layers], pick, maxval=len(OPS), dtype=tf.int32)
  return indices, tf.random.experimental.stateless_split(argument, num=layers)


class Rounds(NamedTuple):
  """An image's rounds, drawn from its seed (`rounds`); a batch's with a leading [B]."""

  ops: tf.Tensor  # int32 [layers]: indices into OPS
  negate: tf.Tensor  # bool [layers]: each round's Draws.negate
  centre: tf.Tensor  # int32 [layers, 2]: each round's Draws.centre


def rounds(seed: tf.Tensor, layers: int, height: int, width: int) -> Rounds:
  """The `layers` rounds of an image of height x width, from its seed (int64 [2]): the
  ops `choices` picks, each with the draws of its own seed."""
  indices, seeds = choices(seed, layers)
  draws = [draw(seeds[k], height, width) for k in range(layers)]
  negate = tf.reshape(tf.stack([d.negate for d in draws]), [layers])
  centre = tf.reshape(tf.stack([d.centre for d in draws]), [layers, 2])
  return Rounds(indices, negate, centre)


@functools.cache
def _branches(magnitude: float) -> list:
  """Each op of OPS at `magnitude` as a concrete function of (image, negate, centre)."""
  specs = (
    tf.TensorSpec([None, None, 3], tf.uint8),
    tf.TensorSpec([], tf.bool),
    tf.TensorSpec([2], tf.int32),
  )
  return [
    tf.function(
      lambda x, n, c, op=op: op.apply(x, magnitude, Draws(n, c)), autograph=False
    ).get_concrete_function(*specs)
    for op in OPS
  ]


@functools.cache
def _compiled(magnitude: float):
  """(uint8 [B, H, W, 3] images, Rounds of [B, layers]) -> uint8 [B, H, W, 3]: one XLA
  computation (compiled once per shape) that loops over the images and runs each round
  as a conditional, which runs only the picked op.

  Each round is a `Case` op made directly, not by `tf.switch_case`, which marks its Case
  for lowering to Switch/Merge: a lowered Case walks every branch's nodes on each call
  (~0.75 CPU ms per round at 224 px where a graph runs it without XLA).
  """
  branches = _branches(magnitude)

  def one(args):
    image, ops, negate, centre = args
    for k in range(ops.shape[0]):
      (out,) = tf.raw_ops.Case(
        branch_index=ops[k],
        input=[image, negate[k], centre[k]],
        Tout=[tf.uint8],
        branches=branches,
      )
      out.set_shape(image.shape)
      image = out
    return image

  def augment(images, ops, negate, centre):
    return tf.map_fn(one, (images, ops, negate, centre), fn_output_signature=tf.uint8)

  return tf.function(augment, jit_compile=True, autograph=False)


def augment_batch(images: tf.Tensor, batch_rounds: Rounds, magnitude: float) -> tf.Tensor:
  """uint8 [B, H, W, 3] -> uint8 [B, H, W, 3]: each image's rounds at `magnitude`.

  One XLA computation per batch (`_compiled`): fused, each op is one or two passes over
  the pixels, where TensorFlow's kernels make a pass and an allocation per operation.
  Inside a graph (a tf.data map) it is called from Python (`tf.py_function`): run by
  tf.data's function runtime, the same computation cost ~4x the CPU time (0.28 against
  0.08 ms per image at 224 px for an Invert round), and a run's fixed cost is paid once
  per batch instead of once per image.
  """
  if batch_rounds.ops.shape[1] == 0:
    return images
  compiled = _compiled(float(magnitude))
  if tf.executing_eagerly():
    return compiled(images, *batch_rounds)
  out = tf.py_function(
    lambda x, *r: compiled(x, *r), [images, *batch_rounds], tf.uint8, name="randaugment"
  )
  out.set_shape(images.shape)
  return out


def randaugment(image: tf.Tensor, seed: tf.Tensor, layers: int, magnitude: float) -> tf.Tensor:
  """uint8 [H, W, 3] -> uint8 [H, W, 3]: `layers` ops drawn from OPS, each at `magnitude`.

  seed: int64 [2]; the image's augmentation is a function of it alone. One image at a
  time; the input pipeline draws each image's `rounds` and applies them per batch
  (`augment_batch`), which computes the same.
  """
  if layers <= 0:
    return image
  own = rounds(seed, layers, tf.shape(image)[0], tf.shape(image)[1])
  return augment_batch(image[None], Rounds(*(r[None] for r in own)), magnitude)[0]
