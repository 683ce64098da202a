"""The main job end to end: a tiny config trains, saves, resumes exactly, fails clearly."""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from flax import traverse_util

from tests import train_fixtures
from vit_jax import data, run
from vit_jax.weights import orbax_steps

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def failure_report(stderr: str) -> str:
  """The useful part of a failed run's stderr: a crash's header and stacks, else the end."""
  crash = stderr.find("Fatal Python error")
  return stderr[crash : crash + 6000] if crash >= 0 else stderr[-3000:]


def run_main(workdir, *overrides, timeout=300):
  cmd = [
    sys.executable,
    "-m",
    "vit_jax.main",
    "--config=configs/quickstart.py",
    f"--workdir={workdir}",
    *overrides,
  ]
  return subprocess.run(
    cmd,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=timeout,
    # The command's own log settings: without the TF_* variables the test session sets.
    env={**{k: v for k, v in os.environ.items() if not k.startswith("TF_")}, "PYTHONPATH": REPO},
  )


# absl's prefix of a log line (level, date, time, thread, file:line), which the lines a
# user reads at the default verbosity do not carry.
ABSL_PREFIX = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")
# How each line a run prints at the default verbosity starts.
RUN_LINES = (
  "Execution on CPU: attention einsum",
  "Building digits",
  "Training ",
  "Compiled the train step",
  "MFU against ",
  "step ",
  "Final",
)


def test_main_trains_a_few_steps_and_writes_checkpoint_and_events(tmp_path, digits_dir):
  workdir = tmp_path / "run"
  proc = run_main(
    workdir,
    f"--config.data_dir={digits_dir}",
    "--config.total_steps=4",
    "--config.model.hidden_size=32",
    "--config.model.transformer.num_layers=1",
    "--config.model.transformer.mlp_dim=32",
    "--config.model.transformer.num_heads=2",
    "--config.pp.crop=8",
    "--config.batch=32",
    "--config.lr.warmup_steps=1",
    "--config.log_every=2",
    "--config.checkpoint_every=2",
    "--config.eval_every=100",
  )
  assert proc.returncode == 0, failure_report(proc.stderr)
  # Only the run's own lines, without absl's prefix: no TensorFlow notices, no JAX backend
  # probing, no Orbax INFO lines or warnings about the checkpoints it wrote and read back.
  lines = proc.stderr.splitlines()
  assert [line for line in lines if ABSL_PREFIX.match(line)] == [], proc.stderr[-3000:]
  assert [line for line in lines if not line.startswith(RUN_LINES)] == [], proc.stderr[-3000:]
  assert "step 4/4 | loss" in proc.stderr and "img/s" in proc.stderr and "ETA" in proc.stderr
  assert "eval/accuracy" in proc.stderr
  assert sorted(os.listdir(workdir / "checkpoints")) == ["2", "4"]
  events = os.listdir(workdir / "tensorboard")
  assert any(e.startswith("events.out.tfevents") for e in events)
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["total_steps"] == 4 and saved["model"]["hidden_size"] == 32
  params = orbax_steps.read_params(workdir / "checkpoints")
  assert params["embedding"]["kernel"].shape == (4, 4, 3, 32)


def test_a_user_error_is_one_line_without_traceback_and_exit_status_2(tmp_path, digits_dir):
  proc = run_main(
    tmp_path / "bad", f"--config.data_dir={digits_dir}", "--config.total_steps=-5", timeout=300
  )
  assert proc.returncode == 2, failure_report(proc.stderr)
  assert "Traceback" not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1] == (
    "Error: config.total_steps=-5 must be an integer >= 0."
  )


def assert_resume_is_exact(
  config, tmp_path, monkeypatch, straight_run=None, stop=train_fixtures.run_preempted
):
  """A run stopped after step 4 (step 3 saved) and resumed ends with the parameters and
  accuracy of an uninterrupted run, bit for bit. ``straight_run``: (workdir, final metrics)
  of that uninterrupted run of ``config`` when one was made already (else it runs here);
  ``stop``: how the first run stops (`train_fixtures.run_preempted`, `run_sigkilled`)."""
  if straight_run is None:
    straight_dir = str(tmp_path / "straight")
    straight = run.train_and_evaluate(config, straight_dir)
  else:
    straight_dir, straight = straight_run

  stop(config, str(tmp_path / "resumed"), monkeypatch)
  # Step 3 was saved (checkpoint_every=3) and survived the failure; step 4 was not saved.
  assert sorted(os.listdir(tmp_path / "resumed" / "checkpoints")) == ["3"]

  real_iterator = data.train_iterator
  starts = []
  monkeypatch.setattr(
    data,
    "train_iterator",
    lambda *a, **kw: (starts.append(kw.get("start_step")), real_iterator(*a, **kw))[1],
  )
  resumed = run.train_and_evaluate(config, str(tmp_path / "resumed"))
  assert starts == [3]
  evals = {k: v for k, v in straight.items() if k.startswith("eval/")}
  assert evals and {k: resumed[k] for k in evals} == evals
  a = orbax_steps.read_params(os.path.join(straight_dir, "checkpoints", "6"))
  b = orbax_steps.read_params(tmp_path / "resumed" / "checkpoints" / "6")
  for k, v in traverse_util.flatten_dict(a, sep="/").items():
    np.testing.assert_array_equal(traverse_util.flatten_dict(b, sep="/")[k], v, err_msg=k)


def test_resumed_run_continues_at_the_saved_step_with_identical_parameters(
  tmp_path, tiny_config, monkeypatch, tiny_run
):
  # Decoded by threads: the straight run's worker processes gave the same batches.
  tiny_config.decode_processes = 0
  assert_resume_is_exact(tiny_config, tmp_path, monkeypatch, straight_run=tiny_run)


def test_resume_is_exact_with_every_regularizer_on(tmp_path, tiny_config, monkeypatch):
  """Mixup, stochastic depth, label smoothing, the sigmoid loss with AugReg's head bias,
  Adam's first moment in bfloat16 and dropout: every draw is keyed by (seed, step)."""
  train_fixtures.override(
    tiny_config,
    {
      "mixup.p": 0.5,
      "model.stoch_depth": 0.2,
      "model.transformer.dropout_rate": 0.1,
      "label_smoothing": 0.1,
      "loss": "sigmoid_xent",
      "model.head_bias_init": -6.9,
      "optim.momentum_dtype": "bfloat16",
      "decode_processes": 0,  # threads: no worker processes to start for each split
    },
  )
  assert_resume_is_exact(tiny_config, tmp_path, monkeypatch)


def test_resume_with_another_model_is_an_error_and_keeps_the_run(tmp_path, tiny_config, tiny_run):
  workdir = str(tmp_path / "run")
  shutil.copytree(tiny_run[0], workdir)  # the tiny run of tiny_config, finished
  before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  tiny_config.model.hidden_size = 48
  with pytest.raises(ValueError, match="model differ.*new --workdir"):
    run.train_and_evaluate(tiny_config, workdir)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before


def test_accumulation_that_does_not_divide_the_batch_is_a_clear_error(tiny_config):
  tiny_config.batch = 18
  tiny_config.accum_steps = 4
  with pytest.raises(ValueError, match="batch=18.*accum_steps=4.*multiple of 4"):
    train_fixtures.build_steps(tiny_config)
