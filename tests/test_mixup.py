"""Mixup and CutMix in the train step (`vit_jax.run.mixup`), and label smoothing's loss."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests import train_fixtures
from vit_jax.run import losses, mixup

MIXUP = mixup.MixupSettings(p=0.2, cutmix=False)
CUTMIX = mixup.MixupSettings(p=0.2, cutmix=True)


def batch(n=16, size=8, k=10, seed=0):
  return jax.tree.map(jnp.asarray, train_fixtures.fixed_batch(n, size, k, seed))


@pytest.mark.parametrize("p", [0.2, 0.5, 1.0, 5.0])
def test_the_weight_keeps_at_least_half(p):
  keys = jax.random.split(jax.random.key(0), 2000)
  a = np.asarray(jax.vmap(lambda r: mixup.mixing_weight(r, p))(keys))
  assert np.all((a >= 0.5) & (a <= 1.0))
  # max(a, 1 - a) of a symmetric Beta: its mean is 1 - E|a - 1/2|, larger for smaller p.
  assert a.std() > 0.01


@pytest.mark.parametrize("p", [0.2, 0.5, 0.8])
def test_the_weight_is_the_folded_beta_of_big_vision(p):
  """20,000 draws against scipy's Beta(p, p) folded to max(a, 1 - a) (in float32, whose
  rounding puts a share of the draws at exactly 1): two-sample Kolmogorov-Smirnov."""
  stats = pytest.importorskip("scipy.stats")
  keys = jax.random.split(jax.random.key(7), 20_000)
  ours = np.asarray(jax.vmap(lambda r: mixup.mixing_weight(r, p))(keys))
  theirs = stats.beta(p, p).rvs(100_000, random_state=0)
  theirs = np.maximum(theirs, 1 - theirs).astype(np.float32)
  assert stats.ks_2samp(ours, theirs).pvalue > 1e-3


def test_the_weight_compiles_without_a_loop_on_tpu():
  """jax.random.beta rejects in a while loop; a looping step hides its FLOPs from XLA's
  count (the plan's FLOPs and step-time bound), so the weight is drawn loop-free."""
  lowered = jax.jit(lambda r: mixup.mixing_weight(r, 0.2)).trace(jax.random.key(0))
  assert "stablehlo.while" not in lowered.lower(lowering_platforms=("tpu",)).as_text()


def test_the_weight_tends_to_one_as_p_tends_to_zero():
  keys = jax.random.split(jax.random.key(1), 2000)
  a = np.asarray(jax.vmap(lambda r: mixup.mixing_weight(r, 1e-4))(keys))
  assert np.all(np.isfinite(a)) and a.min() > 0.999


@pytest.mark.parametrize("settings", [MIXUP, CUTMIX], ids=["mixup", "cutmix"])
def test_mixed_labels_sum_to_one_and_mix_only_the_neighbour(settings):
  b = batch()
  mixed = mixup.mix_batch(b, jax.random.key(3), settings, blocks=2)
  labels = np.asarray(mixed["label"])
  np.testing.assert_allclose(labels.sum(-1), 1.0, rtol=1e-6)
  one_hot = np.asarray(b["label"])
  for row in range(16):
    block_start = row // 8 * 8
    neighbour = block_start + (row - block_start - 1) % 8  # rolled within its device's block
    own = labels[row] @ one_hot[row]
    other = labels[row] @ one_hot[neighbour]
    same_class = one_hot[row] @ one_hot[neighbour]
    assert own >= 0.5 - 1e-6
    np.testing.assert_allclose(own + other * (1 - same_class), 1.0, rtol=1e-6)


def test_mixup_blends_images_with_the_labels_weight():
  b = batch()
  mixed = mixup.mix_batch(b, jax.random.key(4), MIXUP, blocks=4)
  a = float(mixup.mixing_weight(jax.random.split(jax.random.key(4))[0], MIXUP.p))
  images = np.asarray(b["image"]).reshape(4, 4, -1)
  expected = a * images + (1 - a) * np.roll(images, 1, axis=1)
  np.testing.assert_allclose(np.asarray(mixed["image"]).reshape(4, 4, -1), expected, rtol=1e-5)


def test_cutmix_pastes_a_box_and_weighs_labels_by_its_area():
  b = batch(n=8, size=32)
  mixed = mixup.mix_batch(b, jax.random.key(5), CUTMIX, blocks=1)
  images, other = np.asarray(b["image"]), np.roll(np.asarray(b["image"]), 1, axis=0)
  pasted = np.all(np.asarray(mixed["image"]) == other, axis=-1)  # [B, H, W]
  assert np.all(pasted == pasted[:1])  # one box for the batch
  box = pasted[0]
  rows, cols = np.nonzero(box)
  assert box[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1].all()  # a rectangle
  np.testing.assert_array_equal(np.asarray(mixed["image"])[:, ~box], images[:, ~box])
  kept = 1.0 - box.mean()
  labels, one_hot = np.asarray(mixed["label"]), np.asarray(b["label"])
  np.testing.assert_allclose(labels, kept * one_hot + (1 - kept) * np.roll(one_hot, 1, 0), 1e-6)


def test_p_zero_is_off_and_a_negative_p_is_refused():
  assert mixup.make_mixer(mixup.MixupSettings(0.0, False), blocks=1) is None
  with pytest.raises(ValueError, match=r"config.mixup.p=-0.1 must be >= 0"):
    mixup.MixupSettings(-0.1, False)


def test_the_train_step_mixes_by_the_step_key_alone(tiny_config):
  """Two builds of the same run mix a batch identically at the same step (resume is
  exact), and mixing changes the update (the zero head's gradient is features x (p - y))."""
  tiny_config.mixup.p = 0.5
  builds = [train_fixtures.build_steps(tiny_config) for _ in range(2)]
  tiny_config.mixup.p = 0.0
  builds.append(train_fixtures.build_steps(tiny_config))
  norms = []
  for steps in builds:
    b = jax.device_put(batch(), steps.batch_sharding)
    norms.append(float(steps.train_step(steps.init_state(), b)[1]["train/grad_norm"]))
  assert norms[0] == norms[1]
  assert norms[0] != norms[2]


def test_mixup_with_masked_patch_prediction_is_refused(tiny_config):
  tiny_config.objective = "mpp"
  tiny_config.mixup.p = 0.2
  with pytest.raises(ValueError, match=r"config.mixup.p=0.2 .*'mpp'.*config.mixup.p=0"):
    train_fixtures.build_steps(tiny_config)


def test_label_smoothing_loss_by_hand():
  """softmax_xent of smoothed labels: -sum_k ((1 - alpha) y_k + alpha / K) log p_k."""
  logits = jnp.array([[2.0, 0.5, -1.0, 0.0]])
  labels = jnp.array([[0.0, 1.0, 0.0, 0.0]])
  alpha = 0.1
  z = [2.0, 0.5, -1.0, 0.0]
  log_total = np.log(sum(np.exp(v) for v in z))
  by_hand = -sum(t * (v - log_total) for t, v in zip([0.025, 0.925, 0.025, 0.025], z))
  smoothed = losses.smooth_labels(labels, alpha)
  value = losses.per_example_loss(logits, smoothed, "softmax_xent")
  np.testing.assert_allclose(float(value[0]), by_hand, rtol=1e-6)
  assert losses.smooth_labels(labels, 0.0) is labels
  with pytest.raises(ValueError, match=r"config.label_smoothing=1.0 must be in \[0, 1\)"):
    losses.check_label_smoothing(1.0)


def test_the_training_loss_smooths_and_evaluation_does_not(tiny_config):
  tiny_config.label_smoothing = 0.2
  steps = train_fixtures.build_steps(tiny_config)
  params = steps.init_state().params
  b = batch()
  # The zero head predicts uniformly: every label, smoothed or not, costs log K.
  train = float(steps.objective.loss(params, b, jax.random.key(0)))
  np.testing.assert_allclose(train, np.log(10), rtol=1e-6)
  head = jax.tree.map(lambda x: jax.random.normal(jax.random.key(1), x.shape), params["head"])
  params = {**params, "head": head}
  logits = steps.objective.model.apply({"params": params}, b["image"], train=False)
  smoothed = optax.softmax_cross_entropy(logits, 0.8 * b["label"] + 0.02).mean()
  train = steps.objective.loss(params, b, jax.random.key(0))
  np.testing.assert_allclose(float(train), float(smoothed), rtol=1e-5)
  evaluated = steps.objective.eval_step(params, {**b, "mask": jnp.ones(16)})
  plain = optax.softmax_cross_entropy(logits, b["label"]).sum()
  np.testing.assert_allclose(float(evaluated["loss_sum"]), float(plain), rtol=1e-5)
