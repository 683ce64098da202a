"""SigLIP's sigmoid loss and CLIP's softmax loss against float64 formulas, and the chunked
sigmoid loss (texts passed around the 'data' ring) against the whole-batch one on 8 CPU
devices: the same loss and gradients, with no all-gather in the compiled program."""

from __future__ import annotations

import numpy as np
import pytest

from tests import fresh_python
from vit_jax.run import contrastive


def _pairs(rng: np.random.Generator, batch: int, width: int) -> tuple[np.ndarray, np.ndarray]:
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
  zimg = unit(rng.standard_normal((batch, width)))
  # Texts near their images, so that the positives score above the negatives.
  return zimg.astype(np.float32), unit(zimg + 0.5 * rng.standard_normal((batch, width))).astype(
    np.float32
  )


def test_sigmoid_loss_is_siglips_formula():
  zimg, ztxt = _pairs(np.random.default_rng(0), 6, 4)
  t, b = 10.0, -10.0
  logits = t * zimg.astype(np.float64) @ ztxt.T.astype(np.float64) + b
  signs = 2 * np.eye(6) - 1
  expected = np.sum(np.log1p(np.exp(-signs * logits))) / 6  # -log sigmoid(x) = log(1 + e^-x)
  assert float(contrastive.sigmoid_loss(zimg, ztxt, t, b)) == pytest.approx(expected, rel=1e-5)


def test_softmax_loss_is_clips_formula():
  zimg, ztxt = _pairs(np.random.default_rng(1), 5, 3)
  logits = 7.0 * zimg.astype(np.float64) @ ztxt.T.astype(np.float64)
  log_softmax = lambda x, axis: x - np.log(np.sum(np.exp(x), axis=axis, keepdims=True))  # noqa: E731
  expected = -(np.trace(log_softmax(logits, 1)) + np.trace(log_softmax(logits, 0))) / 10
  assert float(contrastive.softmax_loss(zimg, ztxt, 7.0)) == pytest.approx(expected, rel=1e-5)


def test_a_matching_batch_scores_lower_than_a_shuffled_one():
  zimg, ztxt = _pairs(np.random.default_rng(2), 8, 16)
  for loss in (lambda a, b: contrastive.sigmoid_loss(a, b, 10.0, -10.0),
               lambda a, b: contrastive.softmax_loss(a, b, 10.0)):  # fmt: skip
    assert float(loss(zimg, ztxt)) < float(loss(zimg, ztxt[::-1]))


def test_the_chunked_sigmoid_loss_equals_the_whole_batch_on_8_devices():
  out = fresh_python.run_json(
    """
    import json
    import jax, jax.numpy as jnp, numpy as np
    from vit_jax.infra import sharding
    from vit_jax.run import contrastive

    mesh = sharding.make_mesh((("data", -1), ("model", 1)))
    rng = np.random.default_rng(0)
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
    zimg = unit(rng.standard_normal((32, 16))).astype(np.float32)
    ztxt = unit(zimg + 0.5 * rng.standard_normal((32, 16))).astype(np.float32)
    place = lambda x: jax.device_put(x, sharding.batch_sharding(mesh))
    args = (place(zimg), place(ztxt), jnp.float32(3.0), jnp.float32(-2.0))
    whole = jax.jit(jax.value_and_grad(contrastive.sigmoid_loss, argnums=(0, 1, 2, 3)))
    ring = jax.jit(jax.value_and_grad(
        lambda *a: contrastive.sigmoid_loss_chunked(*a, mesh), argnums=(0, 1, 2, 3)))
    (l0, g0), (l1, g1) = whole(*args), ring(*args)
    rel = lambda a, b: float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))
    hlo = ring.lower(*args).compile().as_text()
    print(json.dumps({
      "devices": mesh.shape["data"], "loss": [float(l0), float(l1)],
      "grads_rel": [rel(a, b) for a, b in zip(g1, g0)],
      "all_gather": "all-gather" in hlo, "permute": "collective-permute" in hlo,
    }))
    """,
    fresh_python.clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=8"),
  )
  assert out["devices"] == 8
  assert out["loss"][1] == pytest.approx(out["loss"][0], rel=1e-5)
  assert max(out["grads_rel"]) < 1e-5
  assert out["permute"] and not out["all_gather"]


@pytest.mark.parametrize("loss", ["sigmoid", pytest.param("softmax", marks=pytest.mark.slow)])
def test_accumulated_steps_score_every_pair_against_the_whole_batch(loss):
  """accum_steps=4 gives one batch of 8's loss and update (GradCache), where averaging the
  micro-batches' own losses (each its own contrastive batch of 2) would not."""
  import functools

  import flax.linen as nn
  import jax
  import ml_collections
  import optax

  from vit_jax import models
  from vit_jax.run import steps
  from vit_jax.run.objectives import contrastive as objective_lib

  text = dict(width=16, depth=1, mlp_dim=32, num_heads=2, vocab_size=64, pool="gap")
  config = models.two_tower_config(
    models.get_model_config("testing"), text=text, text_len=6, embed_dim=16
  )
  options = ml_collections.FrozenConfigDict(dict(loss=loss, lock_image=False))
  objective = objective_lib.Contrastive(config, options)
  rng = np.random.default_rng(0)
  batch = {
    "image": rng.uniform(-1, 1, (8, 16, 16, 3)).astype(np.float32),
    "text": rng.integers(3, 64, (8, 6)).astype(np.int32),
  }
  params = nn.unbox(jax.jit(objective.init)(jax.random.key(0), batch["image"][:1]))
  if "b" in params:  # SigLIP's -10 leaves the negatives near zero gradient: weigh them in
    params["b"] = np.zeros_like(params["b"])
  tx = optax.sgd(1.0)  # the update is minus the gradient
  state = steps.TrainState(jax.numpy.int32(0), params, tx.init(params), jax.random.PRNGKey(1))

  def step(accum, whole_batch=True):
    fn = functools.partial(
      steps.train_step,
      loss_fn=objective.loss,
      tx=tx,
      accum_steps=accum,
      accumulated_value_and_grad=objective.accumulated_value_and_grad if whole_batch else None,
    )
    new, metrics = jax.jit(fn)(state, batch)
    return float(metrics["train/loss"]), jax.tree.leaves(new.params)

  one_loss, one = step(1)
  four_loss, four = step(4)
  assert four_loss == pytest.approx(one_loss, rel=1e-5)
  for a, b in zip(four, one):  # the same sums in another order: float32 rounding apart
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  _, naive = step(4, whole_batch=False)
  moved = [np.max(np.abs(a - p)) for a, p in zip(one, jax.tree.leaves(params))]
  differ = [np.max(np.abs(a - b)) for a, b in zip(naive, one)]
  assert max(differ) > 0.01 * max(moved)
