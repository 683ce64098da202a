"""Training on several NaFlex budgets in one run (``config.pp.train_seq_lens``).

Each train step's budget (patches per image) is drawn from the run's seed and the step's
index alone, and its batch is sized to keep the tokens per step about those of
``config.batch`` images at ``config.pp.seq_len`` patches (timm's NaFlex loader sizes its
batches so). Each budget reads its examples from lanes of its own, keyed by (seed, budget)
(`pipeline.local_train_batches` at that budget's batch): a run resumed at step s starts
each budget's lanes at the count of the s earlier steps given to it, so a resumed run gets
the batches of an uninterrupted one, and neither depends on the process count. The step
is compiled once per budget (`run.steps.BudgetSteps`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from vit_jax.infra import errors

SCHEDULE_BLOCK = 1024  # steps whose budgets one generator draws (`budget_indices`)
# Each budget's batch is a multiple of gcd(config.batch, BATCH_DIVISOR) (timm's loader's
# batch divisor): a function of the config alone, so resuming on another device or process
# count keeps every batch.
BATCH_DIVISOR = 8
_SCHEDULE_SALT = 0x6E61_666C  # keeps the schedule's draws apart from the lanes' seeds


@dataclasses.dataclass(frozen=True)
class BudgetMix:
  """The budgets of a run's train steps and each one's global batch."""

  budgets: tuple[int, ...]  # patches per image, as config.pp.train_seq_lens orders them
  tokens: int  # per step: config.batch x config.pp.seq_len
  multiple: int  # every batch a multiple of this

  @classmethod
  def make(cls, budgets: Sequence[int], batch: int, seq_len: int) -> "BudgetMix":
    """The mix of ``budgets`` at ``batch`` images of ``seq_len`` patches per step; a bad
    value is one error naming config.pp.train_seq_lens."""
    budgets = tuple(budgets)
    if (
      not budgets
      or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in budgets)
      or len(set(budgets)) != len(budgets)
    ):
      raise errors.ConfigError(
        f"config.pp.train_seq_lens={budgets!r} must be distinct whole numbers of patches "
        ">= 1 (e.g. (128, 256, 576)), or None to train at config.pp.seq_len alone."
      )
    mix = cls(budgets, batch * seq_len, math.gcd(batch, BATCH_DIVISOR))
    for budget in budgets:
      if mix.batch(budget) < 1:
        raise errors.ConfigError(
          f"config.pp.train_seq_lens: {budget} patches leave no image a step within "
          f"config.batch={batch} x config.pp.seq_len={seq_len} tokens; drop {budget} or "
          "raise config.batch."
        )
    return mix

  def batch(self, budget: int) -> int:
    """The global batch at ``budget``: the most images within the step's tokens, rounded
    down to a multiple of `multiple`."""
    return self.tokens // budget // self.multiple * self.multiple

  def budget_indices(self, seed: int, start: int, count: int) -> np.ndarray:
    """int [count]: the index into `budgets` of the batches ``start``, ``start + 1``, ...
    (batch i trains step i + 1), uniform, a function of (seed, i) alone."""
    first, last = start // SCHEDULE_BLOCK, (start + count - 1) // SCHEDULE_BLOCK
    drawn = np.concatenate(
      [
        np.random.default_rng([seed, _SCHEDULE_SALT, block]).integers(
          len(self.budgets), size=SCHEDULE_BLOCK
        )
        for block in range(first, last + 1)
      ]
    )
    offset = start - first * SCHEDULE_BLOCK
    return drawn[offset : offset + count]

  def batches_before(self, seed: int, start: int) -> dict[int, int]:
    """Each budget's count of the batches before batch ``start``: where its lanes resume."""
    counts = dict.fromkeys(self.budgets, 0)
    for block_start in range(0, start, SCHEDULE_BLOCK):
      count = min(SCHEDULE_BLOCK, start - block_start)
      drawn = np.bincount(self.budget_indices(seed, block_start, count), minlength=len(counts))
      for budget, n in zip(self.budgets, drawn):
        counts[budget] += int(n)
    return counts

  def lane_seed(self, seed: int, budget: int) -> int:
    """The seed of ``budget``'s lanes (their order and crops), from (seed, budget)."""
    return int(np.random.SeedSequence([seed, budget]).generate_state(1)[0] >> 1)
