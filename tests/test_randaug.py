"""RandAugment: each op against Pillow's, each op through the batched stages, big_vision's
magnitude scale and its two fixed bugs, the keyed policy, config.pp.randaug and the train
step that applies it (exact resume, process and device count). The train stream with it
on: tests/test_data_pipeline.py."""

import dataclasses
import functools
import textwrap

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageEnhance, ImageOps

from tests import fresh_python, train_fixtures
from vit_jax import data
from vit_jax.data import host_images
from vit_jax.data import randaug as ra
from vit_jax.data import randaug_ops as ops
from vit_jax.infra import errors, sharding

GREY = (128, 128, 128)


def photo(seed: int, height: int = 96, width: int = 128) -> np.ndarray:
  """A photo-like uint8 [H, W, 3]: smooth random structure over a colour gradient, plus
  sensor-like noise (as benchmarks/input_data.py's JPEGs, not encoded)."""
  rng = np.random.default_rng(seed)
  coarse = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
  smooth = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), np.float32)
  ramp = np.linspace(-40, 40, width, dtype=np.float32)[None, :, None] * rng.uniform(-1, 1, 3)
  noisy = smooth + ramp + rng.normal(0, 8, (height, width, 3))
  return np.clip(noisy, 0, 255).astype(np.uint8)


PHOTOS = [photo(s) for s in range(3)]


@functools.lru_cache(maxsize=None, typed=True)
def _compiled(op, *args):
  """The op at fixed arguments, jitted once for every image it is applied to."""
  return jax.jit(lambda x: op(x, *args))


def _ours(op, image: np.ndarray, *args) -> np.ndarray:
  """The op compiled by XLA, as the train step runs it (its arguments constants)."""
  numbers = all(isinstance(a, (int, float)) for a in args)
  fn = _compiled(op, *args) if numbers else jax.jit(lambda x: op(x, *args))
  return np.asarray(fn(jnp.asarray(image)), np.int32)


def _pil(image: Image.Image) -> np.ndarray:
  return np.asarray(image, np.int32)


def _affine_pil(image: np.ndarray, matrix: tuple) -> np.ndarray:
  """PIL's affine transform, nearest pixel, grey fill; `matrix` in PIL's coordinates
  (pixel centres at +0.5)."""
  pil = Image.fromarray(image)
  return _pil(pil.transform(pil.size, Image.AFFINE, matrix, Image.NEAREST, fillcolor=GREY))


# Each op against Pillow's. The table and integer ops are exact (max difference 0).


@pytest.mark.parametrize("image", PHOTOS)
def test_table_ops_equal_pillow_exactly(image):
  pil = Image.fromarray(image)
  pairs = [
    (_ours(ops.autocontrast, image), _pil(ImageOps.autocontrast(pil))),
    (_ours(ops.equalize, image), _pil(ImageOps.equalize(pil))),
    (_ours(ops.invert, image), _pil(ImageOps.invert(pil))),
  ]
  pairs += [(_ours(ops.posterize, image, b), _pil(ImageOps.posterize(pil, b))) for b in range(1, 9)]
  pairs += [
    (_ours(ops.solarize, image, t), _pil(ImageOps.solarize(pil, t))) for t in (0, 77, 128, 200, 256)
  ]
  # SolarizeAdd has no PIL op: its rule as a PIL lookup table (timm's implementation).
  table = [min(255, v + 66) if v < 128 else v for v in range(256)] * 3
  pairs += [(_ours(ops.solarize_add, image, 66, 128), _pil(pil.point(table)))]
  for ours, theirs in pairs:
    np.testing.assert_array_equal(ours, theirs)


def test_autocontrast_and_equalize_on_flat_and_two_level_channels():
  # The corner cases of PIL's tables: a constant channel (identity) and two values.
  image = np.zeros((10, 12, 3), np.uint8)
  image[..., 0] = 90
  image[:, :6, 1], image[:, 6:, 1] = 30, 200
  image[..., 2] = PHOTOS[0][:10, :12, 2]
  pil = Image.fromarray(image)
  np.testing.assert_array_equal(_ours(ops.autocontrast, image), _pil(ImageOps.autocontrast(pil)))
  np.testing.assert_array_equal(_ours(ops.equalize, image), _pil(ImageOps.equalize(pil)))


def test_posterize_below_one_bit_keeps_one_as_big_vision_does():
  # big_vision's scale gives 0 bits below magnitude 2.5: its uint8 shift by 8 is clamped to
  # 7 by TensorFlow, i.e. 1 bit (PIL refuses bits < 1).
  image = tf.constant(PHOTOS[0])
  big_vision = tf.bitwise.left_shift(tf.bitwise.right_shift(image, 8), 8)
  np.testing.assert_array_equal(_ours(ops.posterize, PHOTOS[0], 0), big_vision)
  np.testing.assert_array_equal(
    _ours(ops.posterize, PHOTOS[0], 0), _ours(ops.posterize, PHOTOS[0], 1)
  )


ENHANCERS = [
  (ops.color, ImageEnhance.Color),
  (ops.contrast, ImageEnhance.Contrast),
  (ops.brightness, ImageEnhance.Brightness),
  (ops.sharpness, ImageEnhance.Sharpness),
]


@pytest.mark.parametrize("ours,enhancer", ENHANCERS, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("factor", [0.0, 0.1, 0.55, 1.0, 1.9, 3.7])
def test_enhance_ops_equal_pillow(ours, enhancer, factor):
  # Both blend d + factor * (x - d) in float32 and truncate: a value that lands within
  # round-off of an integer may truncate the other way (max 1, mean < 0.01).
  for image in PHOTOS:
    diff = np.abs(
      _ours(ours, image, factor) - _pil(enhancer(Image.fromarray(image)).enhance(factor))
    )
    assert diff.max() <= 1 and diff.mean() < 0.01


def _assert_equal_but_ties(ours: np.ndarray, theirs: np.ndarray, matrix: tuple, max_mean: float):
  """Equal, except output pixels whose source (x, y) = (a x + b y + c, d x + e y + f) in
  pixel indices (`matrix` = (a, b, c, d, e, f)) lies within 1e-3 of a half-pixel tie in x
  or y: there the two libraries' round-off picks either neighbour. Mean absolute
  difference <= max_mean."""
  assert np.abs(ours - theirs).mean() <= max_mean
  a, b, c, d, e, f = matrix
  y, x = np.mgrid[: ours.shape[0], : ours.shape[1]].astype(np.float64)
  near_tie = lambda v: np.abs(v - np.floor(v) - 0.5) < 1e-3
  ties = near_tie(a * x + b * y + c) | near_tie(d * x + e * y + f)
  assert ((ours == theirs).all(axis=-1) | ties).all()


@pytest.mark.parametrize("degrees", [-30.0, -17.5, 12.0, 30.0, 45.0])
def test_rotate_equals_pillow(degrees):
  for image in PHOTOS:
    pil = Image.fromarray(image).rotate(degrees, resample=Image.NEAREST, fillcolor=GREY)
    # Ties are rare for rotations: measured <= 0.06% of the pixels, mean difference < 0.01.
    cos, sin = np.cos(np.radians(degrees)), np.sin(np.radians(degrees))
    cy, cx = (image.shape[0] - 1) / 2, (image.shape[1] - 1) / 2
    matrix = (cos, -sin, cx - cos * cx + sin * cy, sin, cos, cy - sin * cx - cos * cy)
    _assert_equal_but_ties(_ours(ops.rotate, image, degrees), _pil(pil), matrix, max_mean=0.05)


@pytest.mark.parametrize("level", [-0.3, -0.15, 0.15, 0.3])
def test_shear_equals_pillow(level):
  for image in PHOTOS:
    # Ours shears about the top-left pixel's centre (big_vision's pixel-index convention):
    # in PIL's coordinates the same map has the offset -level / 2. At |level| 0.3 every
    # tenth row lies on exact half-pixel ties (measured: 8% of the pixels, mean 0.87).
    x_pil = _affine_pil(image, (1, level, -level / 2, 0, 1, 0))
    y_pil = _affine_pil(image, (1, 0, 0, level, 1, -level / 2))
    _assert_equal_but_ties(_ours(ops.shear_x, image, level), x_pil, (1, level, 0, 0, 1, 0), 1.5)
    _assert_equal_but_ties(_ours(ops.shear_y, image, level), y_pil, (1, 0, 0, level, 1, 0), 1.5)


@pytest.mark.parametrize("pixels", [-100.0, -37.0, 0.0, 50.0])
def test_translate_equals_pillow_exactly(pixels):
  for image in PHOTOS:
    x_pil = _affine_pil(image, (1, 0, pixels, 0, 1, 0))
    y_pil = _affine_pil(image, (1, 0, 0, 0, 1, pixels))
    np.testing.assert_array_equal(_ours(ops.translate_x, image, pixels), x_pil)
    np.testing.assert_array_equal(_ours(ops.translate_y, image, pixels), y_pil)


def test_cutout_is_one_grey_square_cut_by_the_edges():
  image = np.where(PHOTOS[0] == 128, 127, PHOTOS[0]).astype(np.uint8)  # no grey before
  height, width = image.shape[:2]
  centres = set()
  cutout = jax.jit(ops.cutout, static_argnums=1)  # the centre traced, as the train step's
  for k in range(20):
    centre = ra.draw_rounds(jax.random.PRNGKey(k), 1, height, width).centre[0]
    out = np.asarray(cutout(jnp.asarray(image), 20, centre), np.int32)
    grey = (out == 128).all(axis=-1)
    rows, cols = np.flatnonzero(grey.any(axis=1)), np.flatnonzero(grey.any(axis=0))
    # The square's rows/columns: centre - 20 .. centre + 19, cut to the image.
    assert grey[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1].all()
    assert len(rows) <= 40 and len(cols) <= 40
    assert len(rows) == 40 or rows.min() == 0 or rows.max() == height - 1
    assert len(cols) == 40 or cols.min() == 0 or cols.max() == width - 1
    np.testing.assert_array_equal(out[~grey], image[~grey])
    centres.add((rows.min(), cols.min()))
  assert len(centres) > 10  # The position is random (keyed by the seed).


# big_vision's magnitude scale, and the two ops fixed.


_APPLY_ROUNDS = jax.jit(ra.apply_rounds, static_argnums=2)  # one compile per shape, magnitude


def _outputs(name: str, image: np.ndarray, magnitude: float, seeds: int = 12) -> list:
  """Op `name` at `magnitude` through the batched stages (`apply_rounds`, as the train
  step runs it), on `seeds` copies of `image` with their own draws (sign, centre)."""
  drawn = ra.batch_rounds(jax.random.PRNGKey(9), 1, (seeds, *image.shape))
  rounds = drawn._replace(ops=jnp.full_like(drawn.ops, ra.OPS.index(name)))
  images = jnp.broadcast_to(jnp.asarray(image), (seeds, *image.shape))
  out = _APPLY_ROUNDS(images, rounds, float(magnitude))
  return list(np.asarray(out, np.int32))


SIGNED = [
  # name, magnitude, the op at big_vision's argument for that magnitude (sign: +/-)
  ("Rotate", 10, lambda x, sign: _ours(ops.rotate, x, sign * 30.0)),
  ("Rotate", 5, lambda x, sign: _ours(ops.rotate, x, sign * 15.0)),
  ("ShearX", 10, lambda x, sign: _ours(ops.shear_x, x, sign * 0.3)),
  ("ShearY", 15, lambda x, sign: _ours(ops.shear_y, x, sign * 0.45)),
  ("TranslateX", 10, lambda x, sign: _ours(ops.translate_x, x, sign * 100.0)),
  ("TranslateY", 3, lambda x, sign: _ours(ops.translate_y, x, sign * 30.0)),
]


@pytest.mark.parametrize("name,magnitude,expected", SIGNED, ids=[f"{n}-{m}" for n, m, _ in SIGNED])
def test_signed_ops_take_big_vision_arguments_with_either_sign(name, magnitude, expected):
  image = PHOTOS[1]
  plus, minus = expected(image, 1.0), expected(image, -1.0)
  signs = []
  for out in _outputs(name, image, magnitude):
    assert np.array_equal(out, plus) or np.array_equal(out, minus)
    signs.append(np.array_equal(out, plus))
  assert 0 < sum(signs) < len(signs)


UNSIGNED = [
  ("AutoContrast", 7, lambda x: _ours(ops.autocontrast, x)),
  ("Equalize", 7, lambda x: _ours(ops.equalize, x)),
  ("Invert", 7, lambda x: _ours(ops.invert, x)),
  ("Posterize", 10, lambda x: _ours(ops.posterize, x, 4)),
  ("Posterize", 15, lambda x: _ours(ops.posterize, x, 6)),
  ("Posterize", 25, lambda x: x.astype(np.int32)),  # 10 bits: capped at 8, the image
  ("Color", 10, lambda x: _ours(ops.color, x, 1.9)),
  ("Contrast", 0, lambda x: _ours(ops.contrast, x, 0.1)),
  ("Brightness", 5, lambda x: _ours(ops.brightness, x, 1.0)),
  ("Sharpness", 20, lambda x: _ours(ops.sharpness, x, 3.7)),
  ("SolarizeAdd", 10, lambda x: _ours(ops.solarize_add, x, 110, 128)),
  ("SolarizeAdd", 5, lambda x: _ours(ops.solarize_add, x, 55, 128)),
]


@pytest.mark.parametrize(
  "name,magnitude,expected", UNSIGNED, ids=[f"{n}-{m}" for n, m, _ in UNSIGNED]
)
def test_unsigned_ops_take_big_vision_arguments(name, magnitude, expected):
  for out in _outputs(name, PHOTOS[2], magnitude, seeds=2):
    np.testing.assert_array_equal(out, expected(PHOTOS[2]))


def test_cutout_half_size_is_four_pixels_per_magnitude():
  image = np.where(PHOTOS[0] == 128, 127, PHOTOS[0]).astype(np.uint8)
  sizes = [(out == 128).all(axis=-1).sum(axis=1).max() for out in _outputs("Cutout", image, 10)]
  assert max(sizes) == 80  # 2 * 40 at magnitude 10 (big_vision's cutout_const 40)


def test_contrast_blends_towards_the_grey_mean_not_hw_over_256():
  # big_vision issue #109: its degenerate image is sum(histogram) / 256 = H * W / 256 (here
  # 96 * 128 / 256 = 48) whatever the image. Ours is the grey image's rounded mean, as
  # PIL's ImageEnhance.Contrast: on a bright image the two are far apart.
  bright = np.clip(PHOTOS[0].astype(int) + 120, 0, 255).astype(np.uint8)
  grey_mean = np.asarray(Image.fromarray(bright).convert("L"), np.float64).mean()
  flat = _ours(ops.contrast, bright, 0.0)
  assert (flat == int(grey_mean + 0.5)).all() and grey_mean > 150


def test_solarize_grows_stronger_with_magnitude_and_inverts_all_at_ten():
  # big_vision issue #110: its threshold int(25.6 m) rises with m and wraps modulo 256 in
  # uint8, so m = 10 inverts everything but m = 9 inverts only pixels >= 230 and m = 15
  # those >= 128. Ours inverts pixels >= 256 - int(25.6 m): none at 0, all from 10 on.
  ramp = np.tile(np.arange(256, dtype=np.uint8)[None, :, None], (2, 1, 3))
  inverted = []
  for magnitude in range(21):  # The policy's threshold at each magnitude.
    threshold = ra.solarize_threshold(float(magnitude))
    assert threshold == max(0, 256 - int(magnitude / 10 * 256))
    table = _ours(
      ops.solarize, np.arange(256, dtype=np.uint8).reshape(1, -1, 1).repeat(3, 2), threshold
    )
    inverted.append(int((table[0, :, 0] != np.arange(256)).sum()))  # 255 - x never equals x
  assert inverted == sorted(inverted) and inverted[0] == 0 and inverted[10] == 256
  for magnitude in (0, 5, 9, 10, 15):  # The table through the batched stages.
    out = _outputs("Solarize", ramp, magnitude, seeds=1)[0]
    threshold = 256 - int(magnitude / 10 * 256)
    np.testing.assert_array_equal(out, _ours(ops.solarize, ramp, max(0, threshold)))


# The policy: random ops keyed by the step's key and the row.


def _single(name: str, image: jax.Array, m: float, negate: bool, centre) -> jax.Array:
  """Op `name` alone at big_vision's argument for magnitude m (the sign from `negate`)."""
  sign, factor = (-1.0 if negate else 1.0), m / 10 * 1.8 + 0.1
  calls = {
    "AutoContrast": lambda: ops.autocontrast(image),
    "Equalize": lambda: ops.equalize(image),
    "Invert": lambda: ops.invert(image),
    "Rotate": lambda: ops.rotate(image, sign * m * 3.0),
    "Posterize": lambda: ops.posterize(image, int(m * 0.4)),
    "Solarize": lambda: ops.solarize(image, max(0, 256 - int(m / 10 * 256))),
    "Color": lambda: ops.color(image, factor),
    "Contrast": lambda: ops.contrast(image, factor),
    "Brightness": lambda: ops.brightness(image, factor),
    "Sharpness": lambda: ops.sharpness(image, factor),
    "ShearX": lambda: ops.shear_x(image, sign * m / 10 * 0.3),
    "ShearY": lambda: ops.shear_y(image, sign * m / 10 * 0.3),
    "TranslateX": lambda: ops.translate_x(image, sign * m * 10.0),
    "TranslateY": lambda: ops.translate_y(image, sign * m * 10.0),
    "Cutout": lambda: ops.cutout(image, int(m * 4), centre),
    "SolarizeAdd": lambda: ops.solarize_add(image, int(m * 11), 128),
  }
  return calls[name]()


BATCH = np.stack([PHOTOS[k % 3] for k in range(12)])  # [12, 96, 128, 3]
_RANDAUGMENT = jax.jit(ra.randaugment, static_argnums=(2, 3))


@pytest.mark.parametrize("magnitude", [10.0, 7.0])
def test_each_image_gets_the_ops_of_its_rounds_in_turn(magnitude):
  key = jax.random.PRNGKey(3)
  out = _RANDAUGMENT(jnp.asarray(BATCH), key, 2, magnitude)
  rounds = jax.tree.map(np.asarray, ra.batch_rounds(key, 2, BATCH.shape))
  assert len(set(rounds.ops.ravel())) > 10  # most ops occur
  for row in range(len(BATCH)):
    expected = jnp.asarray(BATCH[row])
    for k in range(2):
      name = ra.OPS[rounds.ops[row, k]]
      expected = _single(name, expected, magnitude, rounds.negate[row, k], rounds.centre[row, k])
    np.testing.assert_array_equal(out[row], expected)


def test_a_row_is_keyed_by_its_index_in_the_global_batch_alone():
  # Row r's draws come from the key folded with r: the same image gets other ops in
  # another row, and a batch's first rows get the same ops as the batch's.
  key = jax.random.PRNGKey(5)
  whole = ra.batch_rounds(key, 2, (64, 8, 8, 3))
  first = ra.batch_rounds(key, 2, (16, 8, 8, 3))
  for a, b in zip(whole, first):
    np.testing.assert_array_equal(np.asarray(a)[:16], b)
  np.testing.assert_array_equal(
    ra.draw_rounds(jax.random.fold_in(key, 40), 2, 8, 8).ops, whole.ops[40]
  )
  assert len({tuple(np.asarray(row)) for row in whole.ops}) > 40
  other = ra.batch_rounds(jax.random.PRNGKey(6), 2, (64, 8, 8, 3))
  assert (np.asarray(other.ops) != np.asarray(whole.ops)).any(axis=1).mean() > 0.8


def test_ops_are_drawn_uniformly_and_zero_layers_is_the_identity():
  picks = np.asarray(ra.batch_rounds(jax.random.PRNGKey(0), 2, (800, 8, 8, 3)).ops).ravel()
  counts = np.bincount(picks, minlength=len(ra.OPS))
  assert len(ra.OPS) == 16 and counts.min() > 60 and counts.max() < 140  # 100 expected
  images = jnp.asarray(BATCH)
  np.testing.assert_array_equal(ra.randaugment(images, jax.random.PRNGKey(1), 0, 10.0), images)


def test_the_augmenter_takes_the_crops_uint8_values_and_normalises():
  key = jax.random.PRNGKey(3)
  augmented = _RANDAUGMENT(jnp.asarray(BATCH), key, 2, 10.0)  # compiled once for the module
  timm = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
  augment = jax.jit(ra.make_augmenter((2, 10.0), *timm))
  pixels = BATCH.astype(np.float32)  # as the pipeline hands them with RandAugment on
  out = augment({"image": jnp.asarray(pixels), "label": jnp.ones([12, 3])}, key)
  expected = host_images.normalize(np.asarray(augmented), *timm)  # the pipeline's
  np.testing.assert_allclose(out["image"], expected, atol=1e-6)
  np.testing.assert_array_equal(out["label"], np.ones([12, 3]))
  # The official normalisation of every uint8 value, as the pipeline's (to 1 ulp: XLA
  # may divide by 127.5 as a product with its reciprocal).
  values = jnp.arange(256, dtype=jnp.uint8)
  official = ra.normalize(values, (0.5,) * 3, (0.5,) * 3)
  np.testing.assert_allclose(official, host_images.normalize(np.arange(256.0)), atol=1e-7)
  assert ra.make_augmenter(None, (0.5,) * 3, (0.5,) * 3) is None


_DEVICES = """
import json
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from vit_jax.infra import sharding
from vit_jax.data import randaug as ra
images = np.random.default_rng(0).integers(0, 256, (16, 24, 24, 3)).astype(np.float32)
augment = jax.jit(ra.make_augmenter((2, 10.0), (0.5,) * 3, (0.5,) * 3))
out = {}
for name, devices in (("one", jax.devices()[:1]), ("eight", jax.devices())):
  mesh = jax.sharding.Mesh(np.array(devices), ("data",))
  batch = jax.device_put({"image": images}, NamedSharding(mesh, PartitionSpec("data")))
  out[name] = np.asarray(augment(batch, jax.random.PRNGKey(4))["image"]).tolist()
print(json.dumps(out))
"""


def test_the_augmentation_does_not_depend_on_the_device_count():
  # A batch split over 8 devices gets the augmentation it gets on one (each row keyed
  # by its global index); the processes that hold the rows never enter the draws.
  env = fresh_python.clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=8")
  out = fresh_python.run_json(textwrap.dedent(_DEVICES), env, timeout=240)
  np.testing.assert_array_equal(out["one"], out["eight"])


def test_the_train_step_augments_by_the_step_key_alone(tiny_config):
  """A fresh state augments a batch identically at the same step (the key is the state's
  run key and step: resume is exact), and RandAugment changes the update."""
  tiny_config.pp.randaug = (2, 10)
  augmenting = train_fixtures.build_steps(tiny_config)
  tiny_config.pp.randaug = None
  plain = train_fixtures.build_steps(tiny_config)
  pixels = np.round(train_fixtures.fixed_batch()["image"] * 127.5 + 127.5)
  norms = []
  for steps, images in ((augmenting, pixels), (augmenting, pixels), (plain, pixels / 127.5 - 1)):
    b = jax.device_put({**train_fixtures.fixed_batch(), "image": images}, steps.batch_sharding)
    norms.append(float(steps.train_step(steps.init_state(), b)[1]["train/grad_norm"]))
  assert norms[0] == norms[1]
  assert norms[0] != norms[2]


# config.pp.randaug and the train stream with it on.


@pytest.mark.parametrize(
  "value", [(2,), (2, -1), (-1, 10), (2.5, 10), (True, 10), (2, "a"), (2, float("nan"))]
)
def test_bad_randaug_setting_names_the_key(value):
  config = train_fixtures.common_config()
  config.pp.randaug = value
  with pytest.raises(errors.ConfigError, match=r"config\.pp\.randaug=.*\(layers, magnitude\)"):
    data.Settings.from_config(config)


def test_randaug_setting_read_from_a_tuple_or_a_json_list():
  config = train_fixtures.common_config()
  assert data.Settings.from_config(config).randaug is None
  for value in ((2, 10), [2, 10], (1, 7.5)):
    config.pp.randaug = tuple(value)
    assert data.Settings.from_config(config).randaug == (value[0], float(value[1]))
  # A config.json from before RandAugment existed, or a config file setting pp whole.
  older = ml_collections.ConfigDict(config.to_dict())
  older.pp = ml_collections.ConfigDict(dict(crop=16, min_area=0.8, flip=False))
  assert data.Settings.from_config(older).randaug is None
  as_json = ml_collections.ConfigDict(config.to_dict())
  as_json.pp.randaug = [2, 10]  # as a resumed run's config.json gives it back
  assert data.Settings.from_config(as_json).randaug == (2, 10.0)


def test_the_step_reads_the_train_images_as_the_pipeline_wrote_them(digits_dir):
  """One `TrainImages` record at both ends: the pipeline's raw crops (RandAugment on, zero
  layers) through the step's augmenter are its normalised crops (RandAugment off), with
  timm's mean and std, up to the raw crops' rounding to whole values."""
  mesh = sharding.make_mesh((("data", -1), ("model", 1)))
  timm = dict(input_mean=(0.485, 0.456, 0.406), input_std=(0.229, 0.224, 0.225))
  plain = dataclasses.replace(
    data.Settings.from_config(train_fixtures.tiny_config(digits_dir)), **timm
  )
  raw = dataclasses.replace(plain, randaug=(0, 10.0))
  assert plain.train_images.augmenter(mesh) is None and raw.train_images.raw
  batches = [next(data.train_iterator(s, mesh)) for s in (raw, plain)]
  pixels = np.asarray(batches[0]["image"])
  assert pixels.min() >= 0 and pixels.max() <= 255 and (pixels == np.round(pixels)).all()
  decoded = jax.jit(raw.train_images.augmenter(mesh))(batches[0], jax.random.key(0))
  rounding = 0.5 / (255 * min(timm["input_std"]))
  np.testing.assert_allclose(decoded["image"], batches[1]["image"], atol=rounding + 1e-6)
