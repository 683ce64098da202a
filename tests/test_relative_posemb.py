"""Relative position embeddings (paper Appendix D.4, ``config.model.posemb='relative'``):
the attention against an independent numpy version of the formula, the encoder's
layouts and the fine-tuning resize."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.infra import errors
from vit_jax.models import create_model, get_model_config
from vit_jax.models import posemb as posemb_lib
from vit_jax.models.attention import MultiHeadDotProductAttention


def _numpy_relative_attention(x, p, table, num_prefix, num_heads):
  """The formula pair by pair: logit(i, j) = q_i . (k_j + r(i, j)) / sqrt(Dh), where r is
  the embedding of the patch offset i - j, or of the pair's kind when a prefix token
  takes part (prefix query, prefix key, both); softmax over j; out = sum_j w v_j."""
  b, t, d = x.shape
  dh = d // num_heads
  n = t - num_prefix
  q, k, v = (np.einsum("btd,dhk->bhtk", x, p[m]["kernel"]) + p[m]["bias"][:, None] for m in "qkv")
  logits = np.zeros((b, num_heads, t, t))
  for i in range(t):
    for j in range(t):
      if i >= num_prefix and j >= num_prefix:
        row = (i - j) + (n - 1)
      elif j >= num_prefix:
        row = 2 * n - 1  # the prefix token asks a patch
      elif i >= num_prefix:
        row = 2 * n  # a patch asks the prefix token
      else:
        row = 2 * n + 1
      key = k[:, :, j] + table[row][None]  # [B, H, Dh]
      logits[:, :, i, j] = (q[:, :, i] * key).sum(-1) / np.sqrt(dh)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  y = np.einsum("bhqk,bhkd->bhqd", weights, v)
  out = np.einsum("bhtk,hkd->btd", y, p["out"]["kernel"]) + p["out"]["bias"]
  return logits, weights, out


def _attention_params(params):
  names = {"q": "query", "k": "key", "v": "value", "out": "out"}
  return {m: {k: np.asarray(v, np.float64) for k, v in params[n].items()} for m, n in names.items()}


@pytest.mark.parametrize("num_prefix", [0, 1])
def test_the_attention_is_the_papers_formula(num_prefix):
  positions = posemb_lib.RelativePositions(num_patches=6, num_prefix=num_prefix)
  layer = MultiHeadDotProductAttention(num_heads=2, relative=positions)
  x = jax.random.normal(jax.random.key(0), (2, 6 + num_prefix, 8))
  params = nn.unbox(layer.init(jax.random.key(1), x, True)["params"])
  table = np.asarray(params[posemb_lib.RELATIVE_EMBEDDING], np.float64)
  assert table.shape == (positions.num_offsets, 2, 4)
  assert positions.num_offsets == 11 + 3 * num_prefix
  out, sown = layer.apply({"params": params}, x, True, mutable=["intermediates"])
  logits, weights, want = _numpy_relative_attention(
    np.asarray(x, np.float64), _attention_params(params), table, num_prefix, 2
  )
  np.testing.assert_allclose(sown["intermediates"]["attention_weights"][0], weights, atol=1e-6)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  # The logits themselves: the relative term alone, and the softmax path without sowing.
  q = np.einsum("btd,dhk->bhtk", np.asarray(x), params["query"]["kernel"])
  q = (q + np.asarray(params["query"]["bias"])[:, None]) / 2.0  # sqrt(Dh) = 2
  k = np.einsum("btd,dhk->bhtk", np.asarray(x), params["key"]["kernel"])
  k = k + np.asarray(params["key"]["bias"])[:, None]
  relative = posemb_lib.relative_logits(jnp.asarray(q), jnp.asarray(table, jnp.float32), positions)
  np.testing.assert_allclose(relative + np.einsum("bhqd,bhkd->bhqk", q, k), logits, atol=1e-5)
  np.testing.assert_allclose(layer.apply({"params": params}, x, True), want, rtol=1e-5, atol=1e-5)
  # Without the table's term the output differs: the offsets take part.
  params[posemb_lib.RELATIVE_EMBEDDING] = np.zeros_like(table)
  assert np.abs(layer.apply({"params": params}, x, True) - want).max() > 1e-3


def _relative_model(**changes):
  config = get_model_config("testing")
  config.posemb = "relative"
  config.update(changes)
  return config


def test_every_layout_and_dtype_computes_the_same_model():
  config = _relative_model()
  images = jax.random.uniform(jax.random.key(2), (2, 16, 12, 3), minval=-1, maxval=1)
  model = create_model(config, num_classes=5)
  params = nn.unbox(model.init(jax.random.key(0), images)["params"])
  block = params["Transformer"]["encoderblock_0"]["MultiHeadDotProductAttention_1"]
  # A 4x3 grid and the class token: 2 x 12 - 1 offsets + 3 prefix rows.
  assert block[posemb_lib.RELATIVE_EMBEDDING].shape == (26, 2, 16)
  assert "posembed_input" not in params["Transformer"]
  want = model.apply({"params": params}, images)
  from vit_jax.weights import npz  # pylint: disable=g-import-not-at-top

  scanned = npz.to_layout(params, scanned=True)
  for execution in (dict(scan=True), dict(scan=True, remat=True), dict(remat=True)):
    other = create_model(config, num_classes=5, **execution)
    tree = scanned if execution.get("scan") else params
    np.testing.assert_allclose(other.apply({"params": tree}, images), want, atol=1e-5)
  half = create_model(config, num_classes=5, dtype=jnp.bfloat16, scan=True, remat=True)
  np.testing.assert_allclose(half.apply({"params": scanned}, images), want, atol=0.1)
  # The tables learn (the official head starts at zero: a random one lets gradients in).
  scanned["head"]["kernel"] = jax.random.normal(jax.random.key(4), scanned["head"]["kernel"].shape)
  grads = jax.grad(lambda p: half.apply({"params": p}, images).sum())(scanned)
  attention = grads["Transformer"]["encoderblock"]["MultiHeadDotProductAttention_1"]
  assert np.abs(attention[posemb_lib.RELATIVE_EMBEDDING]).max() > 0


def test_the_offset_table_is_resized_for_another_grid():
  table = np.random.default_rng(0).normal(size=(2 * 9 - 1 + 3, 2, 4)).astype(np.float32)
  resized = posemb_lib.resize_relative(table, 16, has_prefix=True)
  assert resized.shape == (2 * 16 - 1 + 3, 2, 4)
  np.testing.assert_array_equal(resized[-3:], table[-3:])  # the prefix rows are kept
  np.testing.assert_allclose(resized[15], table[8], atol=1e-6)  # offset 0 on offset 0
  np.testing.assert_allclose(resized[[0, 30]], table[[0, 16]], atol=0.5)
  layered = posemb_lib.resize_relative(table[None].repeat(3, 0), 16, has_prefix=True)
  np.testing.assert_allclose(layered[1], resized, atol=1e-6)  # a scanned [L, O, H, Dh] table
  with pytest.raises(errors.CheckpointError, match="2N - 1"):
    posemb_lib.resize_relative(table, 16, has_prefix=False)


def test_fine_tuning_at_another_resolution_resizes_every_layers_table(tmp_path):
  from vit_jax.weights import fit, npz  # pylint: disable=g-import-not-at-top

  config = _relative_model()
  small, large = (create_model(config, num_classes=n) for n in (3, 4))
  stored = nn.unbox(small.init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)))["params"])
  npz.save_npz(tmp_path / "m.npz", stored)
  fresh = nn.unbox(large.init(jax.random.key(1), jnp.zeros((1, 16, 16, 3)))["params"])
  loaded = fit.load_pretrained(tmp_path / "m.npz", fresh, config)
  for i in range(2):
    attention = f"encoderblock_{i}/MultiHeadDotProductAttention_1/{posemb_lib.RELATIVE_EMBEDDING}"
    got = loaded["Transformer"][attention.split("/")[0]]["MultiHeadDotProductAttention_1"]
    old = stored["Transformer"][attention.split("/")[0]]["MultiHeadDotProductAttention_1"]
    want = posemb_lib.resize_relative(old[posemb_lib.RELATIVE_EMBEDDING], 16, has_prefix=True)
    np.testing.assert_allclose(got[posemb_lib.RELATIVE_EMBEDDING], want)
  assert np.isfinite(large.apply({"params": loaded}, jnp.zeros((1, 16, 16, 3)))).all()


# The FLOPs against XLA's and the quickstart trained with them: tests/test_axial.py (one
# test for both).
