"""The run's own evaluation: accuracy and loss over the whole test split, every example
counted once, padding masked out (logged as ``eval/...``). The accuracy is named for what
the objective counts (its ``accuracy_metric``): ``eval/accuracy`` for a classifier,
``eval/in_batch_top1`` for a contrastive run, ``eval/patch_accuracy`` for masked patch
prediction, so that no figure reads as a class accuracy that is not one."""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

import jax
import jax.numpy as jnp

from vit_jax import data
from vit_jax.infra import errors
from vit_jax.infra.aliases import Batch, Params
from vit_jax.run.steps import RunSteps


def evaluate(
  step_fn: Callable[[Params, Batch], dict[str, jax.Array]],
  params: Params,
  batches: Iterable[Batch],
  prefix: str = "eval",
  accuracy_metric: str = "accuracy",
) -> dict[str, float]:
  """Runs the jitted ``step_fn`` (an objective's ``eval_step`` sums) over one pass of
  ``batches``; the share 'correct' (as ``<prefix>/<accuracy_metric>``) and mean loss."""
  totals = None
  for batch in batches:
    sums = step_fn(params, batch)
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  if totals is None:
    raise errors.ConfigError("The evaluation split is empty: check the test split string.")
  totals = jax.device_get(totals)
  count = float(totals["count"])
  return {
    f"{prefix}/{accuracy_metric}": float(totals["correct"]) / count,
    f"{prefix}/loss": float(totals["loss_sum"]) / count,
    f"{prefix}/examples": count,
  }


@dataclasses.dataclass
class Accuracy:
  """`evaluate` over the run's test split (``spec.data.test_split``), or an evaluation
  instance's (`instances`), every ``every`` steps."""

  every: int
  eval_step: Callable[[Params, Batch], dict[str, jax.Array]]  # the objective's sums
  batches: Iterable[Batch]  # `data.eval_iterator`'s: a full pass each time it is iterated
  accuracy_metric: str = "accuracy"  # the objective's name for 'correct' / 'count'
  prefix: str = "eval"  # the metrics' names: <prefix>/accuracy (an evaluation instance's name)

  def __call__(self, params: Params) -> dict[str, float]:
    return evaluate(
      self.eval_step, params, self.batches, self.prefix, accuracy_metric=self.accuracy_metric
    )


def build(steps: RunSteps) -> Accuracy:
  """The run's test-split evaluation, every ``config.eval_every`` steps."""
  return Accuracy(
    every=steps.spec.loop.eval_every,
    eval_step=steps.eval_step,
    batches=data.eval_iterator(steps.spec.data, steps.mesh),
    accuracy_metric=steps.objective.accuracy_metric,
  )
