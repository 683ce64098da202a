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
    from vit_jax import sharding
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
