"""RandAugment (Cubuk et al. 2020) as big_vision trains ViTs with it, inside the train step.

    augment = make_augmenter((2, 10.0), mean, std, mesh)  # None: config.pp.randaug is None
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
from jax.sharding import Mesh, PartitionSpec

from vit_jax.data import randaug_ops as ops
from vit_jax.infra.aliases import Batch
from vit_jax.infra.image_constants import OFFICIAL_INPUT_MEAN, OFFICIAL_INPUT_STD
from vit_jax.infra.sharding import DATA_AXIS

RNG_TAG = 0x726175  # 'rau': folded into the step's key for RandAugment's draws
SCOPE = "randaugment"  # The name scope of its ops in the compiled step (`apply_rounds`).
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


def branches(magnitude: float) -> list[Callable[[jax.Array, jax.Array, jax.Array], jax.Array]]:
  """The op of each index of OPS at `magnitude`: (uint8 image [H, W, 3], negate, centre)
  -> uint8 image. The sign picks one of two fixed maps (`lax.cond`: one is run)."""
  level = magnitude / _MAX_LEVEL
  factor = enhance_factor(magnitude)

  def signed(op: Callable[[jax.Array, float], jax.Array], value: float):
    def run(image: jax.Array, negate: jax.Array, centre: jax.Array) -> jax.Array:
      del centre
      return jax.lax.cond(negate, lambda x: op(x, -value), lambda x: op(x, value), image)

    return run

  def plain(op: Callable[[jax.Array], jax.Array]):
    return lambda image, negate, centre: op(image)

  by_name = {
    "AutoContrast": plain(ops.autocontrast),
    "Equalize": plain(ops.equalize),
    "Invert": plain(ops.invert),
    "Rotate": signed(ops.rotate, level * _ROTATE_DEGREES),
    "Posterize": plain(lambda x: ops.posterize(x, int(level * _POSTERIZE_BITS))),
    "Solarize": plain(lambda x: ops.solarize(x, solarize_threshold(magnitude))),
    "Color": plain(lambda x: ops.color(x, factor)),
    "Contrast": plain(lambda x: ops.contrast(x, factor)),
    "Brightness": plain(lambda x: ops.brightness(x, factor)),
    "Sharpness": plain(lambda x: ops.sharpness(x, factor)),
    "ShearX": signed(ops.shear_x, level * _SHEAR),
    "ShearY": signed(ops.shear_y, level * _SHEAR),
    "TranslateX": signed(ops.translate_x, level * _TRANSLATE_PIXELS),
    "TranslateY": signed(ops.translate_y, level * _TRANSLATE_PIXELS),
    "Cutout": lambda x, negate, centre: ops.cutout(x, cutout_half_size(magnitude), centre),
    "SolarizeAdd": plain(
      lambda x: ops.solarize_add(x, int(level * _SOLARIZE_ADD), _SOLARIZE_ADD_THRESHOLD)
    ),
  }
  return [by_name[name] for name in OPS]


def apply_rounds(images: jax.Array, rounds: Rounds, magnitude: float) -> jax.Array:
  """uint8 [B, H, W, 3] -> uint8 [B, H, W, 3]: each image's rounds ([B, layers]) at
  `magnitude`, one image at a time (a loop over the rows), each round running the drawn
  op alone (`lax.switch` on a scalar: no other op is computed, where a vmapped switch
  would compute all 16 and select).

  The ops are gather-free (`randaug_ops`): a TPU runs a per-element gather element by
  element. The plan counts the switch at the mean of its branches, the cost of the op
  drawn uniformly (`vit_jax.plan.loop_cost`; its ops carry the name SCOPE).
  """
  drawn_op = branches(float(magnitude))

  def one_image(row: jax.Array, out: jax.Array) -> jax.Array:
    image = out[row]  # [H, W, 3]
    for k in range(rounds.ops.shape[1]):
      op, negate, centre = (r[row, k] for r in rounds)
      image = jax.lax.switch(op, drawn_op, image, negate, centre)
    return out.at[row].set(image)

  with jax.named_scope(SCOPE):
    return jax.lax.fori_loop(0, images.shape[0], one_image, images)


def randaugment(images: jax.Array, key: jax.Array, layers: int, magnitude: float) -> jax.Array:
  """uint8 [B, H, W, 3] -> uint8 [B, H, W, 3]: `layers` random ops per image, keyed by
  `key` and the image's row (`batch_rounds`)."""
  if layers <= 0:
    return images
  return apply_rounds(images, batch_rounds(key, layers, images.shape), magnitude)


def normalize(pixels: jax.Array, mean: Sequence[float], std: Sequence[float]) -> jax.Array:
  """uint8 pixels -> float32 as `host_images.normalize` gives for the same values (the
  official (x - 127.5) / 127.5 in [-1, 1], else (x / 255 - mean) / std)."""
  x = pixels.astype(jnp.float32)
  if tuple(mean) == OFFICIAL_INPUT_MEAN and tuple(std) == OFFICIAL_INPUT_STD:
    return jnp.clip((x - 127.5) / 127.5, -1.0, 1.0)
  mean, std = jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)
  return (x / 255.0 - mean) / std


def make_augmenter(
  randaug: Optional[tuple[int, float]],
  mean: Sequence[float],
  std: Sequence[float],
  mesh: Optional[Mesh] = None,
) -> Optional[Callable[[Batch, jax.Array], Batch]]:
  """``(batch, rng) -> batch`` for `steps.train_step`: the batch's 'image' (float32 [B, H,
  W, 3], the crops' uint8 values as the pipeline hands them with RandAugment on)
  augmented and normalised with (mean, std); None when ``randaug`` (``config.pp.randaug``,
  (layers, magnitude)) is None. With the run's `mesh` each device loops over its own rows
  of the batch (sharded over the 'data' axis); the draws are the global batch's, so the
  result does not depend on the mesh."""
  if randaug is None:
    return None
  layers, magnitude = randaug

  def augment(batch: Batch, rng: jax.Array) -> Batch:
    pixels = jnp.clip(batch["image"], 0.0, 255.0).astype(jnp.uint8)
    if layers <= 0:
      augmented = pixels
    else:
      rounds = batch_rounds(rng, layers, pixels.shape)
      run = functools.partial(apply_rounds, magnitude=magnitude)
      if mesh is not None:
        rows = PartitionSpec(DATA_AXIS)
        specs = (rows, Rounds(rows, rows, rows))
        run = jax.shard_map(run, mesh=mesh, in_specs=specs, out_specs=rows)
      augmented = run(pixels, rounds)
    return {**batch, "image": normalize(augmented, mean, std)}

  return augment
