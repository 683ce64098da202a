"""Rotary position embeddings against timm's own (built in the test): the sine and cosine
tables of EVA-02's and DINOv3's kinds, and their rotation of queries with prefix tokens."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from vit_jax.infra import errors
from vit_jax.models import rope

torch = pytest.importorskip("torch")
sincos = pytest.importorskip("timm.layers.pos_embed_sincos")


def _timm_tables(module) -> tuple[np.ndarray, np.ndarray]:
  sin, cos = module.get_embed().float().chunk(2, -1)
  return sin.numpy(), cos.numpy()


@pytest.mark.parametrize("rotate_half, indexing", [(False, "ij"), (True, "ij"), (False, "xy")])
@pytest.mark.parametrize(
  "grid, ref_grid, offset", [((16, 16), (16, 16), 0.0), ((14, 10), (16, 12), 0.5)]
)
def test_eva_tables_equal_timms_rotary_embedding_cat(grid, ref_grid, offset, rotate_half, indexing):
  """'xy' (Perception Encoder, RoPE-ViT): the column angles first, on a grid that is not
  square, rescaled to a reference that is not square either."""
  theirs = sincos.RotaryEmbeddingCat(
    dim=64, temperature=10000.0, in_pixels=False, feat_shape=list(grid),
    ref_feat_shape=list(ref_grid), grid_offset=offset, rotate_half=rotate_half,
    grid_indexing=indexing,
  )  # fmt: skip
  ours = rope.Rope(
    rope.EVA, 10000.0, rotate_half, offset, ref_grid=ref_grid, grid_indexing=indexing
  )
  for mine, reference in zip(ours.sin_cos(grid, 64), _timm_tables(theirs)):
    np.testing.assert_allclose(mine, reference, atol=2e-6)


@pytest.mark.parametrize("normalize", rope.NORMALIZE_COORDS)
@pytest.mark.parametrize("grid", [(14, 14), (12, 18)])
def test_dinov3_tables_equal_timms(grid, normalize):
  theirs = sincos.RotaryEmbeddingDinoV3(
    dim=64, temperature=100.0, feat_shape=list(grid), normalize_coords=normalize
  )
  ours = rope.Rope(rope.DINOV3, 100.0, rotate_half=True, normalize_coords=normalize)
  for mine, reference in zip(ours.sin_cos(grid, 64), _timm_tables(theirs)):
    np.testing.assert_allclose(mine, reference, atol=2e-6)


@pytest.mark.parametrize("indexing", rope.GRID_INDEXINGS)
def test_mixed_tables_equal_timms_for_its_learned_frequencies(indexing):
  """timm's ``RotaryEmbeddingMixed`` (Naver's RoPE-Mixed), its random frequencies of one
  layer given to ours: the same [H, N, Dh] tables on a grid that is not square."""
  grid, heads, head_dim = (3, 5), 2, 16
  torch.manual_seed(0)
  theirs = sincos.RotaryEmbeddingMixed(
    dim=heads * head_dim, depth=2, num_heads=heads, feat_shape=list(grid), grid_indexing=indexing
  )
  want_sin, want_cos = theirs.get_embed().detach()[1].chunk(2, -1)  # layer 1: [H, N, Dh]
  ours = rope.Rope(rope.MIXED, 10.0, False, grid_indexing=indexing)
  sin, cos = rope.mixed_sin_cos(theirs.freqs.detach()[:, 1].numpy(), ours.positions(grid))
  np.testing.assert_allclose(np.asarray(sin), want_sin.numpy(), atol=2e-6)
  np.testing.assert_allclose(np.asarray(cos), want_cos.numpy(), atol=2e-6)


def test_mixed_frequencies_start_as_timms_at_a_random_angle_per_head():
  """Magnitudes 1 / T ** (4i / Dh) as timm's; x's and y's at a right angle per band pair."""
  init = rope.init_mixed_freqs(10.0)
  freqs = np.asarray(init(jax.random.key(0), (2, 3, 8)))  # [2, H, Dh / 2]
  torch.manual_seed(0)
  theirs = sincos.init_random_2d_freqs(16, 1, 3, temperature=10.0)[:, 0].numpy()
  np.testing.assert_allclose(np.hypot(*freqs), np.hypot(*theirs), rtol=1e-6)
  angle = np.arctan2(freqs[1], freqs[0])  # [H, Dh / 2]
  np.testing.assert_allclose(np.cos(angle[:, 4:] - angle[:, :4]), 0.0, atol=1e-6)
  assert len(set(np.round(angle[:, 0], 4))) == 3  # each head its own angle


@pytest.mark.parametrize("rotate_half", [False, True])
def test_rotation_equals_timms_and_leaves_the_prefix_tokens(rotate_half):
  grid, head_dim, prefix = (4, 6), 32, 5  # a class token and 4 registers, as DINOv3
  ours = rope.Rope(rope.EVA, 10000.0, rotate_half)
  sin, cos = ours.sin_cos(grid, head_dim)
  x = np.random.default_rng(0).standard_normal((2, 3, prefix + 24, head_dim)).astype(np.float32)
  rotated = np.asarray(rope.apply(x, sin, cos, rotate_half, num_prefix=prefix))
  emb = torch.from_numpy(np.concatenate([sin, cos], axis=-1))
  reference = sincos.apply_rot_embed_cat(
    torch.from_numpy(x[..., prefix:, :]), emb, half=rotate_half
  )
  np.testing.assert_allclose(rotated[..., prefix:, :], reference.numpy(), atol=1e-5)
  np.testing.assert_array_equal(rotated[..., :prefix, :], x[..., :prefix, :])
  # A rotation: each token's length is kept, and the dot product of a query and a key
  # depends only on their offset (the same shift of both leaves it unchanged).
  np.testing.assert_allclose(
    np.linalg.norm(rotated, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5
  )


def test_the_score_depends_on_the_offset_only():
  """The same shift of a query and a key leaves their product unchanged; another offset
  changes it."""
  ours = rope.Rope(rope.EVA, 100.0, rotate_half=True)
  sin, cos = ours.sin_cos((1, 8), 16)
  q, k = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
  at = lambda v, i: np.asarray(rope.apply(v[None], sin[i : i + 1], cos[i : i + 1], True))[0]  # noqa: E731
  assert at(q, 1) @ at(k, 3) == pytest.approx(at(q, 4) @ at(k, 6), rel=1e-5)
  assert at(q, 1) @ at(k, 3) != pytest.approx(at(q, 1) @ at(k, 5), rel=1e-3)


def test_bad_settings_are_refused():
  with pytest.raises(errors.ConfigError, match="rope kind='alibi'"):
    rope.Rope("alibi", 100.0, True)
  with pytest.raises(errors.ConfigError, match="set rotate_half=False, grid_offset=0"):
    rope.Rope(rope.MIXED, 10.0, False, grid_offset=1.0)
  with pytest.raises(errors.ConfigError, match="learned frequencies: mixed_sin_cos"):
    rope.Rope(rope.MIXED, 10.0, False).sin_cos((2, 2), 16)
  with pytest.raises(errors.ConfigError, match="divisible by 4, not 30"):
    rope.Rope(rope.DINOV3, 100.0, True).sin_cos((2, 2), 30)
