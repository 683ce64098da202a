"""What a run evaluates, by name: adding one is a module and a line here.

Each evaluator is registered with its builder (`Builder`: the run's `steps.RunSteps` ->
an `Evaluator`, or None when its settings turn it off) and, where it has options, the
reader of its settings from the config section of its name (``config.fewshot`` for
"fewshot"), as objectives read theirs; `read_settings` runs every reader when the run is
resolved, so a bad option is an error before anything is compiled, and the builder finds
its settings in ``steps.spec.evaluators[name]``. An evaluator has ``every`` (steps between
evaluations) and is called with the parameters; it returns metrics named
``<name>/...``. "evals" builds several: the named instances of ``config.evals``
(`instances`), each under its own name. The loop calls each every ``every`` steps and
all of them after the last step (the run's final metrics).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Protocol, Union

import ml_collections

from vit_jax.infra.aliases import Params
from vit_jax.run.evaluators import accuracy, fewshot, instances, zeroshot
from vit_jax.run.steps import RunSteps


class Evaluator(Protocol):
  """What the loop calls: ``every`` steps, with the parameters, for named metrics."""

  every: int

  def __call__(self, params: Params) -> dict[str, float]: ...


# One evaluator, None (off), or several by name (config.evals' instances).
Builder = Callable[[RunSteps], Union[Optional[Evaluator], Mapping[str, Evaluator]]]


@dataclasses.dataclass(frozen=True)
class Registered:
  build: Builder
  # config.<name> -> the evaluator's checked settings (None: it has no section)
  read: Optional[Callable[[ml_collections.ConfigDict], Any]] = None


EVALUATORS: dict[str, Registered] = {
  # accuracy and loss over the whole test split, every config.eval_every steps
  "eval": Registered(accuracy.build),
  # few-shot linear evaluation (off without config.fewshot.datasets)
  "fewshot": Registered(fewshot.build, fewshot.FewshotSettings.from_config),
  # zero-shot accuracy and retrieval (contrastive runs with captions)
  "zeroshot": Registered(zeroshot.build),
  # named evaluations of other splits and datasets (config.evals; ImageNet ReaL and V2)
  "evals": Registered(instances.build, instances.read),
}


def read_settings(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Each evaluator's settings from the config section of its name, checked."""
  return {name: e.read(config.get(name)) for name, e in EVALUATORS.items() if e.read is not None}


def build_all(steps: RunSteps) -> dict[str, Evaluator]:
  """The evaluators the run's settings turn on, by name."""
  out: dict[str, Evaluator] = {}
  for name, e in EVALUATORS.items():
    built = e.build(steps)
    if isinstance(built, Mapping):
      out.update(built)
    elif built is not None:
      out[name] = built
  return out
