"""RandAugment (Cubuk et al. 2020) as big_vision trains ViTs with it, inside the train step.

    augment = make_augmenter((2, 10.0), mean, std)    # None: config.pp.randaug is None
    batch = augment(batch, rng)                       # in steps.train_step, before Mixup

With ``config.pp.randaug`` the input pipeline hands the train crops as their uint8 values
(float32 0..255, not normalised) and the compiled step augments and normalises them on
the device (docs/architecture.md, "RandAugment", says why there). The policy is
big_vision's ``randaug(layers, magnitude)`` (a fork of tensorflow/tpu's
``autoaugment.py``), computed with the ops of `randaug_ops` (each Pillow's equivalent):

  * each of ``layers`` rounds picks one of the 16 ops of `OPS` uniformly and applies it
    always (no probability of skipping, as in big_vision's RandAugment);
  * ``magnitude`` m (0..10, larger allowed) sets every op's strength on big_vision's scale
    (`_MAX_LEVEL` = 10): rotate 3m degrees, shear 0.03m, translate 10m pixels (absolute,
    as at big_vision's 224-pixel crops), cutout a square of half side int(4m) pixels,
    colour/contrast/brightness/sharpness factor 0.18m + 0.1, posterize to int(0.4m) bits,
    solarize-add int(11m); rotate, shear and translate take a random sign;
  * pixels uncovered by rotate, shear, translate and cutout are grey (128, 128, 128).

Two ops differ from big_vision on purpose (docs/architecture.md, "RandAugment"): Contrast
blends towards the grey image's mean, as PIL does (big_vision's towards H * W / 256,
big_vision issue #109); Solarize inverts the pixels >= 256 - int(25.6m), stronger with m
(big_vision's uint8 threshold int(25.6m) wraps modulo 256, issue #110).

The draws of row r of the global batch at step s come from the step's key folded with r
(`draw_rounds`): a function of (run seed, step, row), as the rows themselves are, so
exact resume and any process or device count give the same augmentation.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.aliases import Batch
from vit_jax.data import randaug_ops as ops
from vit_jax.image_constants import OFFICIAL_INPUT_MEAN, OFFICIAL_INPUT_STD

RNG_TAG = 0x726175  # 'rau': folded into the step's key for RandAugment's draws
_MAX_LEVEL = 10.0  # The magnitude at which each op reaches its reference strength.
_ROTATE_DEGREES = 30.0  # At magnitude 10.
_SHEAR = 0.3
_TRANSLATE_PIXELS = 100.0
_CUTOUT_HALF_SIZE = 40
_POSTERIZE_BITS = 4
_SOLARIZE_ADD = 110
_SOLARIZE_ADD_THRESHOLD = 128

# big_vision's list, in its order (the order decides which op a random index picks).
OPS = (
  "AutoContrast",
  "Equalize",
  "Invert",
  "Rotate",
  "Posterize",
  "Solarize",
  "Color",
  "Contrast",
  "Brightness",
  "Sharpness",
  "ShearX",
  "ShearY",
  "TranslateX",
  "TranslateY",
  "Cutout",
  "SolarizeAdd",
)
_INDEX = {name: k for k, name in enumerate(OPS)}


def enhance_factor(magnitude: float) -> float:
  """Color, Contrast, Brightness and Sharpness's factor at `magnitude`."""
  return magnitude / _MAX_LEVEL * 1.8 + 0.1


def solarize_threshold(magnitude: float) -> int:
  return max(0, 256 - int(magnitude / _MAX_LEVEL * 256))


def cutout_half_size(magnitude: float) -> int:
  return int(magnitude / _MAX_LEVEL * _CUTOUT_HALF_SIZE)


class Rounds(NamedTuple):
  """An image's rounds (`draw_rounds`); a batch's with a leading [B]."""

  ops: jax.Array  # int32 [layers]: indices into OPS
  negate: jax.Array  # bool [layers]: the sign of rotate, shear and translate
  centre: jax.Array  # int32 [layers, 2]: the cutout's centre (row, column)


def draw_rounds(key: jax.Array, layers: int, height: int, width: int) -> Rounds:
  """An image's `layers` rounds from its key: the op uniform over OPS, the sign with
  probability 1/2, the centre uniform over the pixels."""
  op_key, sign_key, y_key, x_key = jax.random.split(key, 4)
  return Rounds(
    jax.random.randint(op_key, [layers], 0, len(OPS)),
    jax.random.bernoulli(sign_key, 0.5, [layers]),
    jnp.stack(
      [
        jax.random.randint(y_key, [layers], 0, height),
        jax.random.randint(x_key, [layers], 0, width),
      ],
      axis=-1,
    ),
  )


def batch_rounds(key: jax.Array, layers: int, shape: Sequence[int]) -> Rounds:
  """Rounds of [B, layers] for images of `shape` [B, H, W, 3]: row r's from `key` folded
  with r (its index in the global batch)."""
  keys = jax.vmap(lambda r: jax.random.fold_in(key, r))(jnp.arange(shape[0]))
  return jax.vmap(lambda k: draw_rounds(k, layers, shape[1], shape[2]))(keys)


@functools.cache
def _tables(magnitude: float) -> np.ndarray:
  """int32 [len(OPS), 256]: the table of each op whose table is fixed at `magnitude`; the
  identity for the others (AutoContrast and Equalize's depend on the image)."""
  tables = np.tile(ops.IDENTITY_LUT, (len(OPS), 1))
  tables[_INDEX["Invert"]] = ops.invert_lut()
  tables[_INDEX["Posterize"]] = ops.posterize_lut(int(magnitude / _MAX_LEVEL * _POSTERIZE_BITS))
  tables[_INDEX["Solarize"]] = ops.solarize_lut(solarize_threshold(magnitude))
  solarize_add = int(magnitude / _MAX_LEVEL * _SOLARIZE_ADD)
  tables[_INDEX["SolarizeAdd"]] = ops.solarize_add_lut(solarize_add, _SOLARIZE_ADD_THRESHOLD)
  return tables


def _table_stage(images: jax.Array, op: jax.Array, magnitude: float) -> jax.Array:
  """Images [B, H, W, 3] through their ops' lookup tables (op: [B]; the identity for
  other kinds), applied to the whole batch in one gather."""
  counts = ops.histograms(images)  # [B, 3, 256]
  candidates = jnp.stack(
    [
      jnp.broadcast_to(jnp.asarray(_tables(magnitude))[op][:, None, :], counts.shape),
      jax.vmap(ops.autocontrast_lut)(counts),
      jax.vmap(ops.equalize_lut)(counts),
    ]
  )  # [3, B, 3, 256]
  kind = jnp.where(op == _INDEX["AutoContrast"], 1, jnp.where(op == _INDEX["Equalize"], 2, 0))
  chosen = jnp.arange(3)[:, None, None, None] == kind[None, :, None, None]
  # The choice as a sum (a reduction), not a select: XLA fuses a select into the gather
  # that reads the tables, and then computes an image's table entry anew for each pixel.
  return ops.apply_lut(images, jnp.sum(jnp.where(chosen, candidates, 0), axis=0))


def _affine_stage(image: jax.Array, op: jax.Array, negate: jax.Array, magnitude: float):
  """One image through its op's affine map (the identity matrix for other kinds)."""
  sign = jnp.where(negate, -1.0, 1.0)
  height, width = image.shape[:2]
  shear = sign * (magnitude / _MAX_LEVEL * _SHEAR)
  shift = sign * (magnitude / _MAX_LEVEL * _TRANSLATE_PIXELS)
  candidates = {
    "Rotate": ops.rotate_matrix(sign * (magnitude / _MAX_LEVEL * _ROTATE_DEGREES), height, width),
    "ShearX": ops.shear_matrix(shear, axis=1),
    "ShearY": ops.shear_matrix(shear, axis=0),
    "TranslateX": ops.translate_matrix(shift, axis=1),
    "TranslateY": ops.translate_matrix(shift, axis=0),
  }
  matrix = jnp.asarray(ops.IDENTITY_MATRIX, jnp.float32)
  for name, candidate in candidates.items():
    matrix = jnp.where(op == _INDEX[name], candidate, matrix)
  return ops.affine(image, matrix)


def _blend_stage(image: jax.Array, op: jax.Array, magnitude: float) -> jax.Array:
  """One image blended towards its op's degenerate image (itself for other kinds: the
  blend at factor f from the image to the image is the image)."""
  degenerate = image.astype(jnp.int32)
  degenerate = jnp.where(op == _INDEX["Color"], ops.grey(image), degenerate)
  degenerate = jnp.where(op == _INDEX["Contrast"], ops.grey_mean(image), degenerate)
  degenerate = jnp.where(op == _INDEX["Brightness"], 0, degenerate)
  degenerate = jnp.where(op == _INDEX["Sharpness"], ops.smooth(image), degenerate)
  return ops.blend(degenerate, image, enhance_factor(magnitude))


def _cutout_stage(image: jax.Array, op: jax.Array, centre: jax.Array, magnitude: float):
  """One image with its grey square where its op is Cutout."""
  half = cutout_half_size(magnitude)
  mask = ops.cutout_mask(*image.shape[:2], half, centre) & (op == _INDEX["Cutout"])
  return jnp.where(mask, jnp.uint8(ops.REPLACE), image)


def apply_rounds(images: jax.Array, rounds: Rounds, magnitude: float) -> jax.Array:
  """uint8 [B, H, W, 3] -> uint8 [B, H, W, 3]: each image's rounds ([B, layers]) at
  `magnitude`. Every image passes one stage of each kind per round (table, affine, blend,
  cutout), the identity where its op is of another kind: no per-image branch.

  The rounds are a loop: unrolled, XLA fused one round's gathers into the next round's
  reads (Sharpness reads 9 neighbours, Color 3 channels) and computed them anew for each
  read, which doubled the cost on the CPU (2 rounds: 13.7 against 7.6 CPU ms per 224 px
  image). A step with the loop gets the analytic FLOP count (`step_cost.step_flops`).
  """
  magnitude = float(magnitude)

  def one_round(k: jax.Array, images: jax.Array) -> jax.Array:
    op, negate, centre = (jax.lax.dynamic_index_in_dim(r, k, 1, keepdims=False) for r in rounds)
    images = _table_stage(images, op, magnitude)
    images = jax.vmap(_affine_stage, (0, 0, 0, None))(images, op, negate, magnitude)
    images = jax.vmap(_blend_stage, (0, 0, None))(images, op, magnitude)
    return jax.vmap(_cutout_stage, (0, 0, 0, None))(images, op, centre, magnitude)

  return jax.lax.fori_loop(0, rounds.ops.shape[1], one_round, images)


def randaugment(images: jax.Array, key: jax.Array, layers: int, magnitude: float) -> jax.Array:
  """uint8 [B, H, W, 3] -> uint8 [B, H, W, 3]: `layers` random ops per image, keyed by
  `key` and the image's row (`batch_rounds`)."""
  if layers <= 0:
    return images
  return apply_rounds(images, batch_rounds(key, layers, images.shape), magnitude)


def normalize(pixels: jax.Array, mean: Sequence[float], std: Sequence[float]) -> jax.Array:
  """uint8 pixels -> float32 as `preprocess.normalize` gives for the same values (the
  official (x - 127.5) / 127.5 in [-1, 1], else (x / 255 - mean) / std)."""
  x = pixels.astype(jnp.float32)
  if tuple(mean) == OFFICIAL_INPUT_MEAN and tuple(std) == OFFICIAL_INPUT_STD:
    return jnp.clip((x - 127.5) / 127.5, -1.0, 1.0)
  mean, std = jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)
  return (x / 255.0 - mean) / std


def make_augmenter(
  randaug: Optional[tuple[int, float]], mean: Sequence[float], std: Sequence[float]
) -> Optional[Callable[[Batch, jax.Array], Batch]]:
  """``(batch, rng) -> batch`` for `steps.train_step`: the batch's 'image' (float32 [B, H,
  W, 3], the crops' uint8 values as the pipeline hands them with RandAugment on)
  augmented and normalised with (mean, std); None when ``randaug`` (``config.pp.randaug``,
  (layers, magnitude)) is None."""
  if randaug is None:
    return None
  layers, magnitude = randaug

  def augment(batch: Batch, rng: jax.Array) -> Batch:
    pixels = jnp.clip(batch["image"], 0.0, 255.0).astype(jnp.uint8)
    augmented = randaugment(pixels, rng, layers, magnitude)
    return {**batch, "image": normalize(augmented, mean, std)}

  return augment
