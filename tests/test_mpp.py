"""Masked patch prediction: corruption, targets, the loss, and runs through vit_jax.main."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import traverse_util
from tensorboard.backend.event_processing import event_accumulator

from configs import mpp as mpp_config
from tests import train_fixtures
from vit_jax import models, run
from vit_jax.models import mpp as mpp_model
from vit_jax.run.objectives import masked_patches as mpp
from vit_jax.weights import orbax_steps

PAPER = mpp_model.Corruption(rate=0.5, mask=0.8, random=0.1)


def test_corruption_statistics_and_untouched_patches():
  b, n, d = 64, 256, 8
  kind, source = mpp_model.corruption_plan(jax.random.PRNGKey(0), b, n, PAPER)
  kind, source = np.asarray(kind), np.asarray(source)
  np.testing.assert_array_equal((kind > 0).sum(1), np.full(b, n // 2))  # 50% of every image
  shares = np.bincount(kind[kind > 0], minlength=4)[1:] / (b * n // 2)
  # 8192 corrupted patches: one standard deviation of a 10% share is 0.0033.
  np.testing.assert_allclose(shares, [0.8, 0.1, 0.1], atol=0.015)

  tokens = jax.random.normal(jax.random.PRNGKey(1), (b, n, d))
  mask = jnp.arange(d, dtype=jnp.float32) + 100.0
  out = np.asarray(mpp_model.apply_corruption(tokens, kind, source, mask))
  tokens = np.asarray(tokens)
  same = (kind == 0) | (kind == mpp_model.KEPT)
  np.testing.assert_array_equal(out[same], tokens[same])  # bit-identical
  np.testing.assert_array_equal(
    out[kind == mpp_model.MASKED], np.broadcast_to(mask, out[kind == mpp_model.MASKED].shape)
  )
  rows, cols = np.nonzero(kind == mpp_model.RANDOM)
  np.testing.assert_array_equal(out[rows, cols], tokens[(rows + 1) % b, source[rows, cols]])


def test_corruption_rejects_impossible_shares():
  with pytest.raises(ValueError, match="mask \\+ random <= 1"):
    mpp_model.Corruption(rate=0.5, mask=0.8, random=0.3)


def _numpy_color_classes(images: np.ndarray, patch: int, cells: int) -> np.ndarray:
  """Loops over patches and cells: the mean of each channel, 3 bits each, r*64 + g*8 + b."""
  b, h, w, _ = images.shape
  step = patch // cells
  out = np.zeros((b, (h // patch) * (w // patch), cells * cells), np.int64)
  for i in range(b):
    for n, (y, x) in enumerate((y, x) for y in range(0, h, patch) for x in range(0, w, patch)):
      for c, (cy, cx) in enumerate((cy, cx) for cy in range(cells) for cx in range(cells)):
        block = images[i, y + cy * step : y + (cy + 1) * step, x + cx * step : x + (cx + 1) * step]
        mean = (block.reshape(-1, 3).astype(np.float64).mean(0) + 1) / 2
        r, g, bl = (min(int(v * 8), 7) for v in mean)
        out[i, n, c] = r * 64 + g * 8 + bl
  return out


@pytest.mark.parametrize("target, cells", [("mean_color", 1), ("downsampled", 4)])
def test_color_targets_equal_a_numpy_computation(target, cells):
  rng = np.random.default_rng(0)
  # A random colour per 4x4 block plus noise: many classes, means near the bin edges.
  colours = np.kron(rng.uniform(-1, 1, (3, 4, 6, 3)), np.ones((1, 4, 4, 1)))
  images = np.clip(colours + rng.uniform(-0.2, 0.2, colours.shape), -1, 1).astype(np.float32)
  images[0, :8, :8] = 1.0  # a white patch: class 511
  images[0, :8, 8:16] = -1.0  # a black one: class 0
  got = np.asarray(mpp.targets(jnp.asarray(images), (8, 8), target))
  want = _numpy_color_classes(images, 8, cells)
  np.testing.assert_array_equal(got, want)
  assert got[0, 0, 0] == 511 and got[0, 1, 0] == 0
  assert len(np.unique(got)) > 10  # the classes are spread, not collapsed


def test_pixel_target_is_each_patch_row_major():
  images = jnp.arange(2 * 8 * 8 * 3, dtype=jnp.float32).reshape(2, 8, 8, 3)
  got = mpp.targets(images, (4, 4), "pixels")  # [2, 4, 48]
  np.testing.assert_array_equal(got[1, 2], images[1, 4:8, 0:4].reshape(-1))


def _objective(target: str = "mean_color") -> mpp.MaskedPatchPrediction:
  options = ml_collections.ConfigDict(dict(target=target, corrupt_rate=0.5, mask=0.8, random=0.1))
  return mpp.MaskedPatchPrediction(models.get_model_config("testing"), options)


def test_encoder_parameters_have_the_supervised_models_names():
  objective = _objective()
  images = jnp.zeros((1, 8, 8, 3))
  # Names and shapes only: abstract initializations, nothing computed.
  rng = jax.random.PRNGKey(0)
  got = traverse_util.flatten_dict(nn.unbox(jax.eval_shape(objective.init, rng, images)), sep="/")
  supervised = models.create_model(models.get_model_config("testing"), num_classes=10)
  want = traverse_util.flatten_dict(
    nn.unbox(jax.eval_shape(supervised.init, rng, images)["params"]), sep="/"
  )
  encoder = {k for k in want if not k.startswith("head/")}
  assert set(got) - encoder == {"mask_embedding", "mpp_head/kernel", "mpp_head/bias"}
  assert encoder <= set(got) and "cls" in got
  for k in encoder:
    assert got[k].shape == want[k].shape, k


# --- Runs through the training loop ------------------------------------------------------


def _tiny_mpp_config(data_dir: str) -> ml_collections.ConfigDict:
  """configs/mpp.py:digits shrunk to seconds: the `testing` model at 8x8."""
  config = train_fixtures.tiny_config(data_dir, mpp_config.get_config("digits"), eval_every=100)
  config.fewshot.datasets = ()
  config.decode_processes = 0  # threads: no worker processes to start for each split
  return config


def test_loss_falls_on_a_fixed_batch():
  objective = _objective()
  batch = jax.tree.map(jnp.asarray, train_fixtures.fixed_batch())
  params = nn.unbox(objective.init(jax.random.PRNGKey(0), batch["image"]))
  tx = optax.adam(3e-3)
  state = run.TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=tx.init(params),
    rng=jax.random.PRNGKey(0),
  )
  step = jax.jit(functools.partial(run.train_step, loss_fn=objective.loss, tx=tx, accum_steps=1))
  values = []
  for _ in range(40):
    state, metrics = step(state, batch)
    values.append(float(metrics["train/loss"]))
  assert values[0] == pytest.approx(np.log(mpp.NUM_COLORS), rel=1e-3)  # the zero head
  assert values[-1] < 0.5 * values[0], values


def test_mpp_run_resumes_exactly_and_fine_tunes_through_pretrained(
  tmp_path, digits_dir, tiny_config, monkeypatch
):
  config = _tiny_mpp_config(digits_dir)
  straight = run.train_and_evaluate(config, str(tmp_path / "straight"))
  assert 0.0 < straight["eval/loss"] < np.log(mpp.NUM_COLORS)
  # The patch colour accuracy under its own name, in the metrics and in TensorBoard: not
  # a class accuracy.
  assert 0.0 <= straight["eval/patch_accuracy"] <= 1.0 and "eval/accuracy" not in straight
  events = event_accumulator.EventAccumulator(str(tmp_path / "straight" / "tensorboard"))
  events.Reload()
  tags = set(events.Tags()["scalars"])
  assert "eval/patch_accuracy" in tags and "eval/accuracy" not in tags

  train_fixtures.run_preempted(config, str(tmp_path / "resumed"), monkeypatch)
  resumed = run.train_and_evaluate(config, str(tmp_path / "resumed"))
  assert resumed["eval/loss"] == straight["eval/loss"]
  a = orbax_steps.read_params(tmp_path / "straight" / "checkpoints" / "6")
  b = traverse_util.flatten_dict(
    orbax_steps.read_params(tmp_path / "resumed" / "checkpoints" / "6"), sep="/"
  )
  for k, v in traverse_util.flatten_dict(a, sep="/").items():
    np.testing.assert_array_equal(b[k], v, err_msg=k)

  # The supervised quickstart fine-tunes from it: the encoder loaded as it is, a zero head.
  finetune = tiny_config
  finetune.pretrained = str(tmp_path / "straight" / "checkpoints")
  finetune.total_steps = 0
  trainer = train_fixtures.build_steps(finetune)
  params = traverse_util.flatten_dict(jax.device_get(trainer.init_state().params), sep="/")
  for k, v in traverse_util.flatten_dict(a, sep="/").items():
    if k.split("/")[0] in mpp_model.MPP_PARAMS:
      assert k not in params
    else:
      np.testing.assert_array_equal(params[k], v, err_msg=k)
  assert not params["head/kernel"].any() and params["head/kernel"].shape[-1] == 10


@pytest.mark.parametrize("target", mpp.TARGETS)
def test_every_target_gives_a_finite_loss_and_eval_sums(target):
  objective = _objective(target)
  batch = jax.tree.map(jnp.asarray, train_fixtures.fixed_batch(n=4))
  params = nn.unbox(objective.init(jax.random.PRNGKey(0), batch["image"]))
  head = params["mpp_head"]["kernel"].shape[-1]
  assert head == {"mean_color": 512, "downsampled": 16 * 512, "pixels": 4 * 4 * 3}[target]
  assert np.isfinite(float(objective.loss(params, batch, jax.random.PRNGKey(1))))
  sums = objective.eval_step(params, {**batch, "mask": jnp.array([1.0, 1.0, 1.0, 0.0])})
  assert float(sums["count"]) == 3.0 and np.isfinite(float(sums["loss_sum"]))
