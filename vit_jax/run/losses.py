"""The classification losses ``config.loss`` names, per example: training and evaluation share them.

logits, labels: [B, K], labels one-hot (or multi-hot for ``sigmoid_xent``).
  softmax_xent: cross-entropy of the softmax over the K classes.
  sigmoid_xent: K independent binary cross-entropies, summed over the classes (the
    paper's upstream loss, also usable for multi-label data).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from vit_jax import errors


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


def per_example_loss(logits: jax.Array, labels: jax.Array, kind: str) -> jax.Array:
  """The loss of each example: [B, K] logits and labels -> [B]."""
  check_loss(kind)
  return LOSSES[kind](logits, labels)
