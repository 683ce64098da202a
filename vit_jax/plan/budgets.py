"""The plan of a run of several NaFlex budgets (``config.pp.train_seq_lens``): each
budget's train step compiled at its own batch, with its memory and step time, and the
mix's: the largest memory any budget needs and the mean step time (the steps draw their
budgets uniformly, `data.budget_mix`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from vit_jax.plan import gpu_estimate, report
from vit_jax.plan.report import gib


@dataclasses.dataclass(frozen=True)
class BudgetRow:
  """One budget's compiled train step."""

  budget: int  # patches per image
  batch: int
  needed_bytes: int  # per device (what XLA refused, where it did)
  fits: bool
  bound_s: Optional[float]  # the step-time lower bound (`report.step_time`)
  estimate_s: Optional[float]  # GPUs: the step priced at what a GPU measured


def plan_budgets(
  steps: Any,
  chip: Any,
  num_devices: int,
  budget_bytes: float,
  compile_step: Callable[[str, Callable[[], Any]], tuple[report.Measure, Any]],
  planned: tuple[report.Measure, Any],
) -> tuple[BudgetRow, ...]:
  """A row per budget of ``steps``' run (() for a run of one budget); ``compile_step``
  (what, lower) compiles and measures one step as the plan does its others; ``planned``:
  the plan's own train step (config.pp.seq_len at config.batch), measured and compiled,
  which a budget of that length and batch reuses."""
  mix = steps.spec.data.budget_mix()
  if mix is None:
    return ()
  rows = []
  for budget in mix.budgets:
    at = steps.at_budget(budget)
    batch = at.abstract_train_batch()
    same = (budget, at.spec.batch) == (steps.spec.data.naflex.seq_len, steps.spec.batch)
    measured, compiled = (
      planned
      if same
      else compile_step(
        f"train step at {budget} patches (batch {at.spec.batch})",
        lambda at=at, batch=batch: at.train_step.lower(at.abstract_state, batch),
      )
    )
    per_image = at.train_flops_per_example()
    _, _, timing = report.train_step_time(
      measured,
      compiled,
      chip,
      num_devices=num_devices,
      model_flops=per_image and per_image * at.spec.batch,
      dtype=str(at.spec.model.dtype),
    )
    estimate = gpu_estimate.of_compiled(compiled, chip, timing)
    needed = measured.memory.total if measured.memory else measured.needed_bytes
    rows.append(
      BudgetRow(
        budget=budget,
        batch=at.spec.batch,
        needed_bytes=needed,
        fits=measured.memory is not None and needed <= budget_bytes,
        bound_s=timing.bound_s if timing else None,
        estimate_s=estimate.step_s if estimate else None,
      )
    )
  return tuple(rows)


def lines(rows: tuple[BudgetRow, ...]) -> list[str]:
  """The budgets' rows and the mix's line, as the plan prints them."""
  if not rows:
    return []
  out = ["train steps by NaFlex budget (config.pp.train_seq_lens), per device:"]
  for r in rows:
    bound = f"step >= {r.bound_s * 1e3:.1f} ms" if r.bound_s else "step time unknown"
    estimate = f", ~{r.estimate_s * 1e3:.1f} ms estimated" if r.estimate_s else ""
    fits = "" if r.fits else ", does not fit"
    out.append(
      f"  {r.budget:5d} patches, batch {r.batch:5d}: {gib(r.needed_bytes)}, {bound}{estimate}{fits}"
    )
  bounds = [r.bound_s for r in rows]
  mean = sum(bounds) / len(bounds) if all(bounds) else None
  estimates = [r.estimate_s for r in rows]
  mean_estimate = sum(estimates) / len(estimates) if all(estimates) else None
  out.append(
    f"  the mix: {gib(max(r.needed_bytes for r in rows))} at most"
    + (f", mean step >= {mean * 1e3:.1f} ms" if mean else "")
    + (f", ~{mean_estimate * 1e3:.1f} ms estimated" if mean_estimate else "")
  )
  return out
