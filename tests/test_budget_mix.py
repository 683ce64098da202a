"""Several NaFlex budgets in one run (`vit_jax.data.budget_mix`): each step's budget a
function of (seed, step), its batch sized to the step's tokens, each budget's lanes
resumed where the earlier steps left them."""

import re

import numpy as np
import pytest

from vit_jax.data import budget_mix
from vit_jax.infra import errors

MIX = budget_mix.BudgetMix.make((128, 256, 576), batch=256, seq_len=256)


def test_each_budgets_batch_keeps_the_tokens_per_step():
  assert MIX.tokens == 256 * 256
  assert [MIX.batch(b) for b in MIX.budgets] == [512, 256, 112]  # 113 down to a multiple of 8
  assert all(MIX.batch(b) * b <= MIX.tokens for b in MIX.budgets)


def test_the_schedule_is_a_function_of_seed_and_step_across_blocks():
  block = budget_mix.SCHEDULE_BLOCK
  whole = MIX.budget_indices(seed=3, start=0, count=3 * block)
  assert np.array_equal(MIX.budget_indices(3, block - 5, 10), whole[block - 5 : block + 5])
  assert not np.array_equal(MIX.budget_indices(4, 0, 3 * block), whole)  # the seed matters
  assert all(abs(f - 1 / 3) < 0.03 for f in np.bincount(whole) / len(whole))  # uniform
  for start in (0, 7, block, 2 * block + 11):
    counts = MIX.batches_before(3, start)
    assert list(counts.values()) == list(np.bincount(whole[:start], minlength=3))


def test_bad_budgets_are_one_error_naming_the_option():
  with pytest.raises(errors.ConfigError, match="must be distinct whole numbers"):
    budget_mix.BudgetMix.make((256, 256), batch=8, seq_len=256)
  with pytest.raises(errors.ConfigError, match="576 patches leave no image"):
    budget_mix.BudgetMix.make((64, 576), batch=1, seq_len=256)


def test_a_run_of_three_budgets_trains_each_and_resumes_exactly(tmp_path, tiny_config, monkeypatch):
  """config.pp.train_seq_lens=(4, 9, 16) at config.pp.seq_len=9: each step's batch holds
  the images of its drawn budget (batch 32, 16 or 8 for 144 tokens), the run compiles a
  step per budget, and a run SIGKILLed after step 4 resumes to the uninterrupted run's
  parameters bit for bit (each budget's lanes resumed at its count of earlier steps)."""
  from tests import train_fixtures  # pylint: disable=g-import-not-at-top
  from tests.test_main import assert_resume_is_exact  # pylint: disable=g-import-not-at-top
  from vit_jax import data, run  # pylint: disable=g-import-not-at-top

  tiny_config.pp.seq_len = 9
  tiny_config.pp.train_seq_lens = (4, 9, 16)
  tiny_config.decode_processes = 0  # threads: no worker processes to start for each split
  settings = data.Settings.from_config(tiny_config)
  mix = settings.budget_mix()
  drawn = [mix.budgets[i] for i in mix.budget_indices(settings.seed, 0, 6)]
  assert len(set(drawn)) >= 2  # the six steps mix budgets

  shapes = []
  real_iterator = data.train_iterator

  def recording(*args, **kwargs):
    batches = real_iterator(*args, **kwargs)
    try:
      for batch in batches:
        shapes.append(batch["image"].shape[:2])
        yield batch
    finally:
      batches.close()

  monkeypatch.setattr(data, "train_iterator", recording)
  straight_dir = str(tmp_path / "straight")
  straight = run.train_and_evaluate(tiny_config, straight_dir)
  monkeypatch.setattr(data, "train_iterator", real_iterator)
  assert shapes[:6] == [(mix.batch(b), b) for b in drawn]
  stop = train_fixtures.run_sigkilled
  assert_resume_is_exact(tiny_config, tmp_path, monkeypatch, (straight_dir, straight), stop)


@pytest.mark.slow  # TPU compiles of minutes
def test_the_plan_compiles_each_budgets_step_and_reports_the_mix():
  """`vit_jax.plan` of a run of two budgets on a v5e:2x2: a step per budget at its batch
  (the budget of config.pp.seq_len and config.batch: the plan's own train step)."""
  from tests.test_plan import tiny_config  # pylint: disable=g-import-not-at-top
  from vit_jax.plan import planner, topology  # pylint: disable=g-import-not-at-top

  config = tiny_config(pp__seq_len=64)  # 32 x 32 crops of 4 x 4 patches: 64 patches
  config.model.posemb_grid = (8, 8)
  config.pp.train_seq_lens = (16, 64)
  plan = planner.make_plan(config, topology.parse("v5e:2x2"))
  rows = {row.budget: row for row in plan.budget_rows}
  assert {b: r.batch for b, r in rows.items()} == {16: 256, 64: 64}
  assert rows[64].needed_bytes == plan.train.memory.total
  assert all(r.fits and r.bound_s > 0 for r in rows.values())
  assert rows[16].needed_bytes != rows[64].needed_bytes  # two programs
  printed = planner.format_plan(plan)
  assert "train steps by NaFlex budget" in printed and "the mix:" in printed


def test_the_speed_table_times_each_budget_and_the_mix(capsys):
  """`benchmarks/naflex_budgets.py --smoke`: a row per budget at the run's batch for it
  (`BudgetMix`), the tokens per second of one budget and of the mix, their ratio."""
  from benchmarks import naflex_budgets  # pylint: disable=g-import-not-at-top

  assert naflex_budgets.main(["--smoke"]) == 0
  out = capsys.readouterr().out
  rows = [line.split(" | ") for line in out.splitlines() if line[:3] in ("| 4", "| 8", "| 1")]
  assert [(row[0], row[1], row[2]) for row in rows] == [
    ("| 4", "32", "128"),
    ("| 8", "16", "128"),
    ("| 16", "8", "128"),
  ]
  one = float(re.search(r"one budget: ([\d,]+) tokens/s", out).group(1).replace(",", ""))
  mixed = float(re.search(r"mixed budgets: ([\d,]+) tokens/s", out).group(1).replace(",", ""))
  ratio = float(re.search(r"mixed / one: ([\d.]+)x", out).group(1))
  assert one > 0 and mixed > 0 and ratio == pytest.approx(mixed / one, abs=0.01)
  with pytest.raises(SystemExit):
    naflex_budgets.main(["--budgets=64,128", "--fixed=5"])
  assert "--fixed=5 is not one of --budgets=(64, 128)" in capsys.readouterr().err
