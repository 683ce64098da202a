"""big_vision's checkpoints both ways (`vit_jax.weights.big_vision`): tiny SigLIP, SigLIP 2
(stacked layers), LiT and plain ViTs built and saved by a reproduction of big_vision's own
code (`tests/big_vision_reference.py`), loaded here with their SentencePiece model, and
compared with big_vision's probabilities and token ids; the export read back by that code."""

from __future__ import annotations

import io
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vit_jax
from tests import big_vision_reference as bv
from vit_jax import errors, models, text_scores
from vit_jax.weights import big_vision, formats, sources

sentencepiece = pytest.importorskip("sentencepiece")

IMAGE, PATCH, WIDTH, DEPTH, HEADS, MLP, LENGTH = 16, 4, 16, 2, 2, 32, 8
TEXTS = ["A Photo of a CAT", "two dogs", "the quick brown fox jumps over the lazy dog again"]
CORPUS = [
  "a photo of a cat", "two dogs on a sofa", "the quick brown fox jumps over the lazy dog",
  "a small bird on a branch", "again and again",
] * 20  # fmt: skip


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory) -> str:
  """A SentencePiece model with c4_en's special ids: pad 0, end 1, unknown 2, no start."""
  model = io.BytesIO()
  sentencepiece.SentencePieceTrainer.train(
    sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=40,
    pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
  )  # fmt: skip
  path = tmp_path_factory.mktemp("vocab") / "sentencepiece.model"
  path.write_bytes(model.getvalue())
  return str(path)


def _model(*, scan=False, out_dim=(None, WIDTH), bias=-10.0, pool="map", text_pool="last"):
  tower = dict(depth=DEPTH, mlp_dim=MLP, num_heads=HEADS, scan=scan)
  return bv.TwoTowers(
    image=dict(patch_size=PATCH, width=WIDTH, pool_type=pool, **tower),
    text=dict(width=WIDTH, vocab_size=40, pool_type=text_pool, **tower),
    out_dim=out_dim, bias_init=bias,
  )  # fmt: skip


def _saved(tmp_path, vocabulary, model, *, prefix=True, name="siglip.npz"):
  """``model`` initialised (t and b moved off their init) and saved as big_vision saves
  it, with the vocabulary as ``<stem>.model``; (path, params)."""
  images = jnp.zeros((1, IMAGE, IMAGE, 3))
  params = model.init(jax.random.PRNGKey(0), images, jnp.zeros((1, LENGTH), jnp.int32))["params"]
  params = {**params, "t": jnp.full((1,), np.log(3.0))}
  if "b" in params:
    params["b"] = jnp.full((1,), -0.5)
  path = str(tmp_path / name)
  bv.save(path, params, prefix=prefix)
  with open(vocabulary, "rb") as src, open(path[: -len(".npz")] + ".model", "wb") as dst:
    dst.write(src.read())
  return path, params


def _images(n=2) -> np.ndarray:
  return np.random.default_rng(0).uniform(-1, 1, (n, IMAGE, IMAGE, 3)).astype(np.float32)


def _ours(model: vit_jax.Model, images: np.ndarray, texts=TEXTS) -> np.ndarray:
  """What ``predict --texts`` computes: the model's tokenizer, then `TextScores`."""
  return text_scores.TextScores(model.loaded, texts)(images)


def test_siglip_released_layout_gives_big_vision_probabilities_and_ids(tmp_path, vocabulary):
  model = _model()
  path, params = _saved(tmp_path, vocabulary, model)
  assert formats.of(path) is formats.BIG_VISION
  loaded = vit_jax.load(path)
  ids = bv.tokenize(TEXTS, vocabulary, LENGTH, pad_value=1)
  np.testing.assert_array_equal(loaded.loaded.tokenizer.encode(TEXTS, LENGTH), ids)
  assert loaded.config.text_len == LENGTH and loaded.config.image_head == "none"
  assert loaded.image_size == (IMAGE, IMAGE)
  want = bv.probabilities(model, params, _images(), ids)
  np.testing.assert_allclose(_ours(loaded, _images()), want, atol=1e-5)


def test_siglip2_stacked_layout_without_prefix(tmp_path, vocabulary):
  model = _model(scan=True, text_pool="map")
  path, params = _saved(tmp_path, vocabulary, model, prefix=False)
  assert formats.of(path) is formats.BIG_VISION  # not LiT's reader, which takes img/txt/t
  loaded = vit_jax.load(path)
  assert loaded.config.text.pool == "map"
  ids = bv.tokenize(TEXTS, vocabulary, LENGTH, pad_value=1)
  want = bv.probabilities(model, params, _images(), ids)
  np.testing.assert_allclose(_ours(loaded, _images()), want, atol=1e-5)


def test_lit_with_class_token_exports_back_into_big_vision(tmp_path, vocabulary):
  """A LiT model (both projections, no bias: softmax; ``pool_type='tok'``) read, written
  as big_vision, and loaded by big_vision's ``load`` (either image layout) with the same
  probabilities; the tokenizer written beside it gives the same ids."""
  model = _model(out_dim=WIDTH, bias=None, pool="tok")
  path, params = _saved(tmp_path, vocabulary, model, name="lit.npz")
  loaded = vit_jax.load(path)
  assert loaded.config.image_head == "dense" and "b" not in loaded.params
  ids = bv.tokenize(TEXTS, vocabulary, LENGTH, pad_value=1)
  want = bv.probabilities(model, params, _images(), ids)
  np.testing.assert_allclose(_ours(loaded, _images()), want, atol=1e-5)
  out = tmp_path / "export"
  loaded.save(str(out), format="big_vision")
  for scan in (False, True):
    again = bv.load(str(out / big_vision.EXPORT_FILE), image_scan=scan)
    image = {**model.image, "scan": scan}
    rebuilt = bv.TwoTowers(image, model.text, model.out_dim, bias_init=None)
    np.testing.assert_allclose(bv.probabilities(rebuilt, again, _images(), ids), want, atol=1e-5)
  written = str(out / big_vision.TOKENIZER_FILE)
  np.testing.assert_array_equal(bv.tokenize(TEXTS, written, LENGTH, pad_value=1), ids)
  np.testing.assert_allclose(_ours(vit_jax.load(str(out)), _images()), want, atol=1e-5)
