"""vit_jax.optim: schedule values, a hand-computed SGD step, masked decoupled weight decay."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests import train_fixtures
from vit_jax.models import create_model, get_model_config
from vit_jax.run import optim


def _config(**optim_overrides):
  """SGD momentum 0.9 (configs/common.py), no clipping; base 1.0 with 10 warm-up steps and
  cosine decay to 0.1 over 110 steps, round values for hand computations."""
  return train_fixtures.common_config(
    total_steps=110,
    lr=dict(base=1.0, warmup_steps=10, decay="cosine", end=0.1),
    optim={"grad_clip_norm": None, **optim_overrides},
  )


def _values(schedule, steps):
  return np.array([float(schedule(s)) for s in steps])


# ----------------------------------------------------------------------------- schedule


def test_cosine_schedule_warmup_midpoint_and_end():
  schedule = optim.make_schedule(optim.OptimizerSettings.from_config(_config()))
  # Warm-up start, middle, end; cosine midpoint (base + end) / 2; end at and after total.
  np.testing.assert_allclose(
    _values(schedule, [0, 5, 10, 60, 110, 500]), [0.0, 0.5, 1.0, 0.55, 0.1, 0.1], atol=1e-6
  )
  # A quarter of the way through the decay: end + (base - end) * (1 + cos(pi/4)) / 2.
  quarter = 0.1 + 0.9 * (1 + np.cos(np.pi / 4)) / 2
  np.testing.assert_allclose(float(schedule(35)), quarter, atol=1e-6)
  # Jittable with a traced step, as inside train_step.
  np.testing.assert_allclose(float(jax.jit(schedule)(jnp.int32(60))), 0.55, atol=1e-6)


def test_linear_and_constant_schedules():
  config = _config()
  config.lr.decay = "linear"
  np.testing.assert_allclose(
    _values(
      optim.make_schedule(optim.OptimizerSettings.from_config(config)), [0, 5, 10, 35, 60, 110, 200]
    ),
    [0.0, 0.5, 1.0, 0.775, 0.55, 0.1, 0.1],
    atol=1e-6,
  )
  config.lr.decay = "constant"
  np.testing.assert_allclose(
    _values(optim.make_schedule(optim.OptimizerSettings.from_config(config)), [0, 5, 10, 60, 110]),
    [0.0, 0.5, 1.0, 1.0, 1.0],
    atol=1e-6,
  )
  config.lr.warmup_steps = 0
  np.testing.assert_allclose(
    _values(optim.make_schedule(optim.OptimizerSettings.from_config(config)), [0, 1, 110]),
    [1.0] * 3,
  )


def test_schedule_without_training_steps_is_defined():
  config = _config()
  config.total_steps = 0  # evaluation-only runs still build an optimizer
  config.lr.warmup_steps = 0
  assert float(
    optim.make_schedule(optim.OptimizerSettings.from_config(config))(0)
  ) == pytest.approx(1.0)


@pytest.mark.parametrize(
  "field,value,match",
  [
    ("warmup_steps", 110, r"warmup_steps=110.*total_steps=110"),
    ("warmup_steps", -1, "negative"),
    ("decay", "exponential", r"'exponential'.*cosine"),
  ],
)
def test_schedule_errors(field, value, match):
  config = _config()
  config.lr[field] = value
  with pytest.raises(ValueError, match=match):
    optim.make_schedule(optim.OptimizerSettings.from_config(config))


@pytest.mark.parametrize(
  "field,value,match",
  [
    ("name", "lamb", r"'lamb'.*sgd.*adam.*adamw"),
    ("momentum_dtype", "float16", r"'float16'.*bfloat16"),
    ("weight_decay", -0.1, "negative"),
  ],
)
def test_optimizer_errors(field, value, match):
  with pytest.raises(ValueError, match=match):
    optim.make_optimizer(optim.OptimizerSettings.from_config(_config(**{field: value})))


# ----------------------------------------------------------------------------- SGD


def test_sgd_momentum_clip_and_decay_match_hand_computation():
  config = _config(momentum=0.9, grad_clip_norm=1.0, weight_decay=0.01)
  config.lr.decay = "constant"
  config.lr.warmup_steps = 4
  tx, schedule = optim.make_optimizer(optim.OptimizerSettings.from_config(config))
  params = {"w": jnp.array([1.0, -2.0]), "bias": jnp.array([0.5])}
  grads = [
    {"w": jnp.array([3.0, 4.0]), "bias": jnp.array([0.0])},  # norm 5: clipped
    {"w": jnp.array([0.1, -0.2]), "bias": jnp.array([0.2])},  # norm 0.3: kept
    {"w": jnp.array([-1.0, 1.0]), "bias": jnp.array([1.0])},
  ]  # norm sqrt(3)
  state = tx.init(params)
  update = jax.jit(tx.update)

  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  for step, g in enumerate(grads):
    updates, state = update(g, state, params)
    params = optax.apply_updates(params, updates)
    # By hand: clip by global norm, momentum, decoupled decay (kernels only), times -lr.
    g = {k: np.asarray(v, np.float64) for k, v in g.items()}
    norm = np.sqrt(sum(np.sum(v**2) for v in g.values()))
    scale = min(1.0, 1.0 / norm)
    lr = [0.0, 0.25, 0.5][step]  # warm-up over 4 steps to base 1.0
    assert float(schedule(step)) == pytest.approx(lr)
    for k in p:
      m[k] = 0.9 * m[k] + scale * g[k]
      direction = m[k] + (0.01 * p[k] if k == "w" else 0.0)
      p[k] = p[k] - lr * direction
    for k in p:
      np.testing.assert_allclose(np.asarray(params[k]), p[k], rtol=1e-6, atol=1e-7)


def test_sgd_without_momentum_is_plain_gradient_descent():
  config = _config(momentum=0.0)
  config.lr.decay = "constant"
  config.lr.warmup_steps = 0
  tx, _ = optim.make_optimizer(optim.OptimizerSettings.from_config(config))
  params = {"kernel": jnp.array([1.0, 2.0])}
  updates, _ = tx.update({"kernel": jnp.array([0.5, -1.0])}, tx.init(params), params)
  np.testing.assert_allclose(updates["kernel"], [-0.5, 1.0])


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_bfloat16_momentum_dtype(name):
  tx, _ = optim.make_optimizer(
    optim.OptimizerSettings.from_config(_config(name=name, momentum_dtype="bfloat16"))
  )
  params = {"kernel": jnp.ones((3, 4), jnp.float32)}
  state = tx.init(params)
  updates, state = jax.jit(tx.update)({"kernel": jnp.full((3, 4), 0.1)}, state, params)
  dtypes = {str(x.dtype) for x in jax.tree.leaves(state) if x.ndim}
  if name == "sgd":
    assert dtypes == {"bfloat16"}  # the only non-scalar state: the momentum buffer
  else:
    mu, nu = state[0].mu["kernel"], state[0].nu["kernel"]
    assert (mu.dtype, nu.dtype) == (jnp.bfloat16, jnp.float32)
  assert updates["kernel"].dtype == jnp.float32
  assert optax.apply_updates(params, updates)["kernel"].dtype == jnp.float32


# ----------------------------------------------------------------------------- weight decay


@functools.lru_cache(maxsize=None)
def _model_params(scan: bool, **changes):
  """The `testing` model's boxed parameter tree (its config with ``changes``), filled with
  distinct non-zero values.

  Tree, shapes and boxes come from the real model (via `jax.eval_shape`); the values are a
  deterministic ramp instead of a random init, which is slow eagerly on CPU.
  """
  config = get_model_config("testing")
  config.update(changes)
  model = create_model(config, num_classes=10, scan=scan)
  abstract = jax.eval_shape(model.init, {"params": jax.random.PRNGKey(0)}, jnp.zeros((1, 8, 8, 3)))[
    "params"
  ]
  return jax.tree.map(
    lambda s: jnp.linspace(0.1, 1.0, int(np.prod(s.shape)), dtype=s.dtype).reshape(s.shape),
    abstract,
  )


def _flat(tree) -> dict[str, object]:
  return {
    "/".join(str(k.key) for k in path): leaf
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def _expected_decay(path: str) -> bool:
  leaf = path.split("/")[-1]
  return not (leaf in ("bias", "scale", "cls") or "pos_embedding" in path)


@pytest.mark.parametrize("scan", [False, True])
def test_weight_decay_mask_on_model_tree(scan):
  """(With mixed RoPE: its learned frequencies are not decayed, as timm's.)"""
  boxed = _model_params(scan, rope="mixed")
  mask = _flat(optim.weight_decay_mask(boxed))
  # Boxed and plain trees give the same plain mask.
  assert mask == _flat(optim.weight_decay_mask(nn.unbox(boxed)))
  decayed = sorted(p for p, v in mask.items() if v)
  assert all(isinstance(v, bool) for v in mask.values())
  assert all(p.endswith("kernel") for p in decayed), decayed
  assert "embedding/kernel" in decayed and "head/kernel" in decayed
  for name in (
    "cls",
    "Transformer/posembed_input/pos_embedding",
    "embedding/bias",
    "Transformer/encoder_norm/scale",
  ):
    assert mask[name] is False, name
  block = "Transformer/encoderblock" + ("" if scan else "_0")
  assert mask[f"{block}/LayerNorm_0/scale"] is False
  assert mask[f"{block}/MultiHeadDotProductAttention_1/query/bias"] is False
  assert mask[f"{block}/MlpBlock_3/Dense_1/kernel"] is True
  assert mask[f"{block}/MultiHeadDotProductAttention_1/rope_freqs"] is False
  if scan:  # a stacked norm scale is 2-D and a stacked bias 3-D, yet not decayed
    plain = _flat(nn.unbox(boxed))
    assert plain[f"{block}/LayerNorm_0/scale"].ndim == 2
    assert plain[f"{block}/MultiHeadDotProductAttention_1/query/bias"].ndim == 3


@pytest.mark.parametrize("scan,decay_all", [(False, False), (True, False), (True, True)])
def test_adamw_decoupled_decay_on_model_tree(scan, decay_all):
  lr, wd = 0.5, 0.1
  config = _config(name="adamw", weight_decay=wd, decay_all_params=decay_all, grad_clip_norm=1.0)
  config.lr.decay = "constant"
  config.lr.warmup_steps = 0
  config.lr.base = lr
  tx, _ = optim.make_optimizer(optim.OptimizerSettings.from_config(config))
  boxed = _model_params(scan)

  # tx.init on boxes under eval_shape (how train.py derives shardings): moments keep boxes.
  abstract = jax.eval_shape(tx.init, boxed)
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)
  boxes = [x for x in jax.tree.leaves(abstract, is_leaf=is_box) if is_box(x)]
  assert len(boxes) == 2 * len(jax.tree.leaves(boxed))  # mu and nu

  # Zero gradients: Adam's direction is exactly 0, so the update is the decay alone,
  # -lr * wd * param, not divided by Adam's second moment (decoupled).
  params = nn.unbox(boxed)  # no leaf is zero
  state = tx.init(params)
  updates, _ = jax.jit(tx.update)(jax.tree.map(jnp.zeros_like, params), state, params)
  flat_p, flat_u = _flat(params), _flat(updates)
  for path, u in flat_u.items():
    decayed = decay_all or _expected_decay(path)
    want = -lr * wd * np.asarray(flat_p[path]) if decayed else np.zeros(u.shape)
    np.testing.assert_allclose(np.asarray(u), want, rtol=1e-6, atol=1e-8, err_msg=path)


def test_adam_and_adamw_are_the_same_decoupled_optimizer():
  params = {"dense": {"kernel": jnp.arange(6.0).reshape(2, 3), "bias": jnp.ones(3)}}
  grads = jax.tree.map(lambda x: 0.3 * x - 0.2, params)
  results = []
  for name in ("adam", "adamw"):
    tx, _ = optim.make_optimizer(
      optim.OptimizerSettings.from_config(_config(name=name, weight_decay=0.05))
    )
    results.append(tx.update(grads, tx.init(params), params)[0])
  jax.tree.map(np.testing.assert_array_equal, *results)
