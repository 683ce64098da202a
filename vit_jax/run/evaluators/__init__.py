"""What a run evaluates, by name: adding one is a module and a line here.

A builder (`Builder`) takes the run's `steps.RunSteps` and returns an `Evaluator`, or None
when the run's settings turn it off. An evaluator has ``every`` (steps between
evaluations) and is called with the parameters; it returns metrics named
``<name>/...``. The loop calls each every ``every`` steps and all of them after the last
step (the run's final metrics).
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

from vit_jax.aliases import Params
from vit_jax.run.evaluators import accuracy, fewshot, zeroshot
from vit_jax.run.steps import RunSteps


class Evaluator(Protocol):
  """What the loop calls: ``every`` steps, with the parameters, for named metrics."""

  every: int

  def __call__(self, params: Params) -> dict[str, float]: ...


Builder = Callable[[RunSteps], Optional[Evaluator]]

EVALUATORS: dict[str, Builder] = {
  "eval": accuracy.build,  # accuracy and loss over the whole test split
  "fewshot": fewshot.build,  # few-shot linear evaluation (off without config.fewshot.datasets)
  "zeroshot": zeroshot.build,  # zero-shot accuracy and retrieval (contrastive runs)
}


def build_all(steps: RunSteps) -> dict[str, Evaluator]:
  """The evaluators the run's settings turn on, by name."""
  built = {name: build(steps) for name, build in EVALUATORS.items()}
  return {name: e for name, e in built.items() if e is not None}
