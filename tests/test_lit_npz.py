"""The official LiT `.npz` layout (`models_lit.py`: ``img/``, ``txt/``, ``t``, the vocabulary
beside it) read as a two-tower model: tiny arrays written here under models_lit's names,
logits against a numpy computation of models_lit's text tower, models_lit's token ids."""

from __future__ import annotations

import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

import vit_jax
from tests import hf_text_fixtures as fx
from vit_jax import models
from vit_jax.infra import errors
from vit_jax.models import two_tower
from vit_jax.weights import sources

pytest.importorskip("sentencepiece")

WIDTH, DEPTH, HEADS, MLP, LENGTH, VOCAB = 16, 2, 2, 32, 16, 40
IMAGE = 16


def _text_tower(rng: np.random.Generator, embed: int) -> dict[str, np.ndarray]:
  """models_lit's TextTransformer arrays, by its names (official ViT blocks)."""
  dh = WIDTH // HEADS
  normal = lambda *shape: rng.normal(size=shape).astype(np.float32) * 0.3
  norm = lambda p: {f"{p}/scale": 1 + normal(WIDTH), f"{p}/bias": normal(WIDTH)}
  out = {
    "txt/Embed_0/embedding": normal(VOCAB, WIDTH),
    "txt/pos_embedding": normal(1, LENGTH, WIDTH),
  }
  for i in range(DEPTH):
    b = f"txt/Encoder_0/encoderblock_{i}/"
    att = b + "MultiHeadDotProductAttention_1/"
    out |= norm(b + "LayerNorm_0") | norm(b + "LayerNorm_2")
    for name in ("query", "key", "value"):
      out |= {
        f"{att}{name}/kernel": normal(WIDTH, HEADS, dh),
        f"{att}{name}/bias": normal(HEADS, dh),
      }
    out |= {f"{att}out/kernel": normal(HEADS, dh, WIDTH), f"{att}out/bias": normal(WIDTH)}
    out |= {
      f"{b}MlpBlock_3/Dense_0/kernel": normal(WIDTH, MLP),
      f"{b}MlpBlock_3/Dense_0/bias": normal(MLP),
    }
    out |= {
      f"{b}MlpBlock_3/Dense_1/kernel": normal(MLP, WIDTH),
      f"{b}MlpBlock_3/Dense_1/bias": normal(WIDTH),
    }
  out |= norm("txt/Encoder_0/encoder_norm")
  return out | {"txt/head/kernel": normal(WIDTH, embed), "txt/head/bias": normal(embed)}


def _layer_norm(x, p, flat):
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-6) * flat[f"{p}/scale"] + flat[f"{p}/bias"]


def _text_reference(ids: np.ndarray, flat: dict[str, np.ndarray]) -> np.ndarray:
  """models_lit's TextTransformer in numpy: embed, + positions, pre-LN blocks (tanh GELU),
  the final norm, the *last* token, the head; then unit length as LitModel."""
  gelu = lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
  x = flat["txt/Embed_0/embedding"][ids] + flat["txt/pos_embedding"]  # [B, L, D]
  for i in range(DEPTH):
    b = f"txt/Encoder_0/encoderblock_{i}/"
    att = b + "MultiHeadDotProductAttention_1/"
    y = _layer_norm(x, b + "LayerNorm_0", flat)
    q, k, v = (np.einsum("bld,dhk->blhk", y, flat[f"{att}{n}/kernel"]) + flat[f"{att}{n}/bias"]
               for n in ("query", "key", "value"))  # fmt: skip
    logits = np.einsum("bqhk,bnhk->bhqn", q / math.sqrt(q.shape[-1]), k)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    y = np.einsum("bhqn,bnhk->bqhk", weights, v)
    x = x + np.einsum("bqhk,hkd->bqd", y, flat[f"{att}out/kernel"]) + flat[f"{att}out/bias"]
    y = _layer_norm(x, b + "LayerNorm_2", flat)
    mlp = b + "MlpBlock_3/"
    y = gelu(y @ flat[mlp + "Dense_0/kernel"] + flat[mlp + "Dense_0/bias"])
    x = x + y @ flat[mlp + "Dense_1/kernel"] + flat[mlp + "Dense_1/bias"]
  x = _layer_norm(x, "txt/Encoder_0/encoder_norm", flat)[:, -1]
  z = x @ flat["txt/head/kernel"] + flat["txt/head/bias"]
  return z / (np.linalg.norm(z, axis=-1, keepdims=True) + 1e-8)


def _lit_ids(vocab: str, texts: list[str]) -> np.ndarray:
  """models_lit's SentencepieceTokenizer: the end token appended, the first max_len - 1
  tokens kept, padded with the end token (so the last is always the end token)."""
  import sentencepiece  # pylint: disable=g-import-not-at-top

  sp = sentencepiece.SentencePieceProcessor(model_file=vocab)
  rows = [(sp.encode(t) + [sp.eos_id()])[: LENGTH - 1] for t in texts]
  return np.asarray([r + [sp.eos_id()] * (LENGTH - len(r)) for r in rows], np.int32)


@pytest.fixture(scope="module")
def lit_file(tmp_path_factory) -> tuple[str, dict[str, np.ndarray]]:
  directory = str(tmp_path_factory.mktemp("lit"))
  image = models.create_model(models.get_model_config("testing"), num_classes=None)
  img = nn.unbox(image.init(jax.random.PRNGKey(1), jnp.zeros((1, IMAGE, IMAGE, 3)))["params"])
  flat = {f"img/{k}": np.asarray(v) for k, v in traverse_util.flatten_dict(img, sep="/").items()}
  rng = np.random.default_rng(0)
  flat = {k: v + rng.normal(size=v.shape).astype(np.float32) * 0.1 for k, v in flat.items()}
  flat |= _text_tower(rng, embed=32) | {"t": np.asarray([math.log(7.0)], np.float32)}
  path = os.path.join(directory, "LiT-tiny.npz")
  np.savez(path, **flat)
  os.rename(fx._sentencepiece(directory), os.path.join(directory, "LiT-tiny.model"))
  return path, flat


def test_lit_npz_gives_models_lit_logits_and_token_ids(lit_file):
  path, flat = lit_file
  loaded = sources.load(path)
  assert loaded.image_size == (IMAGE, IMAGE) and loaded.config.text_len == LENGTH
  texts = list(fx.TEXTS) + [" ".join(fx.CORPUS[:6])]  # the last one truncated
  ids = loaded.tokenizer.encode(texts, LENGTH)
  np.testing.assert_array_equal(ids, _lit_ids(os.path.splitext(path)[0] + ".model", texts))
  x = np.random.default_rng(3).uniform(-1, 1, (2, IMAGE, IMAGE, 3)).astype(np.float32)
  zimg, ztxt, out = loaded.module().apply({"params": loaded.params}, x, ids)
  logits = np.asarray(two_tower.image_text_logits(zimg, ztxt, out))
  # The image tower is the official ViT (as every official .npz): its class-token features,
  # unit length, are LiT's image embedding (out_dim[0] None: no projection).
  image = models.create_model(models.get_model_config("testing"), num_classes=None)
  img = traverse_util.unflatten_dict(
    {k[4:]: v for k, v in flat.items() if k.startswith("img/")}, sep="/"
  )
  features = np.asarray(image.apply({"params": img}, x))
  zimg_ref = features / (np.linalg.norm(features, axis=-1, keepdims=True) + 1e-8)
  expected = 7.0 * zimg_ref @ _text_reference(ids, flat).T
  assert np.abs(logits - expected).max() <= 1e-5 * np.abs(expected).max()
  assert "b" not in loaded.params  # LiT's softmax: no bias
  # predict --texts' scores (vit_jax.api.text_scores): LiT's softmax over the texts.
  pixels = np.random.default_rng(4).integers(0, 256, (2, IMAGE, IMAGE, 3), np.uint8)
  probs = vit_jax.Model(loaded).text_probabilities(list(pixels), texts)
  features = np.asarray(image.apply({"params": img}, pixels / 127.5 - 1))  # the official [-1, 1]
  zimg_ref = features / (np.linalg.norm(features, axis=-1, keepdims=True) + 1e-8)
  np.testing.assert_allclose(
    probs, jax.nn.softmax(7.0 * zimg_ref @ _text_reference(ids, flat).T), atol=1e-4
  )


def test_a_bert_lit_tower_is_refused(tmp_path):
  path = str(tmp_path / "LiT-B16B.npz")
  np.savez(path, **{"img/cls": np.zeros((1, 1, 8), np.float32), "t": np.zeros(1, np.float32),
                    "txt/BertEncoder_0/embedder/word": np.zeros((4, 8), np.float32)})  # fmt: skip
  with pytest.raises(errors.CheckpointError, match="BERT tower"):
    sources.load(path)
