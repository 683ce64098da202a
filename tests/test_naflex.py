"""NaFlex inputs to the ViT (`vit_jax.models.naflex`): images at their own aspect ratio as
padded patch sequences, against the square path and big_vision's ``naflex_vit`` (its
forward reproduced in `tests/big_vision_reference.py`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import big_vision_reference as bv
from vit_jax import errors
from vit_jax.data import naflex_images
from vit_jax.models import get_model_config, model_settings, naflex, vit
from vit_jax.models.execution import ExecutionOptions
from vit_jax.weights import big_vision

PATCH = 4


def _patchify(image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """[h * P, w * P, C] -> (patches [h * w, P * P * C] in row-major order, (row, column))."""
  h, w, c = image.shape[0] // PATCH, image.shape[1] // PATCH, image.shape[2]
  patches = image.reshape(h, PATCH, w, PATCH, c).transpose(0, 2, 1, 3, 4)
  rows, columns = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
  return patches.reshape(h * w, -1), np.stack([rows.ravel(), columns.ravel()], axis=-1)


def _batch(images: list[np.ndarray], budget: int) -> naflex.NaFlexPatches:
  """Images padded to ``budget`` patches each."""
  rows = [_patchify(image) for image in images]
  pad = lambda a: np.pad(a, ((0, budget - len(a)), (0, 0)))
  return naflex.NaFlexPatches(
    patches=jnp.asarray(np.stack([pad(p) for p, _ in rows]), jnp.float32),
    coords=jnp.asarray(np.stack([pad(c) for _, c in rows]), jnp.int32),
    mask=jnp.asarray(np.stack([np.arange(budget) < len(p) for p, _ in rows])),
  )


def _images(grids: list[tuple[int, int]], seed: int = 0) -> list[np.ndarray]:
  rng = np.random.default_rng(seed)
  return [rng.uniform(-1, 1, (h * PATCH, w * PATCH, 3)).astype(np.float32) for h, w in grids]


@pytest.mark.parametrize("classifier", ["map", "gap", "token"])
def test_at_the_tables_grid_naflex_is_the_square_model(classifier):
  """Square images at the table's grid, padded: the same logits as the square path."""
  config = get_model_config("testing")
  config.classifier = classifier
  model = vit.VisionTransformer(model_settings(config), 5, ExecutionOptions())
  assert config.patches.size == (PATCH, PATCH)
  images = np.stack(_images([(4, 4), (4, 4)]))
  params = model.init(jax.random.key(0), jnp.asarray(images))
  square = model.apply(params, jnp.asarray(images))
  padded = model.apply(params, _batch(list(images), budget=22))
  np.testing.assert_array_equal(square, padded)


@pytest.mark.parametrize(
  "pool_type, budget, grids",
  # 1:3 and 4:3 in 16 patches; 1:4, 7:4 and square in 36: every image padded
  [("map", 16, [(2, 6), (4, 3)]), ("gap", 36, [(2, 8), (7, 4), (5, 5)])],
)
def test_non_square_images_give_big_visions_naflex_probabilities(
  pool_type, budget, grids, tmp_path
):
  """big_vision's NaFlex tower saved as its `.npz` and read (`weights.big_vision`): the
  reference's probabilities on images of several aspect ratios, each padded."""
  reference = bv.NaFlexViT(
    num_classes=7, width=32, depth=2, mlp_dim=64, num_heads=4, nposemb=4, pool_type=pool_type
  )
  batch = _batch(_images(grids, seed=budget), budget)
  theirs_in = (batch.patches, batch.mask.astype(jnp.int32), *np.moveaxis(batch.coords, -1, 0))
  their_params = reference.init(jax.random.key(1), theirs_in)["params"]
  theirs = jax.nn.softmax(reference.apply({"params": their_params}, theirs_in))

  path = str(tmp_path / "naflex.npz")
  bv.save(path, their_params)
  config, tree, image_size = big_vision.read(path)
  assert image_size == (4 * PATCH, 4 * PATCH)  # the 4x4 table's grid
  config.classifier = pool_type  # 'gap' leaves no trace in the arrays
  model = vit.VisionTransformer(model_settings(config), 7)
  ours = jax.nn.softmax(model.apply({"params": tree}, batch))
  np.testing.assert_allclose(ours, theirs, atol=1e-6)
  assert not np.allclose(ours[0], ours[1], atol=1e-3)  # the images are told apart


def test_positions_resample_the_table_to_each_images_grid():
  """Each image reads the table resized (antialiased bilinear) to its own grid."""
  table = jnp.asarray(np.random.default_rng(0).normal(size=(4, 4, 3)), jnp.float32)
  batch = _batch(_images([(2, 8), (4, 4)]), budget=16)
  positions = naflex.resample_positions(table, batch.grid_hw, batch.coords)  # [2, 16, 3]
  resized = jax.image.resize(table, (2, 8, 3), "bilinear", antialias=True)
  np.testing.assert_allclose(positions[0], resized.reshape(16, 3), atol=1e-6)
  np.testing.assert_allclose(positions[1], table.reshape(16, 3), atol=1e-6)  # its own grid


def test_a_new_model_needs_the_tables_grid_and_a_grid_bound_model_refuses():
  config = get_model_config("testing")
  batch = _batch(_images([(2, 8)]), budget=16)
  model = vit.VisionTransformer(model_settings(config), 5, ExecutionOptions())
  with pytest.raises(errors.ConfigError, match="give posemb_grid"):
    model.init(jax.random.key(0), batch)
  grid_bound = vit.VisionTransformer(
    model_settings(config), 5, ExecutionOptions(), posemb_grid=(4, 4)
  )
  assert grid_bound.init(jax.random.key(0), batch)["params"]
  wide_table = vit.VisionTransformer(model_settings(config), 5, posemb_grid=(2, 6))
  params = wide_table.init(jax.random.key(0), batch)  # 12 rows: no square grid
  with pytest.raises(errors.ConfigError, match="not square: give posemb_grid"):
    model.apply(params, batch)
  assert wide_table.apply(params, batch).shape == (1, 5)
  config.posemb = "sincos2d"
  with pytest.raises(errors.ConfigError, match="learned position table"):
    vit.VisionTransformer(model_settings(config), 5, posemb_grid=(4, 4)).init(
      jax.random.key(0), batch
    )


def test_the_grid_is_big_visions_resize_to_sequence():
  pytest.importorskip("tensorflow")
  sizes = [(500, 200), (120, 640), (224, 224), (37, 1000), (1, 1), (3000, 2000)]
  for patch, budget in ((16, 256), (16, 576), (14, 1024)):
    for hw in sizes:
      theirs = bv.naflex_target_hw(hw, patch, budget)
      assert naflex_images.sequence_grid(hw, patch, budget) == (
        theirs[0] // patch,
        theirs[1] // patch,
      ), (hw, budget)


def test_an_image_becomes_its_grids_patches_padded_to_the_budget():
  image = np.zeros((500, 200, 3), np.uint8)
  image[:250] = 255  # the top half white: the first half of the grid's rows
  patches, coords, mask = naflex_images.to_patches(image, PATCH * 4, 256)
  rows, columns = naflex_images.sequence_grid((500, 200), PATCH * 4, 256)
  n = rows * columns
  assert 200 < n <= 256 and rows > 2 * columns  # the aspect kept, nearly the whole budget
  assert mask.tolist() == [True] * n + [False] * (256 - n)
  np.testing.assert_array_equal(coords[:n], [(r, c) for r in range(rows) for c in range(columns)])
  assert (coords[n:] == 0).all() and (patches[n:] == 0).all()
  np.testing.assert_allclose(patches[: columns * (rows // 2 - 1)], 1.0)  # white, in [-1, 1]
  np.testing.assert_allclose(patches[columns * (rows // 2 + 1) : n], -1.0)  # black
  wide = np.zeros((10, 20000, 3), np.uint8)
  with pytest.raises(errors.ConfigError, match=r"is a 1x\d+ grid; the position table reaches 64"):
    naflex_images.to_patches(wide, 16, 256)


def test_an_images_logits_do_not_depend_on_the_others_in_its_batch():
  """Padding and the other images are masked out: an image alone, or beside one of
  another aspect ratio, at another budget, gets the same logits."""
  config = get_model_config("testing")
  config.classifier = "map"
  model = vit.VisionTransformer(model_settings(config), 5, posemb_grid=(4, 4))
  rng = np.random.default_rng(0)
  tall, wide = (rng.integers(0, 256, hw + (3,), np.uint8) for hw in ((50, 20), (12, 64)))
  alone = naflex.NaFlexPatches.stack([naflex_images.to_patches(tall, PATCH, 16)])
  params = model.init(jax.random.key(0), alone)
  together = naflex.NaFlexPatches.stack(
    [naflex_images.to_patches(x, PATCH, 16) for x in (tall, wide)]
  )
  np.testing.assert_allclose(
    model.apply(params, alone)[0], model.apply(params, together)[0], atol=1e-5
  )
  pad = lambda a: np.pad(a, [(0, 0), (0, 9)] + [(0, 0)] * (a.ndim - 2))  # budget 25
  longer = naflex.NaFlexPatches(*map(pad, (alone.patches, alone.coords, alone.mask)))
  np.testing.assert_allclose(model.apply(params, alone), model.apply(params, longer), atol=1e-5)
