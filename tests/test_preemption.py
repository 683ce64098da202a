"""Preemption and shared workdirs: SIGTERM / SIGINT save the step in flight and exit with
128 + the signal; one run trains in a workdir at a time (a lock); a stale lock is taken over."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.finished_run import copy_run, snapshot, tiny_flags
from tests.fresh_python import REPO, clean_env
from vit_jax import main
from vit_jax.infra import errors, paths
from vit_jax.run import folder as folder_lib
from vit_jax.run import preemption
from vit_jax.weights import orbax_steps

pytest_plugins = ["tests.finished_run"]  # the finished_run fixture

# Long enough to be running when the signal comes; saves only when asked.
_ENDLESS = ["--config.total_steps=100000", "--config.checkpoint_every=100000"]


class _Main:
  """`python -m vit_jax.main` in a subprocess whose stderr lines are collected as they come."""

  def __init__(self, digits_dir: str, workdir: str, *extra: str):
    cmd = [sys.executable, "-m", "vit_jax.main", *tiny_flags(digits_dir), f"--workdir={workdir}"]
    self.proc = subprocess.Popen(
      [*cmd, *extra], cwd=REPO, env=clean_env(), stderr=subprocess.PIPE, text=True
    )
    self.lines: list[str] = []
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self) -> None:
    for line in self.proc.stderr:
      self.lines.append(line)

  def wait_for(self, text: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not any(text in line for line in self.lines):
      assert self.proc.poll() is None, "".join(self.lines)[-3000:]
      assert time.monotonic() < deadline, f"no {text!r} in:\n" + "".join(self.lines)[-3000:]
      time.sleep(0.2)

  def kill(self) -> None:
    """Ends the process if it still runs."""
    if self.proc.poll() is None:
      self.proc.kill()
      self.proc.wait()

  def finish(self, timeout: float = 120) -> tuple[int, str]:
    status = self.proc.wait(timeout=timeout)
    self._reader.join(timeout=10)
    return status, "".join(self.lines)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_saves_the_step_in_flight_and_a_second_run_is_refused_meanwhile(
  signum, tmp_path, digits_dir, capsys
):
  workdir = str(tmp_path / "run")
  first = _Main(digits_dir, workdir, *_ENDLESS, "--config.log_every=5")
  try:
    first.wait_for("step 10/")
    if signum == signal.SIGTERM:  # the lock: a second run on the same workdir is refused
      # (the second run in this process: no start-up of its own while the first trains on)
      capsys.readouterr()
      status = main.main(["main", *tiny_flags(digits_dir), f"--workdir={workdir}", *_ENDLESS])
      err = capsys.readouterr().err
      assert status == 2 and "in use by the run of pid" in err, err[-3000:]
      assert str(first.proc.pid) in err and "Traceback" not in err
    sent = time.monotonic()
    first.proc.send_signal(signum)
    status, err = first.finish()
  finally:
    first.kill()  # endless: never left running by a failure
  seconds = time.monotonic() - sent
  assert status == 128 + signum, err[-3000:]
  stopped = [line for line in err.splitlines() if f"Stopped by {signum.name} at step" in line]
  assert len(stopped) == 1 and "Traceback" not in err, err[-3000:]
  step = int(stopped[0].split(" at step ")[1].split(":")[0])
  assert step >= 10 and ": saved; rerun the same command to resume" in stopped[0]
  # The step in flight was saved: no step is lost, and the lock is gone.
  assert orbax_steps.finalized_steps(os.path.join(workdir, "checkpoints")) == [step]
  assert not os.path.exists(os.path.join(workdir, folder_lib.LOCK_FILE))
  print(f"{signum.name}: stopped at step {step}, {seconds:.1f} s from the signal to exit")


def test_a_second_signal_ends_the_process_at_once(monkeypatch):
  exits = []
  monkeypatch.setattr(preemption.os, "_exit", exits.append)
  stop = preemption.StopSignals()
  stop._handle(signal.SIGTERM, None)  # pylint: disable=protected-access
  assert stop.should_stop(1) and not exits
  stop._handle(signal.SIGTERM, None)  # pylint: disable=protected-access
  assert exits == [143]
  assert preemption.Stopped(signal.SIGINT, 7, saved=True).status == 130


def _write_lock(workdir, **holder):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, folder_lib.LOCK_FILE), "w") as f:
    json.dump(holder, f)


def test_a_live_lock_refuses_and_a_stale_one_is_taken_over(
  finished_run, tmp_path, digits_dir, capsys
):
  workdir = copy_run(finished_run, tmp_path / "run")
  holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
  try:
    _write_lock(workdir, host=socket.gethostname(), pid=holder.pid, started=time.time())
    before = snapshot(workdir)
    assert main.main(["main", *tiny_flags(digits_dir), f"--workdir={workdir}"]) == 2
    err = capsys.readouterr().err
    assert f"in use by the run of pid {holder.pid}" in err and "delete" in err, err[-2000:]
    assert snapshot(workdir) == before
  finally:
    holder.kill()
    holder.wait()
  # The same lock once its process is gone, and one of another host whose heartbeat
  # stopped long ago (a preempted VM): taken over; the finished run only evaluates.
  for lock in (
    dict(host=socket.gethostname(), pid=holder.pid, started=time.time()),
    dict(host="gone-vm", pid=1, started=0.0, beat=time.time() - folder_lib.STALE_SECONDS - 1),
  ):
    _write_lock(workdir, **lock)
    assert main.main(["main", *tiny_flags(digits_dir), f"--workdir={workdir}"]) == 0
    assert not os.path.exists(os.path.join(workdir, folder_lib.LOCK_FILE))
  # Another host's lock with a fresh heartbeat cannot be checked from here: refused.
  _write_lock(workdir, host="other-vm", pid=1, started=time.time(), beat=time.time())
  with pytest.raises(errors.WorkdirInUseError, match="on host other-vm"):
    with folder_lib.RunFolder(workdir).lock():
      pass


def test_a_lock_being_written_is_not_taken_over(tmp_path, monkeypatch):
  """A lock that does not parse (a run between its exclusive create and its write, as a
  second run once read a heartbeat mid-write and took over a live run's lock): refused
  while recent, read again meanwhile; taken over once as old as a dead run's. The
  heartbeat replaces the file whole."""
  monkeypatch.setattr(folder_lib, "_LOCK_READ_PAUSE_S", 0.0)
  workdir = str(tmp_path / "run")
  os.makedirs(workdir)
  lock = os.path.join(workdir, folder_lib.LOCK_FILE)
  open(lock, "w").close()
  with pytest.raises(errors.WorkdirInUseError, match="is being written by the run that took it"):
    with folder_lib.RunFolder(workdir).lock():
      pass
  old = time.time() - folder_lib.STALE_SECONDS - 1
  os.utime(lock, (old, old))
  run_folder = folder_lib.RunFolder(workdir)
  with run_folder.lock():
    with open(lock) as f:
      assert json.load(f)["pid"] == os.getpid()
    replaced = os.stat(lock).st_ino
    run_folder.heartbeat()
    assert os.stat(lock).st_ino != replaced and os.listdir(workdir) == [folder_lib.LOCK_FILE]
  assert not os.path.exists(lock)


def test_an_allowed_change_is_recorded_and_config_json_is_kept(finished_run, tmp_path, digits_dir):
  workdir = copy_run(finished_run, tmp_path / "run")
  config_json = os.path.join(workdir, paths.CONFIG_FILE)
  with open(config_json) as f:
    original = f.read()
  args = ["--config.batch=32", "--config.allow_changed_batch=True"]
  assert main.main(["main", *tiny_flags(digits_dir), f"--workdir={workdir}", *args]) == 0
  with open(config_json) as f:
    assert f.read() == original  # what the checkpoints were trained with
  with open(os.path.join(workdir, paths.HISTORY_FILE)) as f:
    (entry,) = [json.loads(line) for line in f]
  assert entry["step"] == 6 and "config.batch: 16 -> 32" in entry["changes"]
