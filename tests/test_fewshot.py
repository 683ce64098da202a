"""Few-shot linear evaluation: the closed-form solver, sampling, and a real model's features."""

from __future__ import annotations

import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn import linear_model

from vit_jax import data
from vit_jax.data import data_config
from vit_jax.infra import sharding
from vit_jax.run.evaluators import fewshot, ridge
from vit_jax.weights import npz, orbax_steps


@pytest.mark.parametrize(
  "n, d", [(12, 40), (60, 8)], ids=["examples<features", "examples>features"]
)
def test_closed_form_equals_independent_solvers(n, d):
  rng = np.random.default_rng(0)
  features = rng.normal(size=(n, d)) * rng.uniform(0.1, 5, d) + rng.normal(size=d)
  labels = rng.integers(0, 4, n)
  l2 = 3.0
  classifier = ridge.fit(features, labels, 4, l2_reg=l2)

  x = ridge.design_matrix(features, classifier.mean, classifier.std)
  y = ridge.targets(labels, 4)
  # Ridge as ordinary least squares on the system augmented with sqrt(l2) * I.
  augmented_x = np.concatenate([x, np.sqrt(l2) * np.eye(d + 1)])
  augmented_y = np.concatenate([y, np.zeros((d + 1, 4))])
  lstsq = np.linalg.lstsq(augmented_x, augmented_y, rcond=None)[0]
  sk = linear_model.Ridge(alpha=l2, fit_intercept=False, solver="svd").fit(x, y).coef_.T
  np.testing.assert_allclose(classifier.weights, lstsq, atol=1e-4)
  np.testing.assert_allclose(classifier.weights, sk, atol=1e-4)
  # The statistics are the few-shot train set's own.
  np.testing.assert_allclose(x[:, :d].mean(0), 0, atol=1e-9)
  np.testing.assert_allclose(x[:, :d].std(0), 1, atol=1e-3)


def test_separable_features_are_classified_perfectly():
  rng = np.random.default_rng(1)
  centers = 10 * rng.normal(size=(5, 32))
  labels = np.repeat(np.arange(5), 40)
  features = centers[labels] + rng.normal(size=(200, 32))
  train = ridge.sample_per_class(labels, 5, seed=0)
  test = np.setdiff1d(np.arange(200), train)
  classifier = ridge.fit(features[train], labels[train], 5)
  assert ridge.accuracy(classifier, features[test], labels[test]) == 1.0


def test_sampling_is_class_balanced_and_deterministic_per_seed():
  rng = np.random.default_rng(2)
  labels = rng.integers(0, 7, 500)
  a = ridge.sample_per_class(labels, 10, seed=3)
  np.testing.assert_array_equal(a, ridge.sample_per_class(labels, 10, seed=3))
  assert not np.array_equal(a, ridge.sample_per_class(labels, 10, seed=4))
  np.testing.assert_array_equal(np.bincount(labels[a], minlength=7), np.full(7, 10))
  assert len(np.unique(a)) == 70


def test_too_few_examples_of_a_class_is_an_error():
  with pytest.raises(ValueError, match="Class 1 has 2 examples.*shots=3"):
    ridge.sample_per_class(np.array([0, 0, 0, 1, 1]), 3, seed=0)


# --- A trained model's features -----------------------------------------------------------


# `trained_run` (tests/conftest.py): the `testing` model trained briefly on digits, with
# 10-shot evaluation at its last step.


def test_trained_features_beat_random_features(trained_run):
  config, _, metrics = trained_run
  mesh = sharding.make_mesh(((sharding.DATA_AXIS, -1),))
  evaluator = fewshot.FewShotEvaluator(
    config.model, data.Settings.from_config(config), mesh, ["digits"], shots=[10]
  )
  init = jax.jit(evaluator.model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 3)))["params"]
  (random_init,) = evaluator(nn.unbox(init))
  assert random_init.examples == 1797  # every example of both splits once
  assert len(random_init.accuracies) == fewshot.DEFAULT_SEEDS
  trained = metrics["fewshot/digits_10shot"]
  assert trained > 0.7 and trained > random_init.mean + 0.15, (trained, random_init)
  assert "fewshot/digits_10shot_spread" in metrics


def test_command_on_a_runs_checkpoints(trained_run, digits_dir):
  config, workdir, metrics = trained_run
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "vit_jax.fewshot",
      f"--checkpoint=file://{workdir}/checkpoints",  # a run folder as a URL
      "--dataset=digits",
      "--shots=1,10",
      f"--batch={config.batch_eval}",
      f"--data_dir={digits_dir}",
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = {
    int(line.split()[1]): line.split()
    for line in proc.stdout.splitlines()
    if line.startswith("digits ")
  }
  assert sorted(rows) == [1, 10]
  # The same parameters, features and seeds as the run's own evaluation at its last step.
  assert float(rows[10][2]) == pytest.approx(metrics["fewshot/digits_10shot"], abs=1e-4)
  assert "features of 1797 images" in proc.stdout


def test_command_reads_naflex_inputs_at_a_budget(trained_run, digits_dir, capsys):
  """``--seq_len=4``: each 8x8 digit as its own 2x2 grid, the table's own grid, so the
  features and accuracies are the square run's; ``--seq_len=9`` resizes each digit to a
  3x3 grid, which the 2x2-trained model reads less well but far above chance."""
  from vit_jax import fewshot  # pylint: disable=g-import-not-at-top

  config, workdir, metrics = trained_run
  common = [
    "fewshot", f"--checkpoint={workdir}/checkpoints", "--dataset=digits", "--shots=10",
    f"--batch={config.batch_eval}", f"--data_dir={digits_dir}",
  ]  # fmt: skip
  accuracy = {}
  for seq_len in (4, 9):
    assert fewshot.main([*common, f"--seq_len={seq_len}"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("digits"))
    accuracy[seq_len] = float(row.split()[2])
  assert accuracy[4] == pytest.approx(metrics["fewshot/digits_10shot"], abs=1e-4)
  assert accuracy[9] != pytest.approx(accuracy[4], abs=1e-4) and accuracy[9] > 0.2  # chance: 0.1
  assert fewshot.main([*common, "--seq_len=0"]) == 2
  assert "--seq_len=0 must be at least 1" in capsys.readouterr().err


def test_command_on_an_npz_infers_the_model(trained_run, digits_dir, tmp_path, capsys):
  """In-process (`test_command_on_a_runs_checkpoints` runs the command as a user does)."""
  from vit_jax import fewshot  # pylint: disable=g-import-not-at-top

  _, workdir, _ = trained_run
  params = orbax_steps.read_params(f"{workdir}/checkpoints")
  npz.save_npz(tmp_path / "model.npz", params)
  argv = [
    "fewshot",
    f"--checkpoint={tmp_path}/model.npz",
    "--dataset=digits",
    "--shots=5",
    "--seeds=1",
    f"--data_dir={digits_dir}",
  ]
  assert fewshot.main(argv) == 0
  out = capsys.readouterr().out
  assert any(line.split()[:2] == ["digits", "5"] for line in out.splitlines())


def test_settings_for_evaluation_prepare_every_split_as_the_checkpoint_says():
  """A checkpoint's data config (timm's crop and bicubic resize here) is what both splits
  are prepared with, at the crop asked; nothing is augmented, shuffled or skipped."""
  timm_like = data_config.DataConfig(
    (32, 32),
    crop_pct=0.875,
    crop_mode="center",
    interpolation="bicubic",
    resizer="pil",
    mean=(0.4, 0.5, 0.6),
    std=(0.2, 0.3, 0.4),
  )
  settings = data.Settings.for_evaluation(timm_like, crop=24, batch=8)
  assert settings.eval_data_config() == timm_like.at_size((24, 24))
  assert (settings.input_mean, settings.input_std) == (timm_like.mean, timm_like.std)
  assert (settings.crop, settings.batch, settings.batch_eval) == (24, 8, 8)
  assert (settings.flip, settings.randaug, settings.min_area, settings.shuffle_buffer) == (
    False,
    None,
    1.0,
    1,
  )
  assert not settings.skip_corrupt_images
