"""The run's own evaluation: accuracy and loss over the whole test split, every example
counted once, padding masked out (logged as ``eval/...``)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp

from vit_jax import data, errors
from vit_jax.aliases import Batch


def evaluate(
  step_fn: Callable[[Any, Batch], dict[str, jax.Array]],
  params: Any,
  batches: Iterable[Batch],
  prefix: str = "eval",
) -> dict[str, float]:
  """Runs the jitted ``step_fn`` (an objective's ``eval_step`` sums) over one pass of
  ``batches``; accuracy and mean loss."""
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


class TestSplit:
  """`evaluate` over ``spec.data.test_split`` every ``spec.loop.eval_every`` steps."""

  def __init__(self, steps: Any):
    self.every = steps.spec.loop.eval_every
    self._eval_step = steps.eval_step
    self._batches = data.eval_iterator(steps.spec.data, steps.mesh)  # a full pass each time

  def __call__(self, params: Any) -> dict[str, float]:
    return evaluate(self._eval_step, params, self._batches)
