"""Known-answer tests of `vit_jax.api.analysis` (paper Fig. 6-7 analyses) on tiny models."""

import itertools
import math

import flax.linen as nn
import jax
import numpy as np
import pytest

from vit_jax.api import analysis
from vit_jax.models import create_model, get_model_config
from vit_jax.models.settings import PatchSettings, ResNetSettings
from vit_jax.weights import npz


def tiny(**overrides):
  return create_model(get_model_config("testing"), num_classes=10, **overrides)


def init(model, image_hw=(16, 16), batch=2, seed=0):
  images = jax.random.uniform(jax.random.key(seed + 1), (batch, *image_hw, 3), minval=-1, maxval=1)
  params = nn.unbox(model.init(jax.random.key(seed), images)["params"])
  return params, np.asarray(images)


def hybrid(**overrides):
  # Root only (stride 4) and 2x2 patches: 8 pixels per token.
  return tiny(resnet=ResNetSettings((), 0.5), patches=PatchSettings((2, 2)), **overrides)


# ------------------------------------------------------------------- attention weights


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_attention_weights_scan_matches_per_layer(classifier):
  model = tiny(classifier=classifier)
  params, images = init(model, image_hw=(8, 12))
  per_layer = analysis.attention_weights(model, params, images)
  scanned = analysis.attention_weights(
    tiny(classifier=classifier, scan=True), npz.layers_to_scanned(params), images
  )
  n = 2 * 3 + (classifier == "token")
  assert per_layer.shape == (2, 2, 2, n, n)  # [L, B, H, N, N]
  np.testing.assert_allclose(per_layer.sum(-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(scanned, per_layer, atol=1e-6)
  # The layers are really different (the stacking did not duplicate one layer).
  assert not np.allclose(per_layer[0], per_layer[1], atol=1e-4)


def test_attention_weights_rejects_bad_image_size():
  model = tiny()
  params, _ = init(model)
  with pytest.raises(ValueError, match="multiple of"):
    analysis.attention_weights(model, params, np.zeros((1, 10, 16, 3), np.float32))


# --------------------------------------------------------------------- attention rollout


def test_rollout_of_identity_attention_is_identity():
  weights = np.broadcast_to(np.eye(5), (3, 2, 4, 5, 5))  # [L, B, H, N, N]
  np.testing.assert_allclose(
    analysis.rollout_matrix(weights), np.broadcast_to(np.eye(5), (2, 5, 5)), atol=1e-12
  )


def test_rollout_two_layers_by_hand():
  # Layer 1, two heads, mean [[.5, .5], [.5, .5]]; + I, renormalised: [[.75, .25], [.25, .75]].
  layer1 = np.array([[[1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0], [0.5, 0.5]]])
  # Layer 2, both heads [[1, 0], [1, 0]]; + I, renormalised: [[1, 0], [.5, .5]].
  layer2 = np.array([[[1.0, 0.0], [1.0, 0.0]]] * 2)
  weights = np.stack([layer1, layer2])[:, None]  # [L=2, B=1, H=2, N=2, N=2]
  # R = A2 @ A1 = [[.75, .25], [.5, .5]]  (A1 @ A2 would give [[.875, .125], [.625, .375]]).
  expected = np.array([[0.75, 0.25], [0.5, 0.5]])
  np.testing.assert_allclose(analysis.rollout_matrix(weights)[0], expected, atol=1e-12)


def test_attention_rollout_class_row_and_gap_mean():
  # One layer, one head, class token + a 1x2 grid: row 0 of (A + I)/2 is [.6, .1, .3].
  a = np.array([[0.2, 0.2, 0.6], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
  rollout = analysis.attention_rollout(a[None, None, None], num_prefix=1, grid_hw=(1, 2))
  np.testing.assert_allclose(rollout, [[[0.1, 0.3]]], atol=1e-12)
  # No class token: (A + I)/2 = [[.75, .25], [0, 1]]; mean over output rows [.375, .625].
  a = np.array([[0.5, 0.5], [0.0, 1.0]])
  rollout = analysis.attention_rollout(a[None, None, None], num_prefix=0, grid_hw=(2, 1))
  np.testing.assert_allclose(rollout, [[[0.375], [0.625]]], atol=1e-12)


def test_attention_rollout_rejects_wrong_grid():
  with pytest.raises(ValueError, match="grid_hw"):
    analysis.attention_rollout(np.ones((1, 1, 1, 5, 5)) / 5, num_prefix=1, grid_hw=(2, 3))


def test_resize_map_range_and_orientation():
  m = np.array([[0.0, 1.0], [2.0, 3.0]])
  resized = analysis.resize_map(m, (8, 6))
  assert resized.shape == (8, 6)
  assert resized.min() == 0.0 and resized.max() == 1.0
  assert resized[0, 0] == 0.0 and resized[-1, -1] == 1.0  # corners keep their order
  assert resized[-1, 0] > resized[0, -1]  # rows (2, 3) outrank columns (1, 3)
  np.testing.assert_array_equal(analysis.resize_map(np.full((2, 2), 0.3), (4, 4)), 1.0)


# -------------------------------------------------------------- mean attention distance


def _mean_pairwise_centre_distance(gh, gw, ph, pw):
  centres = [((r + 0.5) * ph, (c + 0.5) * pw) for r in range(gh) for c in range(gw)]
  total = sum(math.dist(p, q) for p, q in itertools.product(centres, centres))
  return total / len(centres) ** 2


@pytest.mark.parametrize("num_prefix", [0, 1])
def test_mean_attention_distance_uniform_attention(num_prefix):
  gh, gw, ph, pw = 2, 3, 16, 8
  n = gh * gw + num_prefix
  weights = np.full((2, 3, 4, n, n), 1.0 / n)  # [L, B, H, N, N]
  dist = analysis.mean_attention_distance(
    weights, grid_hw=(gh, gw), patch_px=(ph, pw), num_prefix=num_prefix
  )
  assert dist.shape == (2, 4)
  np.testing.assert_allclose(dist, _mean_pairwise_centre_distance(gh, gw, ph, pw), rtol=1e-12)


def test_mean_attention_distance_identity_is_zero_and_prefix_is_renormalised():
  n = 1 + 3 * 3
  weights = np.broadcast_to(np.eye(n), (2, 1, 2, n, n))
  dist = analysis.mean_attention_distance(weights, grid_hw=(3, 3), patch_px=(16, 16), num_prefix=1)
  np.testing.assert_array_equal(dist, 0.0)
  # Half of every query's mass on the class token, half on its right neighbour (16 px)
  # or, in the last column, its left neighbour: the distance counts only patches -> 16.
  w = np.zeros((1, 1, 1, n, n))
  w[..., :, 0] = 0.5
  for q in range(9):
    r, c = divmod(q, 3)
    w[0, 0, 0, 1 + q, 1 + r * 3 + (c + 1 if c < 2 else c - 1)] = 0.5
  dist = analysis.mean_attention_distance(w, grid_hw=(3, 3), patch_px=(16, 16), num_prefix=1)
  np.testing.assert_allclose(dist, [[16.0]])


def test_mean_attention_distance_of_a_model_is_bounded():
  model = tiny()
  params, images = init(model)
  weights = analysis.attention_weights(model, params, images)
  dist = analysis.mean_attention_distance(
    weights, grid_hw=model.grid_hw((16, 16)), patch_px=model.input_stride, num_prefix=1
  )
  assert dist.shape == (2, 2)
  assert np.all(dist > 0) and np.all(dist < math.hypot(12, 12))


# ------------------------------------------------------------ position-embedding similarity


def test_sincos_similarity_peaks_at_self_and_falls_off():
  model = tiny(posemb="sincos2d")
  params, _ = init(model)
  sim = analysis.posemb_similarity(params, model, image_hw=(32, 32))  # 8x8 grid
  assert sim.shape == (8, 8, 8, 8)
  for r, c in itertools.product(range(8), range(8)):
    np.testing.assert_allclose(sim[r, c, r, c], 1.0, atol=1e-6)
    assert np.unravel_index(sim[r, c].argmax(), (8, 8)) == (r, c)
  # Along a row, nearby patches: strictly less similar with each step away.
  row = sim[3, 0, 3, :4]
  assert np.all(np.diff(row) < 0), row
  col = sim[0, 5, :4, 5]
  assert np.all(np.diff(col) < 0), col


def _cos(u, v):
  return float(np.dot(u, v) / np.linalg.norm(u) / np.linalg.norm(v))


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_learned_1d_similarity_drops_class_row(classifier):
  model = tiny(classifier=classifier)
  params, _ = init(model, image_hw=(8, 12))  # 2x3 grid
  table = np.asarray(params["Transformer"]["posembed_input"]["pos_embedding"])[0]
  patches = table[1:] if classifier == "token" else table  # [6, D]
  sim = analysis.posemb_similarity(params, model, image_hw=(8, 12))
  assert sim.shape == (2, 3, 2, 3)
  np.testing.assert_allclose(sim[0, 2, 1, 0], _cos(patches[2], patches[3]), atol=1e-6)
  np.testing.assert_allclose(sim[1, 1, 0, 1], _cos(patches[4], patches[1]), atol=1e-6)
  with pytest.raises(ValueError, match="square"):
    analysis.posemb_similarity(params, model)  # 6 patches: needs image_hw


def test_learned_2d_similarity():
  model = tiny(posemb="learn_2d")
  params, _ = init(model, image_hw=(8, 12))
  pe = params["Transformer"]["posembed_input"]
  x, y = np.asarray(pe["pos_embedding_x"])[0, 0], np.asarray(pe["pos_embedding_y"])[0, :, 0]
  sim = analysis.posemb_similarity(params, model)
  assert sim.shape == (2, 3, 2, 3)
  emb = lambda r, c: np.concatenate([x[c], y[r]])
  np.testing.assert_allclose(sim[1, 0, 0, 2], _cos(emb(1, 0), emb(0, 2)), atol=1e-6)


def test_hybrid_similarity_shape_and_none_error():
  model = hybrid()
  params, _ = init(model, image_hw=(16, 24))  # stride 8: 2x3 grid
  assert analysis.posemb_similarity(params, model, image_hw=(16, 24)).shape == (2, 3, 2, 3)
  with pytest.raises(ValueError, match="posemb='none'"):
    none = tiny(posemb="none")
    analysis.posemb_similarity(init(none)[0], none, image_hw=(16, 16))
  with pytest.raises(ValueError, match="image_hw"):
    sincos = tiny(posemb="sincos2d")
    analysis.posemb_similarity(init(sincos)[0], sincos)


# ------------------------------------------------------------- embedding filter components


def test_principal_components_orthonormal_and_find_planted_direction():
  rng = np.random.default_rng(0)
  direction = rng.normal(size=12)
  direction /= np.linalg.norm(direction)
  vectors = rng.normal(size=(50, 1)) * 10 * direction + 0.1 * rng.normal(size=(50, 12)) + 3.0
  comps = analysis.principal_components(vectors, 5)
  assert comps.shape == (5, 12)
  np.testing.assert_allclose(comps @ comps.T, np.eye(5), atol=1e-10)
  assert abs(comps[0] @ direction) > 0.999
  with pytest.raises(ValueError, match="num_components"):
    analysis.principal_components(vectors, 13)


def test_embedding_filter_components_shape_and_range():
  model = tiny()
  params, _ = init(model)
  comps = analysis.embedding_filter_components(params, num_components=6)
  assert comps.shape == (6, 4, 4, 3)  # [K, P, P, C]
  np.testing.assert_allclose(comps.reshape(6, -1).min(1), 0.0, atol=1e-6)
  np.testing.assert_allclose(comps.reshape(6, -1).max(1), 1.0, atol=1e-6)


def test_embedding_filter_components_rejects_hybrid():
  model = hybrid()
  params, _ = init(model)
  with pytest.raises(ValueError, match="plain ViT"):
    analysis.embedding_filter_components(params)
