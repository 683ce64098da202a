"""A run's checkpoints: every read verified, damaged steps moved aside, transient read errors
retried and never costing a step, retention, divergence."""

import json
import os
import re

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import traverse_util

from tests.finished_run import copy_run, flip_bytes, snapshot, tiny_flags, tiny_run_config
from vit_jax import main, run
from vit_jax.infra import errors
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


# Reading a step again after a failure: transient errors are retried, then one StorageError;
# only damage moves a step aside.


@pytest.fixture
def no_wait(monkeypatch):
  monkeypatch.setattr(orbax_steps, "RETRY_FIRST_WAIT_S", 0.0)


def tiny_steps(directory, steps=(1, 2), keep=3) -> dict:
  """Saves a tiny state at ``steps`` in ``directory``; the state (step ``s`` holds w + s)."""
  ckpts = run_checkpoints.RunCheckpoints(directory, keep=keep, async_save=False)
  for step in steps:
    state = {"params": {"w": jnp.arange(4.0) + step}, "step": jnp.asarray(step, jnp.int32)}
    ckpts.save(step, state)
  ckpts.close()
  return state


def failing(monkeypatch, owner, name: str, error: Exception, times: int) -> list[int]:
  """Makes ``owner.name`` raise ``error`` on its first ``times`` calls; the calls, counted."""
  original, calls = getattr(owner, name), [0]

  def patched(*args, **kwargs):
    calls[0] += 1
    if calls[0] <= times:
      raise error
    return original(*args, **kwargs)

  monkeypatch.setattr(owner, name, patched)
  return calls


def restore(directory, state, monkeypatch, error: Exception, times: int, keep: int = 3):
  """restore_latest of a new RunCheckpoints on ``directory`` whose manager's restore raises
  ``error`` ``times`` times; (the restored state or the UserError, the restore calls)."""
  ckpts = run_checkpoints.RunCheckpoints(directory, keep=keep, async_save=False)
  calls = failing(monkeypatch, ckpts._manager, "restore", error, times)
  try:
    return ckpts.restore_latest(state), calls[0]
  except errors.UserError as e:
    return e, calls[0]
  finally:
    ckpts.close()


@pytest.mark.parametrize(
  "error",
  [
    OSError("Connection reset by peer"),
    TimeoutError("read timed out"),
    ValueError('UNAVAILABLE: Error reading "params.w/0": HTTP response code: 503'),
  ],
  ids=["OSError", "TimeoutError", "tensorstore-UNAVAILABLE"],
)
def test_a_transient_restore_error_is_retried_and_moves_nothing(
  tmp_path, monkeypatch, no_wait, error, caplog
):
  directory = tmp_path / "checkpoints"
  state = tiny_steps(directory)
  before = sorted(os.listdir(directory))
  with caplog.at_level("WARNING"):
    got, calls = restore(directory, state, monkeypatch, error, times=1)
  assert calls == 2 and int(got["step"]) == 2
  np.testing.assert_array_equal(got["params"]["w"], np.arange(4.0) + 2)
  assert sorted(os.listdir(directory)) == before
  retries = [r.getMessage() for r in caplog.records if "a read failed" in r.getMessage()]
  assert len(retries) == 1 and "attempt 2 of 4" in retries[0], caplog.text


@pytest.mark.parametrize("keep", [1, 3])
@pytest.mark.parametrize(
  "error",
  [OSError("Connection reset by peer"), RuntimeError("boom")],
  ids=["OSError", "unknown-type"],
)
def test_a_restore_failing_every_time_is_one_storage_error_and_keeps_every_step(
  tmp_path, monkeypatch, no_wait, error, keep
):
  directory = tmp_path / "checkpoints"
  state = tiny_steps(directory, keep=keep)
  before = sorted(os.listdir(directory))
  assert before == (["2"] if keep == 1 else ["1", "2"])
  got, calls = restore(directory, state, monkeypatch, error, times=99, keep=keep)
  assert isinstance(got, errors.StorageError) and calls == orbax_steps.READ_ATTEMPTS
  message = str(got)
  assert "\n" not in message
  assert f"step 2 in {directory} (4 attempts; the last: {type(error).__name__}: " in message
  assert "Every step is left in place" in message and "run the same command again" in message
  assert sorted(os.listdir(directory)) == before  # no <step>.corrupt-*


def test_a_save_the_storage_fails_is_one_storage_error_and_keeps_the_older_steps(tmp_path):
  """A save that fails for a reason other than a full disk (a bucket that stops answering
  past the clients' retries) is one StorageError naming the folder; the older steps stay."""
  state = tiny_steps(tmp_path, steps=(1,))
  ckpts = run_checkpoints.RunCheckpoints(tmp_path, async_save=False)
  with pytest.MonkeyPatch.context() as patch:
    failing(patch, ckpts._manager, "save", ValueError("UNAVAILABLE: HTTP response code: 503"), 1)
    with pytest.raises(errors.StorageError) as raised:
      ckpts.save(2, state)
  ckpts.close()
  message = str(raised.value)
  assert "\n" not in message and str(tmp_path) in message and "503" in message
  assert orbax_steps.finalized_steps(tmp_path) == [1]


def test_retries_wait_doubling_and_out_of_memory_raises_at_once(tmp_path, monkeypatch, caplog):
  directory = tmp_path / "checkpoints"
  state = tiny_steps(directory, steps=(1,))
  monkeypatch.setattr(orbax_steps, "RETRY_FIRST_WAIT_S", 0.01)
  with caplog.at_level("WARNING"):
    got, _ = restore(directory, state, monkeypatch, OSError("reset"), times=99)
  assert isinstance(got, errors.StorageError)
  waits = re.findall(r"attempt (\d) of 4 in ([\d.]+) s", caplog.text)
  assert waits == [("2", "0.01"), ("3", "0.02"), ("4", "0.04")], caplog.text
  caplog.clear()
  oom = RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8 bytes.")
  with caplog.at_level("WARNING"), pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
    restore(directory, state, monkeypatch, oom, times=1)
  assert "attempt" not in caplog.text and os.listdir(directory) == ["1"]


def test_a_missing_file_once_is_read_again_before_it_counts_as_damage(
  tmp_path, monkeypatch, no_wait
):
  directory = tmp_path / "checkpoints"
  state = tiny_steps(directory)
  missing = FileNotFoundError("Metadata file (named _METADATA) does not exist")
  got, calls = restore(directory, state, monkeypatch, missing, times=1)
  assert calls == 2 and int(got["step"]) == 2 and sorted(os.listdir(directory)) == ["1", "2"]


def _damage_meta(step_dir):
  with open(step_dir / "meta" / "metadata", "w") as f:
    f.write("{not json")


def _wrong_fingerprint(step_dir):
  with open(step_dir / "meta" / "metadata") as f:
    meta = json.load(f)
  meta["fingerprint"] = {k: v + 1 for k, v in meta["fingerprint"].items()}
  with open(step_dir / "meta" / "metadata", "w") as f:
    json.dump(meta, f)


def _array_files(step_dir) -> list[str]:
  """The files of a step's tensorstore (OCDBT) databases: b-tree nodes and array chunks."""
  state = os.path.join(step_dir, "state")
  return [os.path.join(r, f) for r, _, files in os.walk(state) for f in files if r.endswith("/d")]


def _delete_array_files(step_dir):
  for path in _array_files(step_dir):
    os.remove(path)


def _truncate_array_files(step_dir):
  for path in _array_files(step_dir):
    os.truncate(path, 10)


DAMAGE = {  # how: (damage, what the CheckpointError of read_params says)
  "junk meta": (_damage_meta, "has no readable meta.*JSONDecodeError"),
  "fingerprint": (_wrong_fingerprint, r"is corrupt: \d of its \d arrays differ"),
  "deleted array files": (_delete_array_files, "cannot be read.*(NOT_FOUND|FAILED_PRECONDITION)"),
  "truncated array files": (_truncate_array_files, "cannot be read.*OUT_OF_RANGE"),
  "no state/_METADATA": (lambda d: os.remove(d / "state" / "_METADATA"), "_METADATA"),
}


# A resume restores into the state it is given: it reads no state/_METADATA.
@pytest.mark.parametrize("how", [how for how in DAMAGE if "_METADATA" not in how])
def test_damage_moves_the_step_aside_and_restores_the_older_one(tmp_path, how, no_wait):
  directory = tmp_path / "checkpoints"
  state = tiny_steps(directory)
  DAMAGE[how][0](directory / "2")
  ckpts = run_checkpoints.RunCheckpoints(directory, keep=3, async_save=False)
  got = ckpts.restore_latest(state)
  ckpts.close()
  names = sorted(os.listdir(directory))
  assert int(got["step"]) == 1 and len(names) == 2 and names[0] == "1"
  assert names[1].startswith("2.corrupt-")


@pytest.mark.parametrize("how", DAMAGE)
def test_read_params_calls_damage_a_checkpoint_error(tmp_path, how, no_wait):
  directory = tmp_path / "checkpoints"
  tiny_steps(directory)
  damage, says = DAMAGE[how]
  damage(directory / "2")
  with pytest.raises(errors.CheckpointError, match=f"step 2 .*{says}.*/1"):
    orbax_steps.read_params(directory)
  assert sorted(os.listdir(directory)) == ["1", "2"]


@pytest.mark.parametrize("times, raises", [(1, None), (99, errors.StorageError)])
@pytest.mark.parametrize("reader", ["meta", "state"])
def test_read_params_retries_a_transient_error_then_raises_a_storage_error(
  tmp_path, monkeypatch, no_wait, times, raises, reader
):
  directory = tmp_path / "checkpoints"
  tiny_steps(directory)
  owner = ocp.JsonCheckpointHandler if reader == "meta" else ocp.PyTreeCheckpointer
  calls = failing(monkeypatch, owner, "restore", ConnectionError("reset"), times)
  if raises is None:
    np.testing.assert_array_equal(orbax_steps.read_params(directory)["w"], np.arange(4.0) + 2)
    assert calls[0] == 2
  else:
    with pytest.raises(raises, match=r"step 2 .*ConnectionError: reset.*left in place"):
      orbax_steps.read_params(directory)
    assert calls[0] == orbax_steps.READ_ATTEMPTS
  assert sorted(os.listdir(directory)) == ["1", "2"]


def test_check_resume_and_retention_do_not_pass_over_an_unreadable_newest_step(
  tmp_path, monkeypatch, no_wait
):
  directory = tmp_path / "checkpoints"
  state = tiny_steps(directory)
  ckpts = run_checkpoints.RunCheckpoints(directory, keep=1, async_save=False)
  failing(monkeypatch, ocp.JsonCheckpointHandler, "restore", OSError("reset"), 99)
  with pytest.raises(errors.StorageError, match="step 2 "):
    run_checkpoints.check_resume(directory, {}, state)  # not: resume from step 1
  ckpts.close()  # would delete step 1, but the newest step cannot be read back
  assert sorted(os.listdir(directory)) == ["1", "2"]


def test_a_run_whose_restore_keeps_failing_is_one_line_exit_2_steps_untouched(
  finished_run, tmp_path, digits_dir, monkeypatch, no_wait, capsys
):
  workdir = copy_run(finished_run, tmp_path / "run")
  before = snapshot(workdir)
  failing(monkeypatch, ocp.CheckpointManager, "restore", OSError("Connection reset"), 99)
  capsys.readouterr()
  assert main.main(["main", *tiny_flags(digits_dir), f"--workdir={workdir}"]) == 2
  err = capsys.readouterr().err
  message = [line for line in err.splitlines() if line.startswith("Error: ")]
  assert len(message) == 1 and "Traceback" not in err, err[-2000:]
  assert f"Cannot read checkpoint step 6 in {workdir}/checkpoints (4 attempts" in message[0]
  assert snapshot(workdir) == before


def test_a_changed_label_feature_is_another_task_and_refused(tmp_path):
  """dSprites' location and orientation tasks: one dataset, splits and class count; only
  the label feature tells them apart. A checkpoint saved before the key existed resumes."""
  state = {"params": {"w": jnp.arange(4.0)}, "step": jnp.zeros((), jnp.int32)}
  location = {"dataset": "dsprites", "train_split": "train[:800]", "label_key": "location"}
  for name, data in (("new", location), ("old", {"dataset": "dsprites"})):
    ckpts = run_checkpoints.RunCheckpoints(tmp_path / name, data=data, async_save=False)
    ckpts.save(1, state)
    ckpts.close()
  orientation = {**location, "label_key": "orientation"}
  with pytest.raises(errors.ResumeError, match=r"label_key: 'location' -> 'orientation'"):
    run_checkpoints.check_resume(tmp_path / "new", orientation, state)
  assert run_checkpoints.check_resume(tmp_path / "old", orientation, state)
