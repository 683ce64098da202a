"""NaFlex inputs to the ViT (`vit_jax.models.naflex`): images at their own aspect ratio as
padded patch sequences, against the square path and big_vision's ``naflex_vit`` (its
forward reproduced in `tests/big_vision_reference.py`)."""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import big_vision_reference as bv
from tests import interop_fixtures as fx
from vit_jax.data import naflex_images
from vit_jax.infra import errors
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
  their_params = jax.jit(reference.init)(jax.random.key(1), theirs_in)["params"]
  theirs = jax.nn.softmax(jax.jit(reference.apply)({"params": their_params}, theirs_in))

  path = str(tmp_path / "naflex.npz")
  bv.save(path, their_params)
  config, tree, image_size = big_vision.read(path)
  assert image_size == (4 * PATCH, 4 * PATCH)  # the 4x4 table's grid
  config = config.replace(classifier=pool_type)  # 'gap' leaves no trace in the arrays
  model = vit.VisionTransformer(config, 7)
  ours = jax.nn.softmax(jax.jit(model.apply)({"params": tree}, batch))
  np.testing.assert_allclose(ours, theirs, atol=1e-6)
  assert not np.allclose(ours[0], ours[1], atol=1e-3)  # the images are told apart


def test_a_naflex_tower_exports_as_big_visions_naflex_vit(tmp_path):
  """big_vision's NaFlex tower read (its table's grid as ``posemb_grid``) and exported as
  big_vision: the file holds ``naflex_vit``'s layout (a Dense on flattened patches, the
  [n, n, D] table) and big_vision's forward of it gives the original's probabilities;
  a table that big_vision does not resize so (keeping the aspect) is written at a grid."""
  import vit_jax  # pylint: disable=g-import-not-at-top

  reference = bv.NaFlexViT(
    num_classes=7, width=32, depth=1, mlp_dim=64, num_heads=4, nposemb=4, pool_type="map"
  )
  batch = _batch(_images([(2, 6), (4, 3)], seed=5), 16)
  theirs_in = (batch.patches, batch.mask.astype(jnp.int32), *np.moveaxis(batch.coords, -1, 0))
  their_params = reference.init(jax.random.key(2), theirs_in)["params"]
  want = jax.nn.softmax(reference.apply({"params": their_params}, theirs_in))
  bv.save(str(tmp_path / "naflex.npz"), their_params)
  model = vit_jax.load(str(tmp_path / "naflex.npz"))
  assert tuple(model.config.posemb_grid) == (4, 4)
  folder = model.save(str(tmp_path / "exported"), format="big_vision")
  written = bv.load_params(os.path.join(folder, "model.npz"))
  assert written["embedding"]["kernel"].shape == (PATCH * PATCH * 3, 32)
  assert written["pos_embedding"].shape == (4, 4, 32)
  got = jax.nn.softmax(reference.apply({"params": written}, theirs_in))
  np.testing.assert_allclose(got, want, atol=1e-6)

  # timm's pos_embed_ar_preserving
  aspect = model.loaded.config.replace(posemb_keep_aspect=True)
  model = vit_jax.Model(dataclasses.replace(model.loaded, config=aspect))
  folder = model.save(str(tmp_path / "fixed"), format="big_vision")
  fixed = bv.load_params(os.path.join(folder, "model.npz"))
  assert fixed["pos_embedding"].shape[0] == 1 and fixed["embedding"]["kernel"].ndim == 4


@pytest.mark.parametrize("budget", [256, 576])
def test_photos_at_a_budget_give_big_visions_naflex_probabilities(budget, tmp_path):
  """A 500x200 and a 120x640 photo as `naflex_images.to_patches` cuts them (16-pixel
  patches): big_vision's NaFlex tower's probabilities, its 8x8 table resampled to each."""
  reference = bv.NaFlexViT(
    num_classes=7, width=32, depth=1, mlp_dim=64, num_heads=4, nposemb=8, pool_type="map"
  )
  photos = [fx.photo(500, 200, seed=1), fx.photo(120, 640, seed=2)]
  batch = naflex.NaFlexPatches.stack([naflex_images.to_patches(p, 16, budget) for p in photos])
  theirs_in = (batch.patches, batch.mask.astype(jnp.int32), *np.moveaxis(batch.coords, -1, 0))
  their_params = jax.jit(reference.init)(jax.random.key(1), theirs_in)["params"]
  theirs = jax.nn.softmax(jax.jit(reference.apply)({"params": their_params}, theirs_in))
  bv.save(str(tmp_path / "naflex.npz"), their_params)
  config, tree, _ = big_vision.read(str(tmp_path / "naflex.npz"))
  model = vit.VisionTransformer(model_settings(config), 7)
  ours = jax.nn.softmax(jax.jit(model.apply)({"params": tree}, batch))
  np.testing.assert_allclose(ours, theirs, atol=1e-4)
  assert np.abs(ours[0] - ours[1]).max() > 1e-3  # the images are told apart


def test_a_fused_attention_masks_naflex_padding_by_length():
  """`jax.nn.dot_product_attention` ('xla' here; 'cudnn' on a GPU takes the same
  lengths as its padding mask) gives the einsum path's features and gradients on padded
  NaFlex inputs: the padding is masked by each image's length, not attended to."""
  config = get_model_config("testing")
  config.classifier, config.posemb_grid = "gap", (4, 4)
  batch = _batch(_images([(2, 5), (4, 3)]), budget=17)  # odd: padded again to even
  models = {
    impl: vit.VisionTransformer(model_settings(config), None, ExecutionOptions(attention_impl=impl))
    for impl in ("einsum", "xla")
  }
  params = jax.jit(models["einsum"].init)(jax.random.key(0), batch)
  loss = lambda impl: lambda p: jnp.sin(models[impl].apply(p, batch)).sum()
  value = {impl: jax.jit(jax.value_and_grad(loss(impl)))(params) for impl in models}
  np.testing.assert_allclose(value["xla"][0], value["einsum"][0], rtol=1e-5)
  for fused, einsum in zip(*(jax.tree.leaves(value[i][1]) for i in models)):
    np.testing.assert_allclose(fused, einsum, rtol=1e-4, atol=1e-6)
  unmasked = batch.replace(mask=jnp.ones_like(batch.mask))  # the padding attended to
  apply = jax.jit(models["xla"].apply)
  assert not np.allclose(apply(params, unmasked), apply(params, batch))


def test_positions_resample_the_table_to_each_images_grid():
  """Each image reads the table resized (antialiased bilinear) to its own grid."""
  table = jnp.asarray(np.random.default_rng(0).normal(size=(4, 4, 3)), jnp.float32)
  batch = _batch(_images([(2, 8), (4, 4)]), budget=16)
  positions = naflex.resample_positions(table, batch.grid_hw, batch.coords)  # [2, 16, 3]
  resized = jax.image.resize(table, (2, 8, 3), "bilinear", antialias=True)
  np.testing.assert_allclose(positions[0], resized.reshape(16, 3), atol=1e-6)
  np.testing.assert_allclose(positions[1], table.reshape(16, 3), atol=1e-6)  # its own grid


def _with(config, **fields):
  config = config.copy_and_resolve_references()
  config.update(fields)
  return config


def test_a_new_model_needs_the_tables_grid_and_a_one_grid_model_refuses():
  config = get_model_config("testing")
  batch = _batch(_images([(2, 8)]), budget=16)
  model = vit.VisionTransformer(model_settings(config), 5, ExecutionOptions())
  # Traced (jit): the errors are raised while tracing, as in an eager call.
  with pytest.raises(errors.ConfigError, match="give config.model.posemb_grid"):
    jax.jit(model.init)(jax.random.key(0), batch)
  grid_bound = vit.VisionTransformer(model_settings(_with(config, posemb_grid=(4, 4))), 5)
  bound_params = jax.jit(grid_bound.init)(jax.random.key(0), batch)
  assert bound_params["params"]
  wide_table = vit.VisionTransformer(model_settings(_with(config, posemb_grid=(2, 6))), 5)
  params = jax.jit(wide_table.init)(jax.random.key(0), batch)  # 12 rows: no square grid
  with pytest.raises(errors.ConfigError, match="not square: give config.model.posemb_grid"):
    jax.jit(model.apply)(params, batch)
  assert jax.jit(wide_table.apply)(params, batch).shape == (1, 5)
  one_grid = vit.VisionTransformer(model_settings(_with(config, posemb_resample=None)), 5)
  with pytest.raises(
    errors.ConfigError, match="resized to each image's grid .* not a table read at one grid"
  ):
    jax.jit(one_grid.apply)(bound_params, batch)
  with pytest.raises(errors.ConfigError, match="posemb_grid=\\(4, 4\\): a table resized"):
    model_settings(_with(config, posemb="sincos2d", posemb_grid=(4, 4)))
  with pytest.raises(errors.ConfigError, match="posemb_resample='nearest': one of"):
    model_settings(_with(config, posemb_resample="nearest"))


def test_a_table_at_its_own_grid_is_resized_to_square_inputs_as_to_naflex_ones():
  """A table stored at 4x4 (``posemb_grid``) meets 6x6 images resized as a NaFlex 6x6
  image's, and a 4x4 image unchanged; timm's keep-aspect resize is the longer side's."""
  config = _with(get_model_config("testing"), posemb_grid=(4, 4), posemb_resample="bicubic")
  model = vit.VisionTransformer(model_settings(config), 5)
  images = np.stack(_images([(6, 6), (6, 6)]))
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), jnp.asarray(images)))
  assert params["params"]["Transformer"]["posembed_input"]["pos_embedding"].shape[1] == 17
  apply = jax.jit(model.apply)
  np.testing.assert_allclose(
    apply(params, jnp.asarray(images)), apply(params, _batch(list(images), 40)), atol=1e-5
  )
  table = jnp.asarray(np.random.default_rng(0).normal(size=(4, 4, 3)), jnp.float32)
  wide = naflex.TableResample("bicubic", keep_aspect=True).resize(table, (2, 6), (2, 6))
  square = jax.image.resize(table, (6, 6, 3), "bicubic", antialias=True)
  np.testing.assert_allclose(wide, square[:2], atol=1e-5)


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
  config.posemb_grid = (4, 4)
  model = vit.VisionTransformer(model_settings(config), 5)
  rng = np.random.default_rng(0)
  tall, wide = (rng.integers(0, 256, hw + (3,), np.uint8) for hw in ((50, 20), (12, 64)))
  alone = naflex.NaFlexPatches.stack([naflex_images.to_patches(tall, PATCH, 16)])
  params = jax.jit(model.init)(jax.random.key(0), alone)
  together = naflex.NaFlexPatches.stack(
    [naflex_images.to_patches(x, PATCH, 16) for x in (tall, wide)]
  )
  apply = jax.jit(model.apply)
  np.testing.assert_allclose(apply(params, alone)[0], apply(params, together)[0], atol=1e-5)
  pad = lambda a: np.pad(a, [(0, 0), (0, 9)] + [(0, 0)] * (a.ndim - 2))  # budget 25
  longer = naflex.NaFlexPatches(*map(pad, (alone.patches, alone.coords, alone.mask)))
  np.testing.assert_allclose(apply(params, alone), apply(params, longer), atol=1e-5)


# timm's NaFlexViT on its own patch-dict input (interop): bicubic table with registers and
# masked average pooling; bilinear with the MAP head; the aspect-preserving table.
TIMM_NAFLEX = ["naflexvit_base_patch16_gap", "naflexvit_base_patch16_siglip"]
TIMM_NAFLEX += ["naflexvit_base_patch16_par_gap"]


@pytest.mark.parametrize("name", TIMM_NAFLEX)
def test_non_square_images_give_timms_naflexvit_probabilities(tmp_path, name):
  """A timm NaFlexViT hub folder read (`weights.timm.naflex`), at budget 256 (576: the
  export test below), on a 500x200 and a 120x640 image: timm's probabilities on the same
  patches."""
  torch = pytest.importorskip("torch")
  timm = pytest.importorskip("timm")
  pytest.importorskip("safetensors.torch")
  from vit_jax.weights import sources  # pylint: disable=g-import-not-at-top

  args = dict(embed_dim=32, depth=1, num_heads=2, pos_embed_grid_size=(6, 6))
  torch.manual_seed(0)
  theirs = timm.create_model(name, pretrained=False, num_classes=7, **args).eval()
  fx.perturb_torch(theirs)
  config = {
    "architecture": name,
    "num_classes": 7,
    "model_args": {**args, "pos_embed_grid_size": [6, 6]},
  }
  fx.save_timm_hub_folder(tmp_path, theirs, config)
  loaded = sources.load(str(tmp_path))
  module = loaded.module()
  mean, std = loaded.data_config.mean, loaded.data_config.std
  photos = [fx.photo(500, 200, seed=1), fx.photo(120, 640, seed=2)]
  budget = 256
  batch = naflex.NaFlexPatches.stack(
    [naflex_images.to_patches(p, 16, budget, mean, std) for p in photos]
  )
  ours = jax.nn.softmax(module.apply({"params": loaded.params}, batch))
  with torch.no_grad():
    inputs = dict(patches=batch.patches, patch_coord=batch.coords, patch_valid=batch.mask)
    logits = theirs({k: torch.from_numpy(np.array(v)) for k, v in inputs.items()})
  np.testing.assert_allclose(ours, torch.softmax(logits, -1).numpy(), atol=1e-4)
  assert np.abs(ours[0] - ours[1]).max() > 1e-3, budget  # the images told apart


# Ours written as timm's NaFlexViT: a class token (its position row folded into it) with
# big_vision's bilinear table; mean pooling beside registers with timm's bicubic,
# aspect-preserving table; the MAP head.
WRITTEN = [
  ("token", dict(posemb_patches_only=False)),
  ("gap", dict(num_registers=2, posemb_resample="bicubic", posemb_keep_aspect=True)),
  ("map", dict(posemb_resample="bicubic")),
]


@pytest.mark.parametrize("classifier, fields", WRITTEN, ids=[c for c, _ in WRITTEN])
def test_a_naflex_model_exports_as_timms_naflexvit(tmp_path, classifier, fields):
  """`--format=timm` of a ViT whose table is resized to every input: timm's NaFlexViT
  (`local-dir:`) gives our probabilities on a 500x200 and a 120x640 image at budget 576
  (256: the read test above; the same code at another length), and the folder reads back
  as the same model."""
  torch = pytest.importorskip("torch")
  timm = pytest.importorskip("timm")
  import vit_jax  # pylint: disable=g-import-not-at-top

  config = get_model_config("testing")
  config.update(classifier=classifier, posemb_grid=(6, 6), **fields)
  config.patches.size = (16, 16)
  created = vit_jax.create(config, num_classes=7, image_size=96)
  rng = np.random.default_rng(0)
  noisy = jax.tree.map(lambda x: x + rng.normal(0, 0.1, x.shape).astype(x.dtype), created.params)
  ours = vit_jax.Model(dataclasses.replace(created.loaded, params=noisy))
  out = ours.save(tmp_path / "timm", format="timm")
  with open(os.path.join(out, "timm_model.json")) as f:
    assert json.load(f)["model_name"].startswith("naflexvit_")
  theirs = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
  back = vit_jax.load(out)
  photos = [fx.photo(500, 200, seed=1), fx.photo(120, 640, seed=2)]
  budget = 576
  batch = ours.prepare(photos, seq_len=budget)
  want = jax.nn.softmax(ours.logits(batch))
  with torch.no_grad():
    inputs = dict(patches=batch.patches, patch_coord=batch.coords, patch_valid=batch.mask)
    logits = theirs({k: torch.from_numpy(np.array(v)) for k, v in inputs.items()})
  np.testing.assert_allclose(torch.softmax(logits, -1).numpy(), want, atol=1e-4)
  np.testing.assert_allclose(jax.nn.softmax(back.logits(batch)), want, atol=1e-5)
  assert np.abs(want[0] - want[1]).max() > 1e-3, budget  # the images told apart


def test_the_python_face_takes_a_sequence_budget():
  """`Model.features`/`logits`/`predict` with ``seq_len``: each image (a path, an array)
  at its own aspect ratio, batch by batch, as the module computes on its patches."""
  import vit_jax  # pylint: disable=g-import-not-at-top

  config = get_model_config("testing")
  config.posemb_grid = (4, 4)
  created = vit_jax.create(config, num_classes=5, image_size=16)
  model = vit_jax.Model(created.loaded, batch_size=1)  # two batches, one image each
  photos = [fx.photo(50, 20, seed=1), fx.photo(12, 64, seed=2)]
  mean, std = model.data_config.mean, model.data_config.std
  batch = naflex.NaFlexPatches.stack(
    [naflex_images.to_patches(p, PATCH, 16, mean, std) for p in photos]
  )
  want = model.module.apply({"params": model.params}, batch)
  np.testing.assert_allclose(model.logits(photos, seq_len=16), want, atol=1e-5)
  features = model.features(photos, seq_len=16)
  assert features.shape == (2, 32)
  np.testing.assert_allclose(model.features(model.prepare(photos, seq_len=16)), features, atol=1e-6)
  top = model.predict(photos, top_k=2, seq_len=16)
  assert [len(row) for row in top] == [2, 2]
  np.testing.assert_allclose(top[0][0][1], jax.nn.softmax(want[0]).max(), atol=1e-5)


def test_the_predict_command_takes_a_sequence_budget(tmp_path, capsys):
  """``predict --seq_len`` on PNGs of two aspect ratios: `Model.predict`'s probabilities;
  the saved folder (npz and its config) keeps the table at its own grid."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  import vit_jax  # pylint: disable=g-import-not-at-top
  from vit_jax import predict  # pylint: disable=g-import-not-at-top

  config = get_model_config("testing")
  config.posemb_grid = (4, 4)
  model = vit_jax.create(config, num_classes=5, image_size=16)
  folder = model.save(tmp_path / "model")
  reloaded = vit_jax.load(folder)
  assert tuple(reloaded.config.posemb_grid) == (4, 4)
  photos = {"tall.png": fx.photo(50, 20, seed=1), "wide.png": fx.photo(12, 64, seed=2)}
  for name, pixels in photos.items():
    Image.fromarray(pixels).save(tmp_path / name)
  files = [str(tmp_path / name) for name in photos]
  argv = ["predict", f"--checkpoint={folder}/model.npz", "--seq_len=16", "--top_k=2", "--json"]
  assert predict.main(argv + files) == 0
  rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  want = model.predict(list(photos.values()), top_k=2, seq_len=16)
  for row, top in zip(rows, want):
    got = [(t["label"], t["probability"]) for t in row["top_k"]]
    assert [label for label, _ in got] == [label for label, _ in top]
    np.testing.assert_allclose([p for _, p in got], [p for _, p in top], atol=1e-5)
  assert predict.main(argv[:2] + ["--seq_len=0"] + files) == 2
  assert "--seq_len=0 must be at least 1" in capsys.readouterr().err


def test_a_naflex_run_trains_on_packed_patches_evaluates_as_predict_and_resumes_exactly(
  tmp_path, tiny_config, monkeypatch
):
  """config.pp.seq_len=9: the pipeline packs each digit (train: its inception window at
  its own aspect ratio) into 9 patches; the eval batches are each test image's patches in
  the split's order, the run's accuracy is `Model.predict`'s at seq_len=9 on the test
  images, and a run stopped after step 4 resumes to the uninterrupted run's parameters."""
  import vit_jax  # pylint: disable=g-import-not-at-top
  from tests.test_main import assert_resume_is_exact  # pylint: disable=g-import-not-at-top
  from vit_jax import data, run  # pylint: disable=g-import-not-at-top
  from vit_jax.data import digits, host_images  # pylint: disable=g-import-not-at-top
  from vit_jax.infra.sharding import make_mesh  # pylint: disable=g-import-not-at-top

  tiny_config.pp.seq_len = 9
  settings = data.Settings.from_config(tiny_config)
  assert settings.image_shape == (9, PATCH * PATCH * 3 + 3)
  pngs, labels = digits.DigitsArrays().rows("test", 0, digits.NUM_TEST)
  mesh = make_mesh((("data", -1), ("model", 1)))
  first = next(iter(data.eval_iterator(tiny_config, mesh)))
  half = (0.5,) * 3  # the quickstart's mean and std
  want = [settings.naflex.pack_into(host_images.decode(p), half, half, None) for p in pngs[:64]]
  np.testing.assert_array_equal(np.asarray(first["image"]), np.stack(want))

  straight_dir = str(tmp_path / "straight")
  straight = run.train_and_evaluate(tiny_config, straight_dir)
  images = [host_images.decode(p) for p in pngs]
  trained = vit_jax.load(straight_dir)
  top = trained.predict(images, top_k=1, seq_len=9)
  accuracy = np.mean([int(row[0][0]) == label for row, label in zip(top, labels)])
  assert straight["eval/accuracy"] == pytest.approx(accuracy, abs=1e-6)
  # Exported to timm, the run is a NaFlexViT (its table resized as in training).
  exported = vit_jax.load(trained.save(tmp_path / "timm", format="timm"))
  assert tuple(exported.config.posemb_grid) == (2, 2)
  want = trained.logits(images[:8], seq_len=9)
  np.testing.assert_allclose(exported.logits(images[:8], seq_len=9), want, atol=1e-5)
  assert_resume_is_exact(tiny_config, tmp_path, monkeypatch, (straight_dir, straight))


def test_a_naflex_run_of_a_model_without_a_resizable_table_is_one_error(tiny_config):
  """config.pp.seq_len is checked with the model and the augmentation when the run is
  resolved, before anything is built or written."""
  from vit_jax import run  # pylint: disable=g-import-not-at-top
  from vit_jax.infra.sharding import make_mesh  # pylint: disable=g-import-not-at-top

  mesh = make_mesh((("data", -1), ("model", 1)))
  tiny_config.num_classes = 10  # the data is not opened
  tiny_config.pp.seq_len = 9
  tiny_config.model.posemb = "sincos2d"
  with pytest.raises(
    errors.ConfigError, match=r"seq_len=9 \(NaFlex inputs\) take .* not 'sincos2d'"
  ):
    run.resolve(tiny_config, mesh=mesh, open_data=False)
  tiny_config.model.posemb = "learn"
  tiny_config.pp.randaug = (2, 10.0)
  with pytest.raises(errors.ConfigError, match="RandAugment augments square crops"):
    run.resolve(tiny_config, mesh=mesh, open_data=False)
  tiny_config.pp.randaug = None
  tiny_config.mixup.p = 0.5
  with pytest.raises(errors.ConfigError, match="NaFlex rows of different grids do not blend"):
    run.resolve(tiny_config, mesh=mesh, open_data=False)
