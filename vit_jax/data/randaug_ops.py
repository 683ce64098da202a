"""RandAugment's single ops in JAX on one image, each Pillow's equivalent, none a gather.

Every op is one of:

  * a per-channel table of the 256 values: arithmetic where the table is a formula
    (Invert, Posterize, Solarize, SolarizeAdd, AutoContrast's stretch), one-hot products
    where it is the image's own (Equalize: `histograms`, `lookup`);
  * a nearest-pixel affine map with grey fill, fixed when the step compiles (`resample`):
    Rotate, ShearX/Y, TranslateX/Y;
  * a blend towards a degenerate image (`blend`, PIL's Image.blend): Color (the grey
    image), Contrast (its rounded mean), Brightness (black), Sharpness (PIL's SMOOTH);
  * a grey square (`cutout_mask`): Cutout.

No gather or scatter: a TPU runs those element by element (docs/plan.md, "RandAugment in
the step"). `randaug.apply_rounds` runs the drawn op of each image alone; each op is
compared with Pillow in tests/test_randaug.py. Images are uint8 [H, W, 3]; integer
arithmetic where Pillow's is integer, float32 products made exact where PIL rounds twice
(`_split`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

REPLACE = 128  # Grey for the pixels that geometric ops and cutout uncover.


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


# Table ops: a value's new value per channel. Arithmetic where the table is a formula; an
# image's own table (Equalize) through one-hot products, never a gather or a scatter: a
# TPU runs a per-element gather element by element (XLA:TPU's cost model: ~2 s for a
# batch of 128 224-pixel images), while a one-hot product is the matrix unit's work.

# A NumPy constant: a jnp array at import would start JAX's backend before a multi-process
# run's jax.distributed start-up.
_NIBBLES = np.arange(16, dtype=np.int32)


def _nibbles(image: jax.Array) -> tuple[jax.Array, jax.Array]:
  """uint8 [H, W, 3] -> float32 one-hots [H * W, 3, 16] of each value's high and low 4
  bits: value v = 16 h + l is the pair (h, l)."""
  x = image.astype(jnp.int32).reshape(-1, 3, 1)
  high = (x >> 4 == _NIBBLES).astype(jnp.float32)
  low = (x & 15 == _NIBBLES).astype(jnp.float32)
  return high, low


def histograms(image: jax.Array) -> jax.Array:
  """uint8 [H, W, 3] -> int32 [3, 256]: the pixel count of each value, per channel, as
  the one-hot product high^T low ([16, P] x [P, 16] per channel; exact: 0/1 operands,
  float32 sums below 2**24)."""
  high, low = _nibbles(image)
  counts = jnp.einsum("pch,pcl->chl", high, low, preferred_element_type=jnp.float32)
  return counts.astype(jnp.int32).reshape(3, 256)


def lookup(image: jax.Array, table: jax.Array) -> jax.Array:
  """uint8 [H, W, 3] through int [3, 256] per-channel tables (values 0..255) -> uint8:
  the high 4 bits pick a row of the table as a 16 x 16 matrix (a one-hot product), the
  low 4 bits an entry of that row (a one-hot sum). Exact: one nonzero term per sum."""
  high, low = _nibbles(image)
  rows = table.astype(jnp.float32).reshape(3, 16, 16)
  picked = jnp.einsum("pch,chl->pcl", high, rows, preferred_element_type=jnp.float32)
  return jnp.sum(picked * low, axis=-1).astype(jnp.uint8).reshape(image.shape)


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


_AUTOCONTRAST_MAX_LOW = 17  # The most entries of one (lo, hi) pair's table that land low.


def autocontrast(image: jax.Array) -> jax.Array:
  """PIL's ImageOps.autocontrast: each channel stretched so its min is 0 and its max 255;
  a flat channel keeps its values. Exact: the integer floor, minus one at the entries of
  the channel's (lo, hi) where PIL's float64 round-off lands below an integer
  (`_autocontrast_float64_low`: at most 17 per pair, compared with each pixel)."""
  x = image.astype(jnp.int32)  # [H, W, 3]
  lo, hi = x.min(axis=(0, 1)), x.max(axis=(0, 1))  # [3]
  exact = jnp.clip((x - lo) * 255 // jnp.maximum(hi - lo, 1), 0, 255)
  keys = jnp.asarray(_autocontrast_float64_low())
  base = (lo * 256 + hi) * 256  # [3]: the pair's first key
  first = jnp.searchsorted(keys, base)
  candidates = jnp.arange(_AUTOCONTRAST_MAX_LOW)[:, None] + first  # [17, 3]
  found = keys[jnp.clip(candidates, 0, keys.shape[0] - 1)] - base  # x of a low entry, or
  found = jnp.where((found >= 0) & (found < 256), found, -1)  # -1: no entry
  low = (x[..., None, :] == found).any(axis=-2)  # [H, W, 3]
  return jnp.where(hi > lo, exact - low.astype(jnp.int32), x).astype(jnp.uint8)


def equalize_table(counts: jax.Array) -> jax.Array:
  """PIL's ImageOps.equalize as tables, from the image's `histograms` (int32 [3, 256]):
  each channel's histogram spread over 0..255."""
  values = jnp.arange(256, dtype=jnp.int32)
  last = jnp.max(jnp.where(counts > 0, values, -1), axis=1)  # the highest value present
  last_count = jnp.sum(jnp.where(values == last[:, None], counts, 0), axis=1)
  step = (counts.sum(axis=1) - last_count) // 255  # [3]
  safe = jnp.maximum(step, 1)[:, None]
  below = jnp.cumsum(counts, axis=1) - counts  # pixels below each value
  table = (safe // 2 + below) // safe
  return jnp.where((step > 0)[:, None], table, values[None, :])


def equalize(image: jax.Array) -> jax.Array:
  return lookup(image, jnp.clip(equalize_table(histograms(image)), 0, 255))


def invert(image: jax.Array) -> jax.Array:
  """PIL's ImageOps.invert: 255 - x."""
  return 255 - image


def posterize(image: jax.Array, bits: int) -> jax.Array:
  """PIL's ImageOps.posterize: keep the `bits` high bits, 1..8. Fewer (magnitude < 2.5)
  keep 1, as big_vision's uint8 shift by 8 does (TensorFlow clamps it to 7 bits); more
  (magnitude >= 20) keep all 8."""
  shift = 8 - min(max(bits, 1), 8)
  return image & jnp.uint8((0xFF << shift) & 0xFF)


def solarize(image: jax.Array, threshold: int) -> jax.Array:
  """PIL's ImageOps.solarize: invert the values >= threshold (256: none, 0: all)."""
  return jnp.where(image.astype(jnp.int32) >= max(threshold, 0), 255 - image, image)


def solarize_add(image: jax.Array, addition: int, threshold: int) -> jax.Array:
  """big_vision's SolarizeAdd (no PIL op; timm's is this table): add `addition` to the
  values below `threshold`, clipped to 0..255."""
  x = image.astype(jnp.int32)
  return jnp.where(x < threshold, jnp.clip(x + addition, 0, 255), x).astype(jnp.uint8)


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


# The affine ops: output pixel (x, y) takes input pixel (a x + b y + c, d x + e y + f),
# the nearest, or grey outside. Each map is fixed when the step compiles (the magnitude
# sets the angle, shear or shift; the sign picks one of two maps), so every output
# pixel's source is known then (`source_pixels`) and `resample` moves it without a gather.

_TILE = 8  # `resample`'s output tiles are 8 x 8 pixels.


def source_pixels(matrix: tuple[float, ...], height: int, width: int) -> np.ndarray:
  """int32 [H, W, 2]: the (row, column) each output pixel takes for `matrix` (a, b, c,
  d, e, f) in pixel indices: floor(a x + b y + c + 1/2), halves rounded up as PIL does,
  in float64 as PIL's C. A source outside the image is clamped to the grey row or
  column just past the nearest edge (-1, or H or W), next to its neighbours' sources."""
  a, b, c, d, e, f = (float(v) for v in matrix)
  y, x = np.mgrid[:height, :width].astype(np.float64)
  sx = np.floor(a * x + b * y + c + 0.5).astype(np.int64)
  sy = np.floor(d * x + e * y + f + 0.5).astype(np.int64)
  return np.stack([np.clip(sy, -1, height), np.clip(sx, -1, width)], axis=-1).astype(np.int32)


@functools.cache
def _tiles(matrix: tuple[float, ...], height: int, width: int):
  """`resample`'s static plan for `matrix`: each 8 x 8 output tile's window origin in
  the grey-padded image (int [T, 2]), the window side S and each output pixel's index in
  its tile's S x S window (uint8 or int32 [T, 64]), with the padding and the tile grid."""
  sources = source_pixels(matrix, height, width)
  grid = (-(-height // _TILE), -(-width // _TILE))
  full = np.full((grid[0] * _TILE, grid[1] * _TILE, 2), -1, np.int32)
  full[:height, :width] = sources
  full[height:], full[:, width:] = full[height - 1 : height], full[:, width - 1 : width]
  tiles = full.reshape(grid[0], _TILE, grid[1], _TILE, 2).transpose(0, 2, 1, 3, 4)
  tiles = tiles.reshape(-1, _TILE * _TILE, 2)  # [T, 64, (row, column)]
  origin = tiles.min(axis=1)  # [T, 2]
  side = int((tiles.max(axis=1) - origin).max()) + 1
  local = (tiles[..., 0] - origin[:, None, 0]) * side + (tiles[..., 1] - origin[:, None, 1])
  index_type = np.uint8 if side * side <= 256 else np.int32
  return origin + side, side, local.astype(index_type), grid


def resample(image: jax.Array, matrix: tuple[float, ...]) -> jax.Array:
  """uint8 [H, W, 3] through the affine `matrix` (`source_pixels`), grey outside.

  Without a gather (a TPU runs one element by element): the output in 8 x 8 tiles, each
  reading one S x S window of the grey-padded image (S: 11 for a rotation of 30 degrees;
  static slices), each output pixel picking its source in the window by a compare-select
  sum over the window's S * S pixels (exact: one nonzero term), the 3 channels packed in
  one int32 so that the compare is made once per pixel and fuses into the sum."""
  height, width = image.shape[:2]
  origins, side, local, grid = _tiles(tuple(float(v) for v in matrix), height, width)
  x = image.astype(jnp.int32)
  packed = x[..., 0] + (x[..., 1] << 8) + (x[..., 2] << 16)  # [H, W]
  grey = REPLACE * (1 + (1 << 8) + (1 << 16))
  padded = jnp.pad(packed, side, constant_values=grey)  # [H + 2 S, W + 2 S]
  windows = jax.lax.gather(
    padded,
    jnp.asarray(origins, jnp.int32),
    jax.lax.GatherDimensionNumbers(
      offset_dims=(1, 2), collapsed_slice_dims=(), start_index_map=(0, 1)
    ),
    slice_sizes=(side, side),
    mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS,
  ).reshape(len(origins), 1, side * side)  # [T, 1, S * S]
  picks = jnp.asarray(local)[..., None] == jnp.arange(side * side)  # [T, 64, S * S]
  out = jnp.sum(jnp.where(picks, windows, 0), axis=-1)  # [T, 64]
  out = out.reshape(*grid, _TILE, _TILE).transpose(0, 2, 1, 3)
  out = out.reshape(grid[0] * _TILE, grid[1] * _TILE)[:height, :width, None]
  return ((out >> jnp.arange(0, 24, 8)) & 0xFF).astype(jnp.uint8)


def _single(argument: float) -> float:
  """An op's argument rounded to float32: the same map for arguments a rounding apart
  (big_vision's 1.5 * 0.3 and 0.45)."""
  return float(np.float32(argument))


def rotate_matrix(degrees: float, height: int, width: int) -> tuple[float, ...]:
  """PIL's Image.rotate(degrees): counter-clockwise about the image centre."""
  radians = math.radians(_single(degrees))
  cos, sin = math.cos(radians), math.sin(radians)
  cx, cy = (width - 1) / 2.0, (height - 1) / 2.0  # the centre, in pixel indices
  return (cos, -sin, cx - cos * cx + sin * cy, sin, cos, cy - sin * cx - cos * cy)


def shear_matrix(level: float, axis: int) -> tuple[float, ...]:
  """Shear about the top-left pixel (big_vision's pixel indices): axis 1 (ShearX) output
  (x, y) takes input (x + level y, y); axis 0 (ShearY) (x, level x + y)."""
  level = _single(level)
  if axis == 1:
    return (1.0, level, 0.0, 0.0, 1.0, 0.0)
  return (1.0, 0.0, 0.0, level, 1.0, 0.0)


def translate_matrix(pixels: float, axis: int) -> tuple[float, ...]:
  """Output index i takes input i + round(pixels) (halves up) along `axis` (1: columns,
  TranslateX; 0: rows, TranslateY): the content moves left (up) by `pixels`."""
  shift = math.floor(_single(pixels) + 0.5)
  if axis == 1:
    return (1.0, 0.0, shift, 0.0, 1.0, 0.0)
  return (1.0, 0.0, 0.0, 0.0, 1.0, shift)


def rotate(image: jax.Array, degrees: float) -> jax.Array:
  return resample(image, rotate_matrix(degrees, *image.shape[:2]))


def shear_x(image: jax.Array, level: float) -> jax.Array:
  return resample(image, shear_matrix(level, axis=1))


def shear_y(image: jax.Array, level: float) -> jax.Array:
  return resample(image, shear_matrix(level, axis=0))


def translate_x(image: jax.Array, pixels: float) -> jax.Array:
  return resample(image, translate_matrix(pixels, axis=1))


def translate_y(image: jax.Array, pixels: float) -> jax.Array:
  return resample(image, translate_matrix(pixels, axis=0))


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
