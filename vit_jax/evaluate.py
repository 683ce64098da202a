"""Accuracy and loss over a whole split: every example counted once, padding masked out."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax import errors, losses
from vit_jax.aliases import Batch


def eval_step(params: Any, batch: Batch, *, model: nn.Module, loss: str) -> dict[str, jax.Array]:
  """Sums of loss and correct predictions over the real (mask == 1) examples of a batch.

  ``loss`` is the training objective's kind (`losses.LOSSES`): eval and train losses compare.
  """
  logits = model.apply({"params": params}, batch["image"], train=False)  # [B, K]
  mask = batch["mask"]  # [B]
  labels = batch["label"]  # [B, K] one-hot
  per_example = losses.per_example_loss(logits, labels, loss)  # [B]
  correct = jnp.argmax(logits, -1) == jnp.argmax(labels, -1)  # [B]
  return {
    "loss_sum": jnp.sum(per_example * mask),
    "correct": jnp.sum(correct * mask),
    "count": jnp.sum(mask),
  }


def evaluate(
  step_fn: Callable[[Any, Batch], dict[str, jax.Array]],
  params: Any,
  batches: Iterable[Batch],
  prefix: str = "eval",
) -> dict[str, float]:
  """Runs the jitted ``step_fn`` over one pass of ``batches``; accuracy and mean loss."""
  totals = None
  for batch in batches:
    sums = step_fn(params, batch)
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  if totals is None:
    raise errors.ConfigError("The evaluation split is empty: check the test split string.")
  totals = jax.device_get(totals)
  count = float(totals["count"])
  return {
    f"{prefix}/accuracy": float(totals["correct"]) / count,
    f"{prefix}/loss": float(totals["loss_sum"]) / count,
    f"{prefix}/examples": count,
  }
