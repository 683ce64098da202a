"""`vit_jax.Model` as a JAX value: a pytree whose leaves are its parameters, run inside
`jax.jit`, `jax.grad` and `jax.vmap`, trained by optax into a model that saves and reloads
bitwise; and its NNX view (`Model.to_nnx`), trained by ``nnx.Optimizer``. A tiny ViT
(`testing`: width 32, 16x16 inputs), saved and loaded as a user's loaded model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import vit_jax
from tests import interop_fixtures
from vit_jax.infra import errors

X = interop_fixtures.images(4, 16)  # float32 [4, 16, 16, 3]
Y = np.array([0, 1, 2, 0])


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> vit_jax.Model:
  """A loaded model: a created one written as npz and read back (numpy leaves)."""
  created = vit_jax.create("testing", num_classes=3, image_size=16, seed=3)
  return vit_jax.load(created.save(tmp_path_factory.mktemp("m") / "testing"))


def _loss(m: vit_jax.Model | nnx.Module) -> jax.Array:
  return optax.softmax_cross_entropy_with_integer_labels(m(X), Y).mean()


def _leaves_equal(a, b) -> bool:
  return all(np.array_equal(u, v) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_a_model_is_a_pytree_of_its_parameters(model):
  leaves, treedef = jax.tree.flatten(model)
  assert len(leaves) == len(jax.tree.leaves(model.params))
  again = jax.tree.unflatten(treedef, leaves)
  assert isinstance(again, vit_jax.Model) and again.class_names == model.class_names
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(model)[0]]
  assert ".params['head']['kernel']" in paths
  doubled = jax.tree.map(lambda p: p * 2, model)
  assert doubled.config is model.config and doubled.image_size == model.image_size
  np.testing.assert_array_equal(doubled.params["head"]["bias"], model.params["head"]["bias"] * 2)


def test_jit_vmap_and_the_eager_path_agree(model):
  want = model(X)  # eager: numpy out, batched on the host
  assert isinstance(want, np.ndarray)
  got = jax.jit(lambda m, x: m(x))(model, X)
  assert isinstance(got, jax.Array)
  np.testing.assert_allclose(got, want, atol=1e-6)
  np.testing.assert_allclose(jax.jit(lambda x: model.logits(x))(X), want, atol=1e-6)
  features = jax.jit(lambda m, x: m.features(x))(model, X)
  np.testing.assert_allclose(features, model.features(X), atol=1e-6)
  tokens = jax.jit(lambda m, x: m.features(x, pool=False))(model, jnp.asarray(X))
  np.testing.assert_allclose(tokens, model.features(X, pool=False), atol=1e-6)  # [4, 17, 32]
  # vmap under jit (as a user's step would run it): traced alike, compiled as one program
  # rather than dispatched op by op.
  per_image = jax.jit(jax.vmap(lambda x: model(x[None])[0]))(X)
  np.testing.assert_allclose(per_image, want, atol=1e-6)
  # An ensemble: two models of one facts stacked, vmapped over the stack.
  other = jax.tree.map(lambda p: p * 0.5, model)
  stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), model, other)
  both = jax.jit(jax.vmap(lambda m: m(X)))(stacked)
  np.testing.assert_allclose(both[1], other(X), atol=1e-6)


def test_grad_through_optax_into_a_model_that_saves_and_reloads_bitwise(model, tmp_path):
  opt = optax.adamw(1e-2)

  @jax.jit
  def step(m, state):
    loss, g = jax.value_and_grad(_loss)(m)
    updates, state = opt.update(g, state, m)
    return optax.apply_updates(m, updates), state, loss, g

  trained, state = model, opt.init(model)
  losses = []
  for i in range(3):
    trained, state, loss, grads = step(trained, state)
    losses.append(float(loss))
    if i == 0:  # the gradient at the loaded model: a Model of its parameters' gradients
      assert isinstance(grads, vit_jax.Model) and np.any(grads.params["head"]["kernel"])
      assert jax.tree.structure(grads) == jax.tree.structure(model)
  assert losses[2] < losses[0] and float(_loss(trained)) < losses[2]
  again = vit_jax.load(trained.save(tmp_path / "trained"))
  assert _leaves_equal(again.params, trained.params) and again.class_names == model.class_names
  np.testing.assert_array_equal(again(X), trained(X))
  trained.save(tmp_path / "timm", format="timm")  # and it exports
  assert (tmp_path / "timm" / "model.safetensors").is_file()


def test_replace_takes_new_parameters_and_refuses_other_shapes(model):
  halved = model.replace(params=jax.tree.map(lambda p: p / 2, model.params))
  np.testing.assert_array_equal(halved.params["head"]["kernel"], model.params["head"]["kernel"] / 2)
  assert halved.source == model.source and halved.batch_size == model.batch_size
  wrong = dict(model.params, head={"kernel": np.zeros((32, 7)), "bias": np.zeros(7)})
  with pytest.raises(errors.ConfigError, match=r"\['head'\]\['bias'\]: \(7,\) for \(3,\)"):
    model.replace(params=wrong)
  with pytest.raises(AttributeError, match=r"model = model.replace\(params=new\)"):
    model.params = wrong


def test_the_nnx_view_equals_the_model_trains_and_comes_back(model, tmp_path):
  view = model.to_nnx()
  assert isinstance(view, nnx.Module)
  params = nnx.state(view, nnx.Param)
  assert len(jax.tree.leaves(params)) == len(jax.tree.leaves(model.params))
  np.testing.assert_allclose(np.asarray(view(X)), model(X), atol=1e-6)
  np.testing.assert_allclose(np.asarray(view.features(X)), model.features(X), atol=1e-6)
  optimizer = nnx.Optimizer(view, optax.sgd(0.1), wrt=nnx.Param)

  @nnx.jit
  def step(v, opt):
    loss, grads = nnx.value_and_grad(_loss)(v)
    opt.update(v, grads)
    return loss

  losses = [float(step(view, optimizer)) for _ in range(3)]
  assert losses[2] < losses[0]
  back = view.to_model()
  assert isinstance(back, vit_jax.Model) and back.class_names == model.class_names
  np.testing.assert_allclose(back(X), np.asarray(view(X)), atol=1e-6)
  again = vit_jax.load(back.save(tmp_path / "from_nnx"))
  assert _leaves_equal(again.params, back.params)
