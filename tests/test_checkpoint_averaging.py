"""Two loads of one architecture are one JAX type (`vit_jax.api.model_facts`): they average
with `jax.tree.map` into a model that saves, reloads and predicts with the averaged
parameters (checkpoint averaging, model soups, an EMA copy), and a jitted function takes
both with one compilation. Tiny ViTs (`testing`: width 32, 16x16 inputs)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import vit_jax
from tests import interop_fixtures
from vit_jax.api import model_facts
from vit_jax.data import captions, tokenizer_kinds

X = interop_fixtures.images(4, 16)  # float32 [4, 16, 16, 3]


def _trained_like(seed: int) -> vit_jax.Model:
  """A tiny model of seed ``seed`` with a random head (a created one's is zeros)."""
  model = vit_jax.create("testing", num_classes=3, image_size=16, seed=seed)
  kernel = model.params["head"]["kernel"]
  head = {**model.params["head"], "kernel": np.random.default_rng(seed).normal(size=kernel.shape)}
  return model.replace(params={**model.params, "head": jax.tree.map(np.float32, head)})


@pytest.fixture(scope="module")
def loads(tmp_path_factory) -> tuple[vit_jax.Model, vit_jax.Model]:
  """Two tiny models of one architecture (seeds 1 and 2), each saved and loaded back."""
  root = tmp_path_factory.mktemp("soup")
  return tuple(vit_jax.load(_trained_like(s).save(root / f"seed{s}")) for s in (1, 2))


def test_two_loads_average_save_and_predict_with_the_average(loads, tmp_path):
  a, b = loads
  assert a.source != b.source and jax.tree.structure(a) == jax.tree.structure(b)
  soup = jax.tree.map(lambda u, v: (u + v) / 2, a, b)
  again = vit_jax.load(soup.save(tmp_path / "soup"))
  want = jax.tree.map(lambda u, v: (np.asarray(u) + np.asarray(v)) / 2, a.params, b.params)
  for got, expected in zip(jax.tree.leaves(again.params), jax.tree.leaves(want)):
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
  logits = again(X)
  np.testing.assert_allclose(logits, soup.replace(params=want)(X), rtol=1e-5, atol=1e-5)
  assert not np.allclose(logits, a(X), atol=1e-3)  # the average's, not either load's
  assert not np.allclose(logits, b(X), atol=1e-3)
  images = (X * 127.5 + 127.5).astype(np.uint8)  # what predict takes: images
  got, expected = (m.predict(images, top_k=3) for m in (again, a.replace(params=want)))
  names, probs = ([[[c[i] for c in row] for row in p] for p in (got, expected)] for i in (0, 1))
  assert names[0] == names[1]
  np.testing.assert_allclose(probs[0], probs[1], atol=1e-5)


def test_a_jitted_function_compiles_once_for_both_loads(loads):
  a, b = loads
  traces = []

  @jax.jit
  def logits(model, x):
    traces.append(1)
    return model(x)

  np.testing.assert_allclose(logits(a, X), a(X), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(logits(b, X), b(X), rtol=1e-5, atol=1e-5)
  assert len(traces) == 1


def test_facts_that_differ_are_different_types(loads):
  a, _ = loads
  other_head = a.with_head(5)
  with pytest.raises(ValueError, match="[Cc]ustom node type mismatch|structure"):
    jax.tree.map(lambda u, v: u, a, other_head)
  fewer_per_call = vit_jax.Model(a.loaded, batch_size=a.batch_size + 1)
  assert jax.tree.structure(fewer_per_call) != jax.tree.structure(a)
  facts = [model_facts.Facts(m.loaded, m.batch_size) for m in (a, a)]
  assert facts[0] == facts[1] and hash(facts[0]) == hash(facts[1])


def test_an_image_text_model_s_tokenizer_compares_by_its_vocabulary(tmp_path):
  """Two reads of one tokenizer file are equal facts; another vocabulary is not."""
  path = str(tmp_path / "tokenizer.json")
  captions.CaptionTokenizer(["a cat", "a dog"]).save(path)
  first, second = (tokenizer_kinds.load_tokenizer(path) for _ in range(2))
  other = captions.CaptionTokenizer(["a cat", "a bird"])
  assert first is not second and first.fingerprint() == second.fingerprint()
  assert hash(first.fingerprint()) == hash(second.fingerprint())
  assert other.fingerprint() != first.fingerprint()
