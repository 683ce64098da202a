"""Few-shot linear evaluation of the frozen features during training (``config.fewshot``),
logged as ``fewshot/<dataset>_<shots>shot``; the method is `vit_jax.fewshot`'s."""

from __future__ import annotations

from typing import Any, Optional

from vit_jax.fewshot import evaluator as fewshot_lib


class FewShot:
  """`fewshot_lib.FewShotEvaluator` on the run's model every ``spec.fewshot.every`` steps."""

  def __init__(self, steps: Any):
    fs = steps.spec.fewshot
    self.every = fs.every
    self._evaluator = fewshot_lib.FewShotEvaluator(
      steps.spec.model,
      steps.spec.data,
      steps.mesh,
      fs.datasets,
      shots=fs.shots,
      seeds=fs.seeds,
      l2_reg=fs.l2_reg,
    )

  def __call__(self, params: Any) -> dict[str, float]:
    return fewshot_lib.as_metrics(self._evaluator(params))


def build(steps: Any) -> Optional[FewShot]:
  """None while ``config.fewshot.datasets`` is empty."""
  return FewShot(steps) if steps.spec.fewshot.datasets else None
