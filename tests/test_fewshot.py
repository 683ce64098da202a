"""Few-shot linear evaluation: the closed-form solver, sampling, and a real model's features."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn import linear_model

from vit_jax.fewshot import linear


@pytest.mark.parametrize("n, d", [(12, 40), (60, 8)], ids=["examples<features",
                                                             "examples>features"])
def test_closed_form_equals_independent_solvers(n, d):
  rng = np.random.default_rng(0)
  features = rng.normal(size=(n, d)) * rng.uniform(0.1, 5, d) + rng.normal(size=d)
  labels = rng.integers(0, 4, n)
  l2 = 3.0
  classifier = linear.fit(features, labels, 4, l2_reg=l2)

  x = linear.design_matrix(features, classifier.mean, classifier.std)
  y = linear.targets(labels, 4)
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
  train = linear.sample_per_class(labels, 5, seed=0)
  test = np.setdiff1d(np.arange(200), train)
  classifier = linear.fit(features[train], labels[train], 5)
  assert linear.accuracy(classifier, features[test], labels[test]) == 1.0


def test_sampling_is_class_balanced_and_deterministic_per_seed():
  rng = np.random.default_rng(2)
  labels = rng.integers(0, 7, 500)
  a = linear.sample_per_class(labels, 10, seed=3)
  np.testing.assert_array_equal(a, linear.sample_per_class(labels, 10, seed=3))
  assert not np.array_equal(a, linear.sample_per_class(labels, 10, seed=4))
  np.testing.assert_array_equal(np.bincount(labels[a], minlength=7), np.full(7, 10))
  assert len(np.unique(a)) == 70


def test_too_few_examples_of_a_class_is_an_error():
  with pytest.raises(ValueError, match="Class 1 has 2 examples.*shots=3"):
    linear.sample_per_class(np.array([0, 0, 0, 1, 1]), 3, seed=0)
