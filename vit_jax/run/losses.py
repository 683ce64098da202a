"""The classification losses ``config.loss`` names, per example: training and evaluation share them.

logits, labels: [B, K], labels one-hot (or multi-hot for ``sigmoid_xent``).
  softmax_xent: cross-entropy of the softmax over the K classes.
  sigmoid_xent: K independent binary cross-entropies, summed over the classes (the
    paper's upstream loss, also usable for multi-label data).
Training may smooth the labels first (`smooth_labels`, ``config.label_smoothing``);
evaluation scores the labels as they are.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from vit_jax.infra import errors


def _sigmoid_xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
  return jnp.sum(optax.sigmoid_binary_cross_entropy(logits, labels), axis=-1)


# name -> per-example loss: ([B, K] logits, [B, K] labels) -> [B]
LOSSES: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
  "softmax_xent": optax.softmax_cross_entropy,
  "sigmoid_xent": _sigmoid_xent,
}


def check_loss(kind: str) -> None:
  """Fails with the valid names when ``kind`` is not one of `LOSSES`."""
  if kind not in LOSSES:
    raise errors.ConfigError(f"Unknown config.loss={kind!r}; choose one of {tuple(LOSSES)}.")


def check_label_smoothing(alpha: float) -> None:
  """Fails unless ``alpha`` (``config.label_smoothing``) is in [0, 1)."""
  if not 0.0 <= alpha < 1.0:
    raise errors.ConfigError(
      f"config.label_smoothing={alpha} must be in [0, 1): the share of each label spread "
      "evenly over the K classes (0: off; 0.1 is common)."
    )


def smooth_labels(labels: jax.Array, alpha: float) -> jax.Array:
  """[B, K] labels as (1 - alpha) * labels + alpha / K (Szegedy et al., 2016;
  `optax.smooth_labels`); unchanged when ``alpha`` is 0."""
  return optax.smooth_labels(labels, alpha) if alpha else labels


def per_example_loss(logits: jax.Array, labels: jax.Array, kind: str) -> jax.Array:
  """The loss of each example: [B, K] logits and labels -> [B]."""
  check_loss(kind)
  return LOSSES[kind](logits, labels)
