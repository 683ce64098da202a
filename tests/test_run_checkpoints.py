"""A run's checkpoints: every read verified, corrupt steps moved aside, retention, divergence."""

import os
import re

import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from tests.finished_run import copy_run, flip_bytes, tiny_run_config
from vit_jax import errors, run
from vit_jax.run import checkpoints as run_checkpoints
from vit_jax.weights import orbax_steps

pytest_plugins = ["tests.finished_run"]  # the finished_run fixture


def flat_params(path) -> dict[str, np.ndarray]:
  return traverse_util.flatten_dict(orbax_steps.read_params(path), sep="/")


def test_read_params_refuses_a_corrupt_step_and_names_it(finished_run, tmp_path):
  workdir = copy_run(finished_run, tmp_path / "run")
  checkpoints = os.path.join(workdir, "checkpoints")
  flip_bytes(os.path.join(checkpoints, "6"))
  # The newest step is read by default (evaluation, fine-tuning, predict, export).
  with pytest.raises(errors.CheckpointError, match=r"step 6 .*(is corrupt|cannot be read).*/3"):
    orbax_steps.read_params(checkpoints)
  assert flat_params(os.path.join(checkpoints, "3"))


def test_reading_a_step_the_package_wrote_warns_nothing(finished_run, caplog):
  with caplog.at_level("WARNING"):
    orbax_steps.read_params(os.path.join(finished_run, "checkpoints"))
  assert not caplog.records, caplog.text  # e.g. Orbax's "Metadata file does not exist"


def test_missing_metadata_and_truncated_files_name_the_step(finished_run, tmp_path):
  checkpoints = os.path.join(copy_run(finished_run, tmp_path / "run"), "checkpoints")
  os.remove(os.path.join(checkpoints, "6", "state", "_METADATA"))
  with pytest.raises(errors.CheckpointError, match=r"step 6 .*_METADATA.* does not exist"):
    orbax_steps.read_params(checkpoints)
  for root, _, files in os.walk(os.path.join(checkpoints, "3", "state")):
    for name in files:
      if root.endswith("d"):
        path = os.path.join(root, name)
        os.truncate(path, os.path.getsize(path) // 2)
  with pytest.raises(errors.CheckpointError, match=r"step 3 .*cannot be read"):
    orbax_steps.read_params(os.path.join(checkpoints, "3"))


def test_resume_moves_a_corrupt_step_aside_and_writes_it_again(finished_run, tmp_path, digits_dir):
  workdir = copy_run(finished_run, tmp_path / "run")
  checkpoints = os.path.join(workdir, "checkpoints")
  flip_bytes(os.path.join(checkpoints, "6"))
  run.train_and_evaluate(tiny_run_config(digits_dir), workdir)  # resumes at 3
  names = sorted(os.listdir(checkpoints))
  assert names[:2] == ["3", "6"] and len(names) == 3 and names[2].startswith("6.corrupt-")
  want = flat_params(os.path.join(finished_run, "checkpoints", "6"))
  got = flat_params(os.path.join(checkpoints, "6"))  # written again, intact
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_retention_keeps_the_newest_intact_step_while_newer_ones_fail(tmp_path):
  directory = tmp_path / "checkpoints"
  ckpts = run_checkpoints.RunCheckpoints(directory, keep=2, async_save=False)
  state = {"params": {"w": jnp.arange(4.0)}, "step": jnp.zeros((), jnp.int32)}
  for step in (1, 2, 3):
    ckpts.save(step, state)
  ckpts.wait_until_finished()
  flip_bytes(directory / "3")
  ckpts.save(4, state)  # would delete 1, but 3, the newest, fails its read-back
  assert ckpts.all_steps() == [1, 2, 3, 4]
  ckpts.close()  # 4 reads back intact: now 1 and 2 may go
  assert orbax_steps.finalized_steps(directory) == [3, 4]


def test_divergence_stops_with_one_message_and_keeps_the_good_steps(
  finished_run, tmp_path, digits_dir
):
  workdir = copy_run(finished_run, tmp_path / "run")
  config = tiny_run_config(digits_dir)
  config.total_steps = 12
  config.lr.base = 1e6
  with pytest.raises(errors.DivergenceError) as e:
    run.train_and_evaluate(config, workdir)
  message = str(e.value)
  # Which step first overflows depends on float rounding; it is one after the resume at 6.
  diverged = int(re.search(r"Training diverged at step (\d+)", message).group(1))
  assert 7 <= diverged <= 12 and "last saved step is 6" in message
  assert "config.lr.base (now 1000000.0)" in message and "grad_clip_norm" in message
  assert orbax_steps.finalized_steps(os.path.join(workdir, "checkpoints")) == [3, 6]
  assert all(
    np.isfinite(v).all() for v in flat_params(os.path.join(workdir, "checkpoints")).values()
  )


def test_a_changed_seed_resumes_only_when_allowed(finished_run, tmp_path, digits_dir):
  workdir = copy_run(finished_run, tmp_path / "run")
  config = tiny_run_config(digits_dir)
  config.seed = 7
  with pytest.raises(errors.ResumeError, match="seed: 0 -> 7.*allow_changed_seed"):
    run.train_and_evaluate(config, workdir)
  config.allow_changed_seed = True
  assert "eval/accuracy" in run.train_and_evaluate(config, workdir)  # finished: evaluates
