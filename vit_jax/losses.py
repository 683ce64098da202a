"""The objectives ``config.loss`` names, per example: training and evaluation share them.

logits, labels: [B, K], labels one-hot (or multi-hot for ``sigmoid_xent``).
  softmax_xent: cross-entropy of the softmax over the K classes.
  sigmoid_xent: K independent binary cross-entropies, summed over the classes (the
    paper's upstream loss, also usable for multi-label data).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from vit_jax import errors

LOSSES: tuple[str, ...] = ("softmax_xent", "sigmoid_xent")


def check_loss(kind: str) -> None:
  """Fails with the valid names when ``kind`` is not one of `LOSSES`."""
  if kind not in LOSSES:
    raise errors.ConfigError(f"Unknown config.loss={kind!r}; choose one of {LOSSES}.")


def per_example_loss(logits: jax.Array, labels: jax.Array, kind: str) -> jax.Array:
  """The loss of each example: [B, K] logits and labels -> [B]."""
  check_loss(kind)
  if kind == "softmax_xent":
    return optax.softmax_cross_entropy(logits, labels)
  return jnp.sum(optax.sigmoid_binary_cross_entropy(logits, labels), axis=-1)
