"""The pure train step (learning, gradient accumulation) and the losses train and eval share."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests import train_fixtures
from vit_jax import run
from vit_jax.models import create_model, get_model_config
from vit_jax.run import losses
from vit_jax.run.objectives import classification


def make_state(model, tx, image_size=8, seed=0):
  params = nn.unbox(
    model.init(jax.random.key(seed), jnp.zeros((1, image_size, image_size, 3)))["params"]
  )
  return run.TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=tx.init(params),
    rng=jax.random.PRNGKey(seed),
  )


def fixed_batch(seed=0):
  return jax.tree.map(jnp.asarray, train_fixtures.fixed_batch(seed=seed))


def step(state, batch, model, tx, accum_steps=1):
  loss_fn = classification.Classification(model, "softmax_xent", 0.0).loss
  return run.train_step(state, batch, loss_fn=loss_fn, tx=tx, accum_steps=accum_steps)


def tiny(**overrides):
  return create_model(get_model_config("testing"), num_classes=10, **overrides)


def test_loss_falls_on_a_fixed_batch():
  model, tx = tiny(), optax.adam(3e-3)
  state, batch = make_state(model, tx), fixed_batch()
  jitted = jax.jit(lambda s, b: step(s, b, model, tx))
  values = []
  for _ in range(30):
    state, metrics = jitted(state, batch)
    values.append(float(metrics["train/loss"]))
  assert values[0] == pytest.approx(np.log(10), rel=1e-3)  # zero head: uniform prediction
  assert values[-1] < 0.3 * values[0]
  assert int(state.step) == 30


def test_accumulated_micro_batches_equal_one_big_batch():
  """4 micro-batches of 4 give the gradient (and so the update) of one batch of 16."""
  model = tiny()
  tx = optax.sgd(0.1)
  state, batch = make_state(model, tx), fixed_batch(seed=1)
  # Make the head non-zero so that every parameter gets a gradient.
  state = state.replace(
    params={
      **state.params,
      "head": jax.tree.map(lambda x: 0.1 * jnp.ones_like(x), state.params["head"]),
    }
  )
  big, m_big = step(state, batch, model, tx, accum_steps=1)
  acc, m_acc = step(state, batch, model, tx, accum_steps=4)
  np.testing.assert_allclose(m_acc["train/loss"], m_big["train/loss"], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(acc.params), jax.tree.leaves(big.params)):
    np.testing.assert_allclose(a, b, atol=1e-6)
  assert not np.allclose(acc.params["head"]["kernel"], state.params["head"]["kernel"])


def test_dropout_rng_comes_from_the_step():
  model = tiny(dropout_rate=0.3)
  tx = optax.sgd(0.0)  # parameters stay put: only the dropout mask can change the loss
  state, batch = make_state(model, tx), fixed_batch()
  state = state.replace(
    params={
      **state.params,
      "head": jax.tree.map(
        lambda x: jax.random.normal(jax.random.key(7), x.shape), state.params["head"]
      ),
    }
  )
  _, m0 = step(state, batch, model, tx)
  _, m0_again = step(state, batch, model, tx)
  _, m1 = step(state.replace(step=state.step + 1), batch, model, tx)
  assert float(m0["train/loss"]) == float(m0_again["train/loss"])
  assert float(m0["train/loss"]) != float(m1["train/loss"])


def test_sigmoid_loss_and_unknown_loss():
  logits = jnp.array([[0.0, 0.0]])
  labels = jnp.array([[1.0, 0.0]])
  np.testing.assert_allclose(
    losses.per_example_loss(logits, labels, "sigmoid_xent"), [2 * np.log(2)], rtol=1e-6
  )
  np.testing.assert_allclose(
    losses.per_example_loss(logits, labels, "softmax_xent"), [np.log(2)], rtol=1e-6
  )
  with pytest.raises(ValueError, match="hinge.*softmax_xent"):
    losses.per_example_loss(logits, labels, "hinge")


@pytest.mark.parametrize("loss", losses.LOSSES)
def test_eval_loss_is_the_training_loss(loss):
  """The eval step sums config.loss over the real examples (padding masked out)."""
  model = tiny()
  params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)))["params"])
  # A random head: non-uniform logits, where the two losses differ.
  params["head"] = jax.tree.map(
    lambda x: jax.random.normal(jax.random.key(1), x.shape), params["head"]
  )
  batch = fixed_batch()
  batch["mask"] = jnp.array([1.0] * 12 + [0.0] * 4)  # the last 4 rows are padding
  sums = classification.Classification(model, loss, 0.0).eval_step(params, batch)
  z = np.asarray(model.apply({"params": params}, batch["image"], train=False), np.float64)
  y = np.asarray(batch["label"], np.float64)
  if loss == "sigmoid_xent":  # sum over classes of -y log s(z) - (1 - y) log(1 - s(z))
    per_example = np.sum(np.logaddexp(0, z) - y * z, axis=-1)
  else:  # -log softmax(z)[label]
    per_example = np.log(np.sum(np.exp(z), -1)) - np.sum(y * z, -1)
  np.testing.assert_allclose(float(sums["loss_sum"]), per_example[:12].sum(), rtol=1e-5)
  assert float(sums["count"]) == 12
