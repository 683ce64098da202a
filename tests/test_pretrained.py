"""`weights.load_pretrained`: head/pre_logits rules, position-embedding resizing, layouts."""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from vit_jax import weights
from vit_jax.models import create_model, get_model_config
from vit_jax.models.posemb import resize_posemb, resize_posemb_2d
from vit_jax.weights import npz

POSEMB = weights.architecture.POSEMB


def make(
  image_hw: tuple[int, int] = (16, 16),
  num_classes: Optional[int] = 10,
  *,
  real_init: bool = False,
  scan: bool = False,
  seed: int = 0,
  **changes: Any,
):
  """(config, numpy params) of the `testing` model with config ``changes``.

  Arrays are random (seeded; no zero heads that would hide a wrong copy, and quick: only
  the shapes are traced), or with ``real_init`` the model's own initialisation.
  """
  cfg = get_model_config("testing")
  for key, value in changes.items():
    if key == "patch":
      cfg.patches.size = (value, value)
    elif key in ("num_layers", "num_heads", "mlp_dim"):
      cfg.transformer[key] = value
    else:
      cfg[key] = value
  model = create_model(cfg, num_classes=num_classes, scan=scan)
  images = jnp.zeros((1, *image_hw, 3))
  if real_init:
    params = jax.tree.map(np.asarray, nn.unbox(model.init(jax.random.key(seed), images)["params"]))
  else:
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(seed), images)["params"])
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(x.dtype), shapes)
  return cfg, params


def save(tmp_path, params, name: str = "stored.npz") -> str:
  path = os.path.join(tmp_path, name)
  npz.save_npz(path, params)
  return path


def flat(tree) -> dict[str, np.ndarray]:
  return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(tree, sep="/").items()}


def assert_same_tree_and_shapes(result, init):
  fr, fi = flat(result), flat(init)
  assert list(fr) == list(fi)
  for k in fi:
    assert fr[k].shape == fi[k].shape and fr[k].dtype == fi[k].dtype, k


def np_linear_1d(x: np.ndarray, n_out: int, axis: int) -> np.ndarray:
  """Linear resampling along ``axis`` with half-pixel centres, edges clamped (float64)."""
  n_in = x.shape[axis]
  src = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
  lo = np.floor(src).astype(int)
  hi = np.minimum(lo + 1, n_in - 1)
  t = (src - lo).reshape([-1 if a == axis else 1 for a in range(x.ndim)])
  return np.take(x, lo, axis=axis) * (1 - t) + np.take(x, hi, axis=axis) * t


def np_bilinear(grid: np.ndarray, new_hw: tuple[int, int]) -> np.ndarray:
  """[h, w, D] -> [nh, nw, D], separable linear interpolation as jax.image.resize does it."""
  out = np_linear_1d(np.asarray(grid, np.float64), new_hw[0], axis=0)
  return np_linear_1d(out, new_hw[1], axis=1)


# --- Position embeddings -------------------------------------------------------------------


def test_2x_resolution_interpolates_the_grid_and_keeps_the_class_token(tmp_path, caplog):
  cfg, stored = make((16, 16))  # 4x4 grid
  path = save(tmp_path, stored)
  _, init = make((32, 32), seed=1)  # 8x8 grid
  with caplog.at_level(logging.INFO, logger="absl"):  # absl verbosity may be WARNING here
    loaded = weights.load_pretrained(path, init, cfg)
  assert_same_tree_and_shapes(loaded, init)

  pe, pe_stored = flat(loaded)[POSEMB], flat(stored)[POSEMB]
  assert pe.shape == (1, 65, 32)
  np.testing.assert_array_equal(pe[0, 0], pe_stored[0, 0])  # class token's row untouched
  expected = np_bilinear(pe_stored[0, 1:].reshape(4, 4, 32), (8, 8)).reshape(64, 32)
  np.testing.assert_allclose(pe[0, 1:], expected, rtol=0, atol=1e-6)
  assert "bilinear interpolation of the 4x4 grid to 8x8" in caplog.text

  # Everything else, head included (same classes), is the stored value bit for bit.
  for k, v in flat(stored).items():
    if k != POSEMB:
      np.testing.assert_array_equal(flat(loaded)[k], v, err_msg=k)

  bicubic = flat(weights.load_pretrained(path, init, cfg, posemb_resize_method="bicubic"))
  assert bicubic[POSEMB].shape == pe.shape
  np.testing.assert_array_equal(bicubic[POSEMB][0, 0], pe_stored[0, 0])
  assert np.abs(bicubic[POSEMB] - pe).max() > 1e-3


def test_resize_posemb_on_its_own():
  rng = np.random.default_rng(0)
  table = rng.standard_normal((1, 1 + 6 * 4, 8)).astype(np.float32)  # cls + 6x4 grid
  out = resize_posemb(table, (3, 8), num_prefix=1, stored_grid_hw=(6, 4))
  assert out.shape == (1, 1 + 24, 8) and out.dtype == np.float32
  np.testing.assert_array_equal(out[0, 0], table[0, 0])
  np.testing.assert_allclose(
    out[0, 1:], np_bilinear(table[0, 1:].reshape(6, 4, 8), (3, 8)).reshape(24, 8), rtol=0, atol=1e-6
  )
  # Same grid: unchanged; no prefix: every row is grid.
  np.testing.assert_array_equal(resize_posemb(table, (6, 4), 1, stored_grid_hw=(6, 4)), table)
  square = table[:, :16]
  np.testing.assert_allclose(
    resize_posemb(square, (2, 2), 0)[0],
    np_bilinear(square[0].reshape(4, 4, 8), (2, 2)).reshape(4, 8),
    rtol=0,
    atol=1e-6,
  )
  with pytest.raises(ValueError, match="not form a square grid.*stored_grid_hw"):
    resize_posemb(table, (4, 4), num_prefix=1)  # 24 tokens, no grid given
  with pytest.raises(ValueError, match=r"stored_grid_hw=\(5, 5\) has 25 cells"):
    resize_posemb(table, (4, 4), num_prefix=1, stored_grid_hw=(5, 5))


def test_resize_posemb_2d_interpolates_each_table_along_its_axis():
  rng = np.random.default_rng(1)
  pe_x = rng.standard_normal((1, 1, 4, 6)).astype(np.float32)
  pe_y = rng.standard_normal((1, 4, 1, 6)).astype(np.float32)
  x, y = resize_posemb_2d(pe_x, pe_y, (8, 2))
  assert x.shape == (1, 1, 2, 6) and y.shape == (1, 8, 1, 6)
  np.testing.assert_allclose(
    x[0, 0], np_linear_1d(pe_x[0, 0].astype(np.float64), 2, 0), rtol=0, atol=1e-6
  )
  np.testing.assert_allclose(
    y[0, :, 0], np_linear_1d(pe_y[0, :, 0].astype(np.float64), 8, 0), rtol=0, atol=1e-6
  )


def test_non_square_target_grid(tmp_path):
  cfg, stored = make((16, 16))
  path = save(tmp_path, stored)
  _, init = make((32, 16))  # 8x4 grid: 32 tokens, not a square
  with pytest.raises(ValueError, match="new_grid_hw"):
    weights.load_pretrained(path, init, cfg)
  loaded = flat(weights.load_pretrained(path, init, cfg, new_grid_hw=(8, 4)))
  pe_stored = flat(stored)[POSEMB]
  np.testing.assert_array_equal(loaded[POSEMB][0, 0], pe_stored[0, 0])
  np.testing.assert_allclose(
    loaded[POSEMB][0, 1:],
    np_bilinear(pe_stored[0, 1:].reshape(4, 4, 32), (8, 4)).reshape(32, 32),
    rtol=0,
    atol=1e-6,
  )

  # A non-square stored grid back to a square one needs stored_grid_hw.
  cfg_ns, stored_ns = make((32, 16))
  path_ns = save(tmp_path, stored_ns, "non_square.npz")
  with pytest.raises(ValueError, match=f"{path_ns}.*stored_grid_hw"):
    weights.load_pretrained(path_ns, make((16, 16))[1], cfg_ns)
  back = flat(weights.load_pretrained(path_ns, make((16, 16))[1], cfg_ns, stored_grid_hw=(8, 4)))
  np.testing.assert_allclose(
    back[POSEMB][0, 1:],
    np_bilinear(flat(stored_ns)[POSEMB][0, 1:].reshape(8, 4, 32), (4, 4)).reshape(16, 32),
    rtol=0,
    atol=1e-6,
  )


def test_gap_models_and_class_token_conversions(tmp_path, caplog):
  cfg_gap, stored_gap = make((16, 16), classifier="gap")
  cfg_tok, stored_tok = make((16, 16), classifier="token")
  path_gap = save(tmp_path, stored_gap, "gap.npz")
  path_tok = save(tmp_path, stored_tok, "token.npz")
  _, init_gap = make((32, 32), classifier="gap", seed=1)
  _, init_tok = make((32, 32), classifier="token", seed=1)

  # gap -> gap: all 16 rows are grid.
  loaded = flat(weights.load_pretrained(path_gap, init_gap, cfg_gap))
  assert loaded[POSEMB].shape == (1, 64, 32) and "cls" not in loaded
  np.testing.assert_allclose(
    loaded[POSEMB][0],
    np_bilinear(flat(stored_gap)[POSEMB][0].reshape(4, 4, 32), (8, 8)).reshape(64, 32),
    rtol=0,
    atol=1e-6,
  )

  # token -> gap: class token and its row dropped, the grid interpolated.
  with caplog.at_level(logging.INFO, logger="absl"):  # absl verbosity may be WARNING here
    loaded = weights.load_pretrained(path_tok, init_gap, cfg_gap)
  assert_same_tree_and_shapes(loaded, init_gap)
  np.testing.assert_allclose(
    flat(loaded)[POSEMB][0],
    np_bilinear(flat(stored_tok)[POSEMB][0, 1:].reshape(4, 4, 32), (8, 8)).reshape(64, 32),
    rtol=0,
    atol=1e-6,
  )
  assert "dropped the stored class token" in caplog.text

  # gap -> token: the fresh class token and class-token row, the grid interpolated.
  loaded = flat(weights.load_pretrained(path_gap, init_tok, cfg_tok))
  np.testing.assert_array_equal(loaded["cls"], flat(init_tok)["cls"])
  np.testing.assert_array_equal(loaded[POSEMB][0, 0], flat(init_tok)[POSEMB][0, 0])
  np.testing.assert_allclose(
    loaded[POSEMB][0, 1:],
    np_bilinear(flat(stored_gap)[POSEMB][0].reshape(4, 4, 32), (8, 8)).reshape(64, 32),
    rtol=0,
    atol=1e-6,
  )


def test_learn_2d_tables_are_resized_in_1d(tmp_path):
  cfg, stored = make((16, 16), posemb="learn_2d")
  path = save(tmp_path, stored)
  _, init = make((32, 16), posemb="learn_2d")  # grid 8x4
  loaded = flat(weights.load_pretrained(path, init, cfg))
  assert_same_tree_and_shapes(traverse_util.unflatten_dict(loaded, sep="/"), init)
  s = flat(stored)
  np.testing.assert_array_equal(
    loaded[weights.architecture.POSEMB_X], s[weights.architecture.POSEMB_X]
  )
  np.testing.assert_allclose(
    loaded[weights.architecture.POSEMB_Y][0, :, 0],
    np_linear_1d(s[weights.architecture.POSEMB_Y][0, :, 0].astype(np.float64), 8, 0),
    rtol=0,
    atol=1e-6,
  )


# --- Head and representation layer ---------------------------------------------------------


def test_head_rules(tmp_path):
  cfg, stored = make()
  path = save(tmp_path, stored)
  stored_head = flat(stored)["head/kernel"]

  same = flat(weights.load_pretrained(path, make(seed=1)[1], cfg))
  np.testing.assert_array_equal(same["head/kernel"], stored_head)
  np.testing.assert_array_equal(same["head/bias"], flat(stored)["head/bias"])

  # Another class count: the model's own zero-initialised head.
  _, init3 = make(num_classes=3, real_init=True, seed=1)
  loaded = flat(weights.load_pretrained(path, init3, cfg))
  assert loaded["head/kernel"].shape == (32, 3)
  assert not loaded["head/kernel"].any() and not loaded["head/bias"].any()
  np.testing.assert_array_equal(loaded["cls"], flat(stored)["cls"])  # the rest is loaded

  # reset_head: init_params' head (random here, so equality shows where it came from).
  _, init = make(seed=1)
  loaded = flat(weights.load_pretrained(path, init, cfg, reset_head=True))
  for k in ("head/kernel", "head/bias"):
    np.testing.assert_array_equal(loaded[k], flat(init)[k], err_msg=k)
  np.testing.assert_array_equal(loaded["cls"], flat(stored)["cls"])

  _, headless = make(num_classes=None, seed=1)
  loaded = weights.load_pretrained(path, headless, cfg)
  assert "head" not in loaded
  assert_same_tree_and_shapes(loaded, headless)


def test_representation_rules(tmp_path, caplog):
  cfg_r16, stored = make(representation_size=16)
  path = save(tmp_path, stored)
  s = flat(stored)

  # Same size: kept, and the head on top of it too.
  loaded = flat(weights.load_pretrained(path, make(representation_size=16, seed=1)[1], cfg_r16))
  for k in ("pre_logits/kernel", "pre_logits/bias", "head/kernel"):
    np.testing.assert_array_equal(loaded[k], s[k], err_msg=k)

  # None: dropped; the head's input changed, so the head is fresh.
  cfg_none, init_none = make(seed=1)
  with caplog.at_level(logging.INFO, logger="absl"):  # absl verbosity may be WARNING here
    loaded = weights.load_pretrained(path, init_none, cfg_none)
  assert "pre_logits" not in loaded
  assert_same_tree_and_shapes(loaded, init_none)
  np.testing.assert_array_equal(flat(loaded)["head/kernel"], flat(init_none)["head/kernel"])
  assert "dropped the representation layer pre_logits (size 16)" in caplog.text

  # Another size: the fresh layer (and head) from init_params.
  cfg_r24, init_r24 = make(representation_size=24, seed=1)
  loaded = flat(weights.load_pretrained(path, init_r24, cfg_r24))
  for k in ("pre_logits/kernel", "pre_logits/bias", "head/kernel", "head/bias"):
    np.testing.assert_array_equal(loaded[k], flat(init_r24)[k], err_msg=k)
  np.testing.assert_array_equal(loaded["embedding/kernel"], s["embedding/kernel"])


# --- Layouts and errors --------------------------------------------------------------------


def test_scanned_npz_into_per_layer_model_and_back(tmp_path):
  cfg, stored = make()  # per-layer
  scanned_tree = npz.layers_to_scanned(stored)
  scanned_path = os.path.join(tmp_path, "scanned.npz")
  # A big_vision-style file.
  np.savez(scanned_path, **traverse_util.flatten_dict(scanned_tree, sep="/"))
  per_layer_path = save(tmp_path, stored, "per_layer.npz")

  loaded = weights.load_pretrained(scanned_path, make(seed=1)[1], cfg)
  assert not npz.is_scanned(loaded)
  for k, v in flat(stored).items():
    np.testing.assert_array_equal(flat(loaded)[k], v, err_msg=k)

  _, init_scanned = make(scan=True, seed=1)
  loaded = weights.load_pretrained(per_layer_path, init_scanned, cfg)
  assert_same_tree_and_shapes(loaded, init_scanned)
  for k, v in flat(scanned_tree).items():
    np.testing.assert_array_equal(flat(loaded)[k], v, err_msg=k)


def test_mismatched_architecture_is_one_error_listing_each_difference(tmp_path):
  cfg, stored = make()
  path = save(tmp_path, stored)
  cfg_big, init_big = make(
    (32, 32), hidden_size=48, patch=8, num_layers=3, num_heads=4, mlp_dim=96, seed=1
  )
  with pytest.raises(ValueError) as info:
    weights.load_pretrained(path, init_big, cfg_big)
  msg = str(info.value)
  assert path in msg
  assert "patch size: checkpoint (4, 4) vs model (8, 8)" in msg
  assert "width: checkpoint 32 vs model 48" in msg
  assert "depth: checkpoint 2 vs model 3" in msg
  assert "heads: checkpoint 2 vs model 4" in msg
  assert "MLP dim: checkpoint 64 vs model 96" in msg
  assert "Transformer/encoderblock_2/LayerNorm_0/scale" in msg  # the detailed list follows
  assert "head/" not in msg and "Fix:" in msg  # head rules applied first: only real mismatches


def test_bad_arguments_are_named(tmp_path):
  cfg, stored = make()
  path = save(tmp_path, stored)
  with pytest.raises(ValueError, match="'bilinearr'"):
    weights.load_pretrained(path, stored, cfg, posemb_resize_method="bilinearr")
  cfg.representation_size = 8
  with pytest.raises(ValueError, match="pass the config the model was built from"):
    weights.load_pretrained(path, stored, cfg)
  with pytest.raises(FileNotFoundError, match="missing.npz"):
    weights.load_pretrained(os.path.join(tmp_path, "missing.npz"), stored, make()[0])
