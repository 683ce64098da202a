"""The few-shot linear classifier: class-balanced samples and closed-form ridge regression.

Pure numpy (float64), independent of the model: features in, accuracy out. The paper
(Sec. 4.1) fits a regularised least-squares map from frozen features to {-1, 1}^K
targets; this module solves it exactly, through whichever Gram matrix is smaller.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vit_jax.infra import errors

DEFAULT_L2_REG = 2.0**10  # The ridge term lambda.
# The bias feature's value: large, so that the ridge term barely shrinks the bias.
BIAS_FEATURE = 100.0
_STD_EPS = 1e-5  # Keeps constant feature dimensions finite after standardisation.


def sample_per_class(labels: np.ndarray, shots: int, seed: int) -> np.ndarray:
  """Indices of exactly ``shots`` examples of every class present in ``labels``, sorted.

  The same (labels, shots, seed) always give the same indices. labels: int [N].
  """
  labels = np.asarray(labels)
  if shots < 1:
    raise errors.ConfigError(f"shots={shots} must be >= 1.")
  rng = np.random.default_rng(seed)
  chosen = []
  for c in np.unique(labels):
    members = np.flatnonzero(labels == c)
    if len(members) < shots:
      raise errors.ConfigError(
        f"Class {int(c)} has {len(members)} examples in the few-shot train "
        f"split, fewer than shots={shots}: use fewer shots or a larger split."
      )
    chosen.append(rng.choice(members, size=shots, replace=False))
  return np.sort(np.concatenate(chosen))


@dataclasses.dataclass(frozen=True)
class RidgeClassifier:
  """A fitted classifier: standardisation statistics and weights [D + 1, K]."""

  mean: np.ndarray  # [D]
  std: np.ndarray  # [D]
  weights: np.ndarray  # [D + 1, K]; the last row multiplies the bias feature

  def scores(self, features: np.ndarray) -> np.ndarray:
    """[N, D] features -> [N, K] scores; the predicted class is the argmax."""
    return design_matrix(features, self.mean, self.std) @ self.weights


def design_matrix(features: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
  """Standardised features with the bias feature appended: [N, D] -> [N, D + 1]."""
  x = (np.asarray(features, np.float64) - mean) / std
  return np.concatenate([x, np.full((len(x), 1), BIAS_FEATURE)], axis=1)


def targets(labels: np.ndarray, num_classes: int) -> np.ndarray:
  """Labels [N] -> {-1, 1} targets [N, K]: +1 for the example's class, -1 elsewhere."""
  return 2.0 * np.eye(num_classes)[np.asarray(labels)] - 1.0


def solve_ridge(x: np.ndarray, y: np.ndarray, l2_reg: float) -> np.ndarray:
  """argmin_W |xW - y|^2 + l2_reg |W|^2 for x [N, D], y [N, K]; returns W [D, K].

  With N >= D: W = (x^T x + l2 I)^-1 x^T y, a D x D system. With N < D (few shots of
  wide features) the identity W = x^T (x x^T + l2 I)^-1 y needs only an N x N one.
  """
  n, d = x.shape
  if n >= d:
    return np.linalg.solve(x.T @ x + l2_reg * np.eye(d), x.T @ y)
  return x.T @ np.linalg.solve(x @ x.T + l2_reg * np.eye(n), y)


def fit(
  features: np.ndarray, labels: np.ndarray, num_classes: int, l2_reg: float = DEFAULT_L2_REG
) -> RidgeClassifier:
  """Fits the classifier on few-shot features [N, D] with int labels [N]."""
  features = np.asarray(features, np.float64)
  mean = features.mean(axis=0)
  std = features.std(axis=0) + _STD_EPS
  x = design_matrix(features, mean, std)
  return RidgeClassifier(mean, std, solve_ridge(x, targets(labels, num_classes), l2_reg))


def accuracy(classifier: RidgeClassifier, features: np.ndarray, labels: np.ndarray) -> float:
  """Fraction of examples whose highest score is their label."""
  predicted = np.argmax(classifier.scores(features), axis=1)
  return float(np.mean(predicted == np.asarray(labels)))
