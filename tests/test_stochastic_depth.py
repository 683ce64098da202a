"""Stochastic depth (`layers.DropPath`, `layers.drop_path_rates`) and the head-bias init."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.models import create_model, get_model_config, layers


def tiny(**overrides):
  return create_model(get_model_config("testing"), num_classes=10, **overrides)


def images(n=4, seed=1):
  return jax.random.uniform(jax.random.key(seed), (n, 8, 8, 3), minval=-1, maxval=1)


def test_rates_are_timms_linear_schedule():
  rates = layers.drop_path_rates(12, 0.1)
  assert rates[0] == 0.0 and rates[-1] == pytest.approx(0.1, abs=1e-8)
  np.testing.assert_allclose(np.diff(rates), 0.1 / 11, rtol=1e-5)
  assert layers.drop_path_rates(1, 0.3) == (0.0,)  # torch.linspace(0, r, 1) == [0]
  with pytest.raises(ValueError, match=r"stoch_depth=1.0 must be in \[0, 1\)"):
    layers.drop_path_rates(12, 1.0)


def test_rates_equal_torch_linspace():
  torch = pytest.importorskip("torch")
  for depth, rate in ((12, 0.1), (24, 0.2), (32, 0.3)):
    theirs = [x.item() for x in torch.linspace(0, rate, depth)]
    np.testing.assert_allclose(layers.drop_path_rates(depth, rate), theirs, rtol=1e-6, atol=1e-9)


def test_drop_path_drops_whole_examples_and_its_mean_is_the_branch():
  """Each example's branch is 0 or branch / (1 - rate); over 20,000 masks the mean is the
  branch within 3% (the kept share's standard error is 0.3% at rate 0.3: 10 sigma)."""
  rate, n = 0.3, 20_000
  branch = jax.random.normal(jax.random.key(0), (1, 5, 4))  # [1, N, D]
  y = jnp.broadcast_to(branch, (n, 5, 4))  # the same branch under n masks
  out = layers.DropPath().apply({}, y, rate, False, rngs={"dropout": jax.random.key(1)})
  out = np.asarray(out)
  dropped = np.all(out == 0, axis=(1, 2))
  np.testing.assert_allclose(
    out[~dropped], np.broadcast_to(branch / (1 - rate), out[~dropped].shape), rtol=1e-6
  )
  assert abs(dropped.mean() - rate) < 0.02
  np.testing.assert_allclose(out.mean(0), branch[0], rtol=0.03, atol=0.03 * np.abs(branch).max())


@pytest.mark.parametrize("scan", [False, True])
@pytest.mark.parametrize("remat", [False, True])
def test_identity_in_evaluation_and_random_in_training(scan, remat):
  model = tiny(stoch_depth=0.5, scan=scan, remat=remat)
  plain = tiny(scan=scan, remat=remat)
  x = images()
  params = plain.init(jax.random.key(0), x)["params"]
  # A random head, so the logits carry the blocks' output.
  params["head"] = jax.tree.map(
    lambda a: jax.random.normal(jax.random.key(2), a.shape), params["head"]
  )
  np.testing.assert_array_equal(
    model.apply({"params": params}, x), plain.apply({"params": params}, x)
  )
  trained = [
    model.apply({"params": params}, x, train=True, rngs={"dropout": jax.random.key(k)})
    for k in (3, 4)
  ]
  assert not np.array_equal(trained[0], trained[1])
  assert not np.array_equal(trained[0], plain.apply({"params": params}, x, train=True))


@pytest.mark.parametrize("scan", [False, True])
def test_off_is_todays_model_bit_for_bit(scan):
  """stoch_depth=0: the same parameters and, in training with dropout, the same outputs
  as a model that never heard of it (no random key drawn, dropout keys unchanged)."""
  x = images()
  before = tiny(scan=scan, dropout_rate=0.1)
  after = create_model(
    get_model_config("testing"), num_classes=10, scan=scan, dropout_rate=0.1, stoch_depth=0.0
  )
  p_before, p_after = (m.init(jax.random.key(0), x)["params"] for m in (before, after))
  jax.tree.map(np.testing.assert_array_equal, nn.unbox(p_before), nn.unbox(p_after))
  rngs = {"dropout": jax.random.key(5)}
  np.testing.assert_array_equal(
    before.apply({"params": p_before}, x, train=True, rngs=rngs),
    after.apply({"params": p_after}, x, train=True, rngs=rngs),
  )
  jaxpr = str(
    jax.make_jaxpr(lambda p: after.apply({"params": p}, x, train=True, rngs=rngs))(p_after)
  )
  draws = jaxpr.count("random_bits")
  without_dropout = str(
    jax.make_jaxpr(lambda p: tiny(scan=scan).apply({"params": p}, x, train=True, rngs=rngs))(
      p_after
    )
  )
  assert draws > 0 and without_dropout.count("random_bits") == 0


def test_head_bias_starts_at_head_bias_init():
  cfg = get_model_config("testing")
  cfg.head_bias_init = -6.9
  params = create_model(cfg, num_classes=10).init(jax.random.key(0), images(1))["params"]
  np.testing.assert_array_equal(nn.unbox(params)["head"]["bias"], np.full(10, -6.9, np.float32))
  np.testing.assert_array_equal(nn.unbox(params)["head"]["kernel"], 0.0)
