"""What a run evaluates, by name: adding one is a module and a line here.

A builder takes the run's `steps.RunSteps` and returns an evaluator, or None when the
run's settings turn it off. An evaluator has ``every`` (steps between evaluations) and is
called with the parameters; it returns metrics named ``<name>/...``. The loop calls each
every ``every`` steps and all of them after the last step (the run's final metrics).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

from vit_jax.run.evaluators import fewshot, test_split


class Evaluator(Protocol):
  every: int

  def __call__(self, params: Any) -> dict[str, float]: ...


EVALUATORS: dict[str, Callable[[Any], Optional[Evaluator]]] = {
  "eval": test_split.TestSplit,
  "fewshot": fewshot.build,
}


def build_all(steps: Any) -> dict[str, Evaluator]:
  """The evaluators the run's settings turn on, by name."""
  built = {name: build(steps) for name, build in EVALUATORS.items()}
  return {name: e for name, e in built.items() if e is not None}
