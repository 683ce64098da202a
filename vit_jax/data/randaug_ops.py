"""RandAugment's single ops in JAX, each Pillow's equivalent, built from three kinds of stage.

Every op is one of:

  * a per-channel 256-entry lookup table (`apply_lut`): AutoContrast, Equalize, Invert,
    Posterize, Solarize, SolarizeAdd;
  * a nearest-pixel affine map with grey fill (`affine`): Rotate, ShearX/Y, TranslateX/Y;
  * a blend towards a degenerate image (`blend`, PIL's Image.blend): Color (the grey
    image), Contrast (its rounded mean), Brightness (black), Sharpness (PIL's SMOOTH);
  * a grey square (`cutout_mask`): Cutout.

`randaug.apply_rounds` runs a batch through one stage of each kind per round, the
identity where an image's op is of another kind (table: identity, affine: the identity
matrix, blend: the image itself, cutout: no square), so no image branches; the single
ops below are the same building blocks on one image, compared with Pillow in
tests/test_randaug.py. Images are uint8 [H, W, 3]; integer arithmetic where Pillow's is
integer, float32 products made exact where PIL rounds twice (`_split`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

REPLACE = 128  # Grey for the pixels that geometric ops and cutout uncover.
IDENTITY_LUT = np.arange(256, dtype=np.int32)  # [256]


def _split(value: jax.Array | float, low_bits: int) -> tuple[jax.Array, jax.Array]:
  """float32 value -> (high, low), high + low == value exactly, high with the last
  `low_bits` bits of its mantissa zero: so high * n is exact for integers |n| <
  2**low_bits, and value * n = fl(high * n + low * n) is rounded once, in the sum.

  Why: XLA contracts a product followed by a sum into one fused multiply-add (one
  rounding where PIL rounds twice), and a truncated result whose exact value lies within
  round-off of an integer then falls on the other side. With exact partial products a
  contraction changes nothing.
  """
  value = jnp.asarray(value, jnp.float32)
  mask = jnp.int32(-(1 << low_bits))  # ...111000 (two's complement)
  bits = jax.lax.bitcast_convert_type(value, jnp.int32)
  high = jax.lax.bitcast_convert_type(bits & mask, jnp.float32)
  return high, value - high  # the low part is exact: high is value truncated


def _times(value: tuple[jax.Array, jax.Array], n: jax.Array) -> jax.Array:
  """fl(value * n) from value's (high, low) split (_split), n integer-valued."""
  high, low = value
  return high * n + low * n


# Lookup tables: int32 [3, 256] per image, or [256] for all channels.


def _table_index(image: jax.Array) -> jax.Array:
  """uint8 [..., H, W, 3] -> int32 index of each value in the flat tables of all images
  and channels: image i's channel c at (i * 3 + c) * 256. One flat gather or scatter for
  a whole batch: one per image under vmap costs XLA:CPU several times more."""
  batch = image.shape[:-3]
  offset = jnp.arange(3, dtype=jnp.int32) * 256
  if batch:
    offset = jnp.arange(math.prod(batch), dtype=jnp.int32).reshape(*batch, 1, 1, 1) * 768 + offset
  return image.astype(jnp.int32) + offset


def apply_lut(image: jax.Array, lut: jax.Array) -> jax.Array:
  """uint8 [..., H, W, 3], int [..., 3, 256] (or [256]) tables (clipped to 0..255) ->
  uint8 [..., H, W, 3]."""
  batch = image.shape[:-3]
  lut = jnp.clip(jnp.broadcast_to(jnp.asarray(lut, jnp.int32), (*batch, 3, 256)), 0, 255)
  return jnp.take(lut.astype(jnp.uint8).reshape(-1), _table_index(image), mode="clip")


def histograms(image: jax.Array) -> jax.Array:
  """uint8 [..., H, W, 3] -> int32 [..., 3, 256]: the pixel count of each value, per channel."""
  batch = image.shape[:-3]
  counts = jnp.zeros([math.prod(batch) * 768], jnp.int32)
  return counts.at[_table_index(image).reshape(-1)].add(1).reshape(*batch, 3, 256)


@functools.cache
def _autocontrast_float64_low() -> np.ndarray:
  """Sorted int32 keys (lo * 256 + hi) * 256 + x of the table entries where PIL's float64
  formula int(x * scale + offset) lands one below the exact floor((x - lo) * 255 / (hi - lo))
  (an exact integer computed as k - epsilon): 12,094 of the 8.4 million, computed here
  with numpy's float64 as PIL's Python does, so the device needs no float64."""
  lo, hi = np.triu_indices(256, 1)  # every lo < hi
  x = np.arange(256)[None, :]
  scale = 255.0 / (hi - lo)[:, None]
  pil = np.clip(np.trunc(x * scale + (-lo[:, None] * scale)), 0, 255)
  exact = np.clip((x - lo[:, None]) * 255 // (hi - lo)[:, None], 0, 255)
  rows, cols = np.nonzero(pil != exact)
  return np.sort((lo[rows] * 256 + hi[rows]) * 256 + cols).astype(np.int32)


def autocontrast_lut(counts: jax.Array) -> jax.Array:
  """PIL's ImageOps.autocontrast as tables, from the image's `histograms` (int32 [3, 256]):
  each channel stretched so its min is 0 and its max 255; a flat channel keeps its values.
  Exact: integer floor, minus one where PIL's float64 round-off lands below an integer
  (`_autocontrast_float64_low`)."""
  x = jnp.arange(256, dtype=jnp.int32)[None, :]
  lo = jnp.min(jnp.where(counts > 0, x, 255), axis=1)[:, None]  # [3, 1]
  hi = jnp.max(jnp.where(counts > 0, x, 0), axis=1)[:, None]
  exact = jnp.clip((x - lo) * 255 // jnp.maximum(hi - lo, 1), 0, 255)  # [3, 256]
  low = jnp.asarray(_autocontrast_float64_low())
  key = (lo * 256 + hi) * 256 + x
  found = low[jnp.clip(jnp.searchsorted(low, key), 0, low.shape[0] - 1)] == key
  return jnp.where(hi > lo, exact - found.astype(jnp.int32), x)


def equalize_lut(counts: jax.Array) -> jax.Array:
  """PIL's ImageOps.equalize as tables, from the image's `histograms` (int32 [3, 256]):
  each channel's histogram spread over 0..255."""
  values = jnp.arange(256, dtype=jnp.int32)
  last = jnp.max(jnp.where(counts > 0, values, -1), axis=1)  # the highest value present
  last_count = jnp.take_along_axis(counts, last[:, None], axis=1)[:, 0]
  step = (counts.sum(axis=1) - last_count) // 255  # [3]
  safe = jnp.maximum(step, 1)[:, None]
  below = jnp.cumsum(counts, axis=1) - counts  # pixels below each value
  table = (safe // 2 + below) // safe
  return jnp.where((step > 0)[:, None], table, values[None, :])


def invert_lut() -> np.ndarray:
  """PIL's ImageOps.invert: 255 - x."""
  return 255 - IDENTITY_LUT


def posterize_lut(bits: int) -> np.ndarray:
  """PIL's ImageOps.posterize: keep the `bits` high bits, 1..8. Fewer (magnitude < 2.5)
  keep 1, as big_vision's uint8 shift by 8 does (TensorFlow clamps it to 7 bits); more
  (magnitude >= 20) keep all 8."""
  shift = 8 - min(max(bits, 1), 8)
  return IDENTITY_LUT & ((0xFF << shift) & 0xFF)


def solarize_lut(threshold: int) -> np.ndarray:
  """PIL's ImageOps.solarize: invert the values >= threshold (256: none, 0: all)."""
  return np.where(IDENTITY_LUT >= max(threshold, 0), 255 - IDENTITY_LUT, IDENTITY_LUT)


def solarize_add_lut(addition: int, threshold: int) -> np.ndarray:
  """big_vision's SolarizeAdd (no PIL op; timm's is this table): add `addition` to the
  values below `threshold`, clipped to 0..255."""
  added = np.clip(IDENTITY_LUT + addition, 0, 255)
  return np.where(IDENTITY_LUT < threshold, added, IDENTITY_LUT)


def autocontrast(image: jax.Array) -> jax.Array:
  return apply_lut(image, autocontrast_lut(histograms(image)))


def equalize(image: jax.Array) -> jax.Array:
  return apply_lut(image, equalize_lut(histograms(image)))


def invert(image: jax.Array) -> jax.Array:
  return apply_lut(image, invert_lut())


def posterize(image: jax.Array, bits: int) -> jax.Array:
  return apply_lut(image, posterize_lut(bits))


def solarize(image: jax.Array, threshold: int) -> jax.Array:
  return apply_lut(image, solarize_lut(threshold))


def solarize_add(image: jax.Array, addition: int, threshold: int) -> jax.Array:
  return apply_lut(image, solarize_add_lut(addition, threshold))


# Blends: PIL's Image.blend(degenerate, image, factor) with the op's degenerate image.


def blend(degenerate: jax.Array, image: jax.Array, factor: float) -> jax.Array:
  """d + factor * (x - d), clipped and truncated to uint8 (factor > 1 extrapolates away
  from `degenerate`, int32 broadcastable to the image); the product rounded before the
  sum, as PIL (_split: x - d is an integer, |x - d| < 2**9). factor 1: the image."""
  degenerate = jnp.asarray(degenerate).astype(jnp.float32)
  difference = image.astype(jnp.float32) - degenerate
  mixed = degenerate + _times(_split(factor, 10), difference)
  return jnp.clip(mixed, 0.0, 255.0).astype(jnp.uint8)


def grey(image: jax.Array) -> jax.Array:
  """uint8 [H, W, 3] -> int32 [H, W, 1]: PIL's convert('L'), ITU-R 601-2 luma in 16-bit
  fixed point, rounded down after adding 1/2 (below 2**31: 255 * 65536 + 32768)."""
  x = image.astype(jnp.int32)
  luma = x[..., 0:1] * 19595 + x[..., 1:2] * 38470 + x[..., 2:3] * 7471
  return (luma + 32768) >> 16


def grey_mean(image: jax.Array) -> jax.Array:
  """int32 []: the grey image's mean rounded, PIL's int(mean + 0.5), in integers (exact
  below 4 million pixels)."""
  total = grey(image).sum()
  count = image.shape[0] * image.shape[1]
  return (2 * total + count) // (2 * count)


def smooth(image: jax.Array) -> jax.Array:
  """uint8 [H, W, 3] -> int32 [H, W, 3]: PIL's SMOOTH filter (3x3, centre 5, others 1,
  / 13, rounded; never a tie, 13 is odd), border pixels kept."""
  x = image.astype(jnp.int32)
  height, width = x.shape[:2]
  padded = jnp.pad(x, [[1, 1], [1, 1], [0, 0]])  # [H + 2, W + 2, 3]; the pad is never kept
  rows = padded[:, :-2] + padded[:, 1:-1] + padded[:, 2:]  # [H + 2, W, 3] sums of 3 across
  box = rows[:-2] + rows[1:-1] + rows[2:]  # [H, W, 3] 3x3 sums
  ys, xs = jnp.arange(height)[:, None, None], jnp.arange(width)[None, :, None]
  border = (ys == 0) | (ys == height - 1) | (xs == 0) | (xs == width - 1)
  return jnp.where(border, x, (box + 4 * x + 6) // 13)


def color(image: jax.Array, factor: float) -> jax.Array:
  """PIL's ImageEnhance.Color: from the grey image (0) through the image (1)."""
  return blend(grey(image), image, factor)


def contrast(image: jax.Array, factor: float) -> jax.Array:
  """PIL's ImageEnhance.Contrast: from a flat image of the grey mean (0) through the image."""
  return blend(grey_mean(image), image, factor)


def brightness(image: jax.Array, factor: float) -> jax.Array:
  """PIL's ImageEnhance.Brightness: from black (0) through the image (1)."""
  return blend(0, image, factor)


def sharpness(image: jax.Array, factor: float) -> jax.Array:
  """PIL's ImageEnhance.Sharpness: from the smoothed image (0) through the image (1)."""
  return blend(smooth(image), image, factor)


# The affine map: output pixel (x, y) takes input pixel (a x + b y + c, d x + e y + f).


def affine(image: jax.Array, matrix: jax.Array) -> jax.Array:
  """Output (x, y) takes input floor(a x + b y + c + 1/2, d x + e y + f + 1/2) (pixel
  indices: the nearest, halves rounded up as PIL does), or grey outside the image;
  matrix = float32 [6] (a, b, c, d, e, f). One gather of whole pixels."""
  height, width = image.shape[:2]
  matrix = jnp.asarray(matrix, jnp.float32)
  a, b, d, e = (_split(matrix[i], 12) for i in (0, 1, 3, 4))
  xs = jnp.arange(width, dtype=jnp.float32)[None, :]  # [1, W]
  ys = jnp.arange(height, dtype=jnp.float32)[:, None]  # [H, 1]
  # Products rounded before the sums (_split; exact for indices below 4096).
  source_x = jnp.floor(_times(a, xs) + _times(b, ys) + (matrix[2] + 0.5)).astype(jnp.int32)
  source_y = jnp.floor(_times(d, xs) + _times(e, ys) + (matrix[5] + 0.5)).astype(jnp.int32)
  inside = (source_x >= 0) & (source_x < width) & (source_y >= 0) & (source_y < height)
  index = jnp.where(inside, source_y * width + source_x, height * width)  # else the grey pixel
  pixels = jnp.concatenate([image.reshape(-1, 3), jnp.full([1, 3], REPLACE, image.dtype)])
  return pixels[index]  # [H, W, 3]


IDENTITY_MATRIX = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)


def rotate_matrix(degrees: jax.Array | float, height: int, width: int) -> jax.Array:
  """PIL's Image.rotate(degrees): counter-clockwise about the image centre."""
  radians = jnp.asarray(degrees, jnp.float32) * jnp.float32(math.pi / 180.0)
  cos, sin = jnp.cos(radians), jnp.sin(radians)
  cx, cy = (width - 1) / 2.0, (height - 1) / 2.0  # the centre, in pixel indices
  # cos * cx etc. rounded before the sums (_split: 2 cx and 2 cy are integers < 4096).
  cos_, sin_ = _split(cos, 12), _split(sin, 12)
  c = cx - _times(cos_, jnp.float32(cx)) + _times(sin_, jnp.float32(cy))
  f = cy - _times(sin_, jnp.float32(cx)) - _times(cos_, jnp.float32(cy))
  return jnp.stack([cos, -sin, c, sin, cos, f])


def shear_matrix(level: jax.Array | float, axis: int) -> jax.Array:
  """Shear about the top-left pixel (big_vision's pixel indices): axis 1 (ShearX) output
  (x, y) takes input (x + level y, y); axis 0 (ShearY) (x, level x + y)."""
  level = jnp.asarray(level, jnp.float32)
  zero, one = jnp.zeros_like(level), jnp.ones_like(level)
  if axis == 1:
    return jnp.stack([one, level, zero, zero, one, zero])
  return jnp.stack([one, zero, zero, level, one, zero])


def translate_matrix(pixels: jax.Array | float, axis: int) -> jax.Array:
  """Output index i takes input i + round(pixels) (halves up) along `axis` (1: columns,
  TranslateX; 0: rows, TranslateY): the content moves left (up) by `pixels`."""
  shift = jnp.floor(jnp.asarray(pixels, jnp.float32) + 0.5)
  zero, one = jnp.zeros_like(shift), jnp.ones_like(shift)
  if axis == 1:
    return jnp.stack([one, zero, shift, zero, one, zero])
  return jnp.stack([one, zero, zero, zero, one, shift])


def rotate(image: jax.Array, degrees: jax.Array | float) -> jax.Array:
  return affine(image, rotate_matrix(degrees, *image.shape[:2]))


def shear_x(image: jax.Array, level: jax.Array | float) -> jax.Array:
  return affine(image, shear_matrix(level, axis=1))


def shear_y(image: jax.Array, level: jax.Array | float) -> jax.Array:
  return affine(image, shear_matrix(level, axis=0))


def translate_x(image: jax.Array, pixels: jax.Array | float) -> jax.Array:
  return affine(image, translate_matrix(pixels, axis=1))


def translate_y(image: jax.Array, pixels: jax.Array | float) -> jax.Array:
  return affine(image, translate_matrix(pixels, axis=0))


# Cutout.


def cutout_mask(height: int, width: int, half_size: int, centre: jax.Array) -> jax.Array:
  """bool [H, W, 1]: a square of side 2 * half_size centred on pixel `centre` (int32 [2]:
  row, column), cut by the image's edges (big_vision's Cutout)."""
  ys = jnp.arange(height)[:, None, None] - centre[0]  # [H, 1, 1]
  xs = jnp.arange(width)[None, :, None] - centre[1]  # [1, W, 1]
  return (ys >= -half_size) & (ys < half_size) & (xs >= -half_size) & (xs < half_size)


def cutout(image: jax.Array, half_size: int, centre: jax.Array) -> jax.Array:
  mask = cutout_mask(*image.shape[:2], half_size, jnp.asarray(centre))
  return jnp.where(mask, jnp.uint8(REPLACE), image)
