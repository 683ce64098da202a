"""The image-text model: big_vision's parameter layout, unit embeddings, the poolings, and a
tiny SigLIP that learns to match images with their captions (retrieval and zero-shot)."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vit_jax import models
from vit_jax.infra import errors
from vit_jax.models import text as text_lib
from vit_jax.models import two_tower
from vit_jax.run import contrastive

TINY_TEXT = text_lib.TextSettings(width=32, depth=2, num_heads=2, mlp_dim=64, vocab_size=40)
EMBED = 16


def _model(pool: str = "last", init=two_tower.SIGLIP_INIT) -> two_tower.TwoTower:
  image = models.create_model(models.get_model_config("testing"), num_classes=None)
  settings = text_lib.TextSettings(**{**TINY_TEXT.__dict__, "pool": pool})
  return two_tower.TwoTower(
    image, text_lib.TextTransformer(settings, num_classes=EMBED), EMBED, contrastive_init=init
  )


def _shapes(tree):
  return {"/".join(str(getattr(k, "key", k)) for k in path): np.shape(leaf)
          for path, leaf in jax.tree_util.tree_leaves_with_path(nn.unbox(tree))}  # fmt: skip


def test_parameters_follow_big_visions_two_towers_layout():
  images, ids = jnp.zeros((2, 16, 16, 3)), jnp.zeros((2, 6), jnp.int32)
  params = nn.unbox(_model().init(jax.random.PRNGKey(0), images, ids)["params"])
  shapes = _shapes(params)
  assert shapes["txt/Embed_0/embedding"] == (40, 32)
  assert shapes["txt/pos_embedding"] == (1, 6, 32)
  assert shapes["txt/Encoder_0/encoderblock_1/MlpBlock_3/Dense_0/kernel"] == (32, 64)
  assert shapes["txt/Encoder_0/encoder_norm/scale"] == (32,)
  assert shapes["txt/head/kernel"] == (32, EMBED)
  assert shapes["img_head/kernel"] == (32, EMBED) and "img/head/kernel" not in shapes
  assert float(params["t"][0]) == pytest.approx(math.log(10.0))
  assert float(params["b"][0]) == -10.0
  clip = nn.unbox(
    _model(init=two_tower.CLIP_INIT).init(jax.random.PRNGKey(0), images, ids)["params"]
  )
  assert "b" not in clip and float(jnp.exp(clip["t"][0])) == pytest.approx(1 / 0.07, rel=1e-6)


def test_embeddings_are_unit_and_either_tower_runs_alone():
  model = _model()
  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.uniform(-1, 1, (3, 16, 16, 3)), jnp.float32)
  ids = jnp.asarray(rng.integers(0, 40, (3, 5)), jnp.int32)
  variables = model.init(jax.random.PRNGKey(0), images, ids)
  zimg, ztxt, out = model.apply(variables, images, ids)
  np.testing.assert_allclose(jnp.linalg.norm(zimg, axis=1), 1.0, rtol=1e-5)
  np.testing.assert_allclose(jnp.linalg.norm(ztxt, axis=1), 1.0, rtol=1e-5)
  assert float(out["t"]) == pytest.approx(10.0) and float(out["b"]) == -10.0
  alone_img, none_txt, _ = model.apply(variables, images, None)
  none_img, alone_txt, _ = model.apply(variables, None, ids)
  assert none_txt is None and none_img is None
  np.testing.assert_allclose(alone_img, zimg, rtol=1e-6)
  np.testing.assert_allclose(alone_txt, ztxt, rtol=1e-6)


@pytest.mark.parametrize("pool", text_lib.POOLS)
def test_each_pooling_reads_the_transformed_tokens(pool):
  settings = text_lib.TextSettings(**{**TINY_TEXT.__dict__, "pool": pool, "eos_id": 39})
  tower = text_lib.TextTransformer(settings)
  ids = np.random.default_rng(1).integers(0, 38, (2, 7))
  ids[0, 3] = ids[0, 5] = ids[1, 1] = 39  # the end token (and the largest id) twice, once
  variables = tower.init(jax.random.PRNGKey(0), jnp.asarray(ids, jnp.int32))
  features, out = tower.apply(variables, jnp.asarray(ids, jnp.int32))
  tokens = out["transformed"]
  first_end = jnp.stack([tokens[0, 3], tokens[1, 1]])  # CLIP's: the first end token
  expected = {"last": tokens[:, -1], "first": tokens[:, 0], "gap": tokens.mean(axis=1),
              "eos": first_end, "argmax": first_end}  # fmt: skip
  if pool in expected:
    np.testing.assert_allclose(features, expected[pool], rtol=1e-6)
  else:
    assert "MAPHead_0" in variables["params"] and features.shape == (2, 32)


def test_text_sizes_and_bad_settings():
  so400m = text_lib.TextSettings.named("So400m", vocab_size=32_000)
  assert (so400m.width, so400m.depth, so400m.mlp_dim, so400m.num_heads) == (1152, 27, 4304, 16)
  tower = text_lib.TextTransformer(text_lib.TextSettings.named("B", vocab_size=32_000))
  shapes = jax.eval_shape(tower.init, jax.random.PRNGKey(0), jnp.zeros((1, 64), jnp.int32))
  count = sum(math.prod(s) for s in _shapes(shapes["params"]).values())
  d, m, layers = 768, 3072, 12
  block = 2 * 2 * d + 4 * d * d + 4 * d + 2 * d * m + m + d  # LNs, q/k/v/out, MLP
  assert count == 32_000 * d + 64 * d + layers * block + 2 * d
  with pytest.raises(errors.ConfigError, match="pool='cls'"):
    text_lib.TextSettings(pool="cls")
  with pytest.raises(errors.ConfigError, match="Unknown text tower size 'XL'"):
    text_lib.TextSettings.named("XL")


def test_a_tiny_siglip_learns_to_pair_images_with_captions():
  """Four classes of images (a bright quadrant each) and captions (the class word three
  times among filler words): after training, every image retrieves a caption of its class
  and the class prompts classify the images zero-shot. Before training both are at chance
  (the loss starts near its trivial value, every pair scored alike)."""
  rng = np.random.default_rng(0)
  classes, batch, length = 4, 8, 6

  def sample(n):
    labels = rng.permutation(np.arange(n) % classes)  # every class in every batch
    images = rng.normal(0, 0.1, (n, 16, 16, 3)).astype(np.float32)
    for i, c in enumerate(labels):
      images[i, (c // 2) * 8 : (c // 2) * 8 + 8, (c % 2) * 8 : (c % 2) * 8 + 8] += 2.0
    words = rng.integers(10, 40, (n, length))
    words[:, :3] = (1 + labels)[:, None]  # the class word: ids 1..4
    return images, words.astype(np.int32), labels

  model = _model(pool="gap")
  images, ids, _ = sample(batch)
  params = model.init(jax.random.PRNGKey(0), images, ids)["params"]
  tx = optax.adam(3e-3)
  opt_state = tx.init(params)

  def loss_fn(p, images, ids):
    zimg, ztxt, out = model.apply({"params": p}, images, ids)
    return contrastive.sigmoid_loss(zimg, ztxt, out["t"], out["b"])

  @jax.jit
  def step(p, o, images, ids):
    loss, grads = jax.value_and_grad(loss_fn)(p, images, ids)
    updates, o = tx.update(grads, o, p)
    return optax.apply_updates(p, updates), o, loss

  def accuracies(p):
    images, ids, labels = sample(32)
    zimg, ztxt, out = model.apply({"params": p}, images, ids)
    retrieved = np.asarray(jnp.argmax(zimg @ ztxt.T, axis=1))
    prompts = np.full((classes, length), 20, np.int32)
    prompts[:, :3] = (1 + np.arange(classes))[:, None]
    _, zclass, _ = model.apply({"params": p}, None, prompts)
    predicted = np.argmax(two_tower.zero_shot_logits(zimg, zclass, out["t"]), axis=1)
    return np.mean(labels[retrieved] == labels), np.mean(predicted == labels)

  assert max(accuracies(params)) <= 0.5
  losses = []
  for _ in range(300):
    images, ids, _ = sample(batch)
    params, opt_state, loss = step(params, opt_state, images, ids)
    losses.append(float(loss))
  assert np.mean(losses[-10:]) < 0.6 * np.mean(losses[:10])
  retrieval, zero_shot = accuracies(params)
  assert retrieval >= 0.9 and zero_shot >= 0.9


def test_the_registry_says_which_configs_are_two_tower():
  """`models.is_two_tower` answers for configs and settings alike, as `is_mixer` does."""
  text = dict(width=16, depth=1, mlp_dim=32, num_heads=2, vocab_size=64, pool="gap")
  config = models.two_tower_config(
    models.get_model_config("testing"), text=text, text_len=8, embed_dim=16
  )
  assert models.is_two_tower(config) and models.is_two_tower(models.model_settings(config))
  for name in ("testing", "Mixer-B_16", "BiT-R50x1"):
    assert not models.is_two_tower(models.get_model_config(name))
  assert models.image_settings(config) == models.model_settings(config).image
