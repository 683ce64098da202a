"""Training runs whose workdir is a gs:// bucket, on a real GCS server (`tests.gcs_server`):
the quickstart trains there, is SIGKILLed right after a checkpoint is committed, resumes,
and ends bitwise equal to a straight run in a local folder, on the core install
(TensorFlow hidden) and with TensorFlow; the one-run lock is exclusive on the bucket."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests import gcs_proxy
from tests.finished_run import tiny_flags
from tests.fresh_python import REPO, clean_env
from vit_jax import main
from vit_jax.infra import errors, storage
from vit_jax.run import folder as folder_lib
from vit_jax.weights import orbax_steps

pytest_plugins = ["tests.finished_run"]  # the finished_run fixture


def _assert_same_params(workdir: str, reference: str) -> None:
  got, want = (orbax_steps.read_params(f"{w}/checkpoints/6") for w in (workdir, reference))
  leaves = zip(*(jax_leaves(p) for p in (got, want)))
  for a, b in leaves:
    np.testing.assert_array_equal(a, b)


def jax_leaves(tree):
  import jax  # pylint: disable=g-import-not-at-top

  return jax.tree.leaves(tree)


def _threads_flags(digits_dir: str) -> list[str]:
  """`tiny_flags` decoded by threads: no worker processes to start for each split of a run
  in this process (its data is local; the workdir on the bucket is what it tests)."""
  return [*tiny_flags(digits_dir), "--config.decode_processes=0"]


def test_trains_into_a_bucket_with_tensorflow_as_into_a_local_folder(
  gcs_bucket, finished_run, digits_dir
):
  workdir = f"{gcs_bucket}/run"
  assert main.main(["main", *_threads_flags(digits_dir), f"--workdir={workdir}"]) == 0
  _assert_same_params(workdir, finished_run)
  fs = storage.filesystem(workdir)
  assert fs.exists(f"{workdir}/config.json") and not fs.exists(f"{workdir}/run.lock")
  (events,) = fs.glob(f"{workdir}/tensorboard/events.out.tfevents.*")
  from tensorboard.backend.event_processing import event_file_loader  # pylint: disable=g-import-not-at-top

  local = os.path.join(digits_dir, "..", "events_copy")
  fs.get_file(events, local)
  tags = {v.tag for e in event_file_loader.EventFileLoader(local).Load() for v in e.summary.value}
  assert {"train/loss", "eval/accuracy"} <= tags


def test_killed_after_a_checkpoint_on_a_bucket_resumes_exactly_without_tensorflow(
  gcs_server, gcs_bucket, finished_run, digits_dir
):
  """The first run is SIGKILLed by the proxy at its first request for step 6's save, which
  starts only once step 3's save is complete; what reaches the bucket of step 6 is a step
  without its commit marker, as a kill mid-save leaves it. The resumed run starts at
  step 3 and ends equal to a straight run."""
  workdir = f"{gcs_bucket}/run"
  proxy = gcs_proxy.GcsProxy(gcs_server.url)
  command = [sys.executable, "-m", "tests.no_tensorflow", "vit_jax.main", *tiny_flags(digits_dir)]
  try:
    first = subprocess.Popen(
      [*command, f"--workdir={workdir}"],
      cwd=REPO,
      env=clean_env(**proxy.env),
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
    )
    killed = threading.Event()

    def kill(_request: str) -> None:
      first.send_signal(signal.SIGKILL)
      killed.set()

    proxy.on(r"run/checkpoints/6", kill)
    _, err = first.communicate(timeout=240)
  finally:
    proxy.close()
  assert killed.is_set() and first.returncode == -signal.SIGKILL, err[-3000:]
  assert orbax_steps.finalized_steps(f"{workdir}/checkpoints") == [3]
  resumed = subprocess.run(
    [*command, f"--workdir={workdir}"],
    cwd=REPO,
    env=clean_env(**gcs_server.env),
    capture_output=True,
    text=True,
    timeout=240,
  )
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "from step 3 to 6" in resumed.stderr, resumed.stderr[-3000:]
  _assert_same_params(workdir, finished_run)


def test_runs_taking_the_lock_of_one_bucket_workdir_at_once_one_wins(gcs_bucket, monkeypatch):
  """Eight runs, each on a host of its own (a thread named as one), take the lock at once:
  the server's exclusive create lets one through; a stale lock that two take over at
  once is also taken by one."""
  monkeypatch.setattr(folder_lib.socket, "gethostname", lambda: threading.current_thread().name)
  runs = [folder_lib.RunFolder(f"{gcs_bucket}/run") for _ in range(8)]
  outcomes: list[object] = [None] * len(runs)
  barrier = threading.Barrier(len(runs))

  def take(k: int) -> None:
    barrier.wait()
    try:
      with runs[k].lock():
        outcomes[k] = "trained"
        barrier.wait()  # hold the lock until every other attempt has failed
    except errors.WorkdirInUseError as e:
      outcomes[k] = e
      barrier.wait()

  threads = [threading.Thread(target=take, args=(k,)) for k in range(len(runs))]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=60)
  assert outcomes.count("trained") == 1, outcomes
  refused = [o for o in outcomes if isinstance(o, errors.WorkdirInUseError)]
  assert len(refused) == 7 and all("is in use by the run of pid" in str(e) for e in refused)

  # A lock left by a run on another host, beat long ago: stale. Two runs take it over at once.
  lock = f"{gcs_bucket}/run/run.lock"
  storage.filesystem(lock).pipe_file(
    lock, json.dumps(dict(host="gone-host", pid=1, started=0.0, beat=0.0)).encode()
  )
  outcomes = [None] * 2
  barrier = threading.Barrier(2)
  threads = [threading.Thread(target=take, args=(k,)) for k in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=60)
  assert outcomes.count("trained") == 1, outcomes


@pytest.mark.parametrize("count", [1])
def test_storage_emulator_host_is_what_tensorstore_reads(count, gcs_bucket):
  """One variable for the user: the package maps it onto tensorstore's own."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  del count
  storage.configure()
  spec = {"driver": "zarr", "kvstore": f"{gcs_bucket}/array"}
  array = ts.open(spec, create=True, dtype=ts.int32, shape=[3]).result()
  array.write(np.arange(3, dtype=np.int32)).result()
  assert storage.filesystem(gcs_bucket).exists(f"{gcs_bucket}/array/.zarray")


def _listing(fs, root: str) -> list[str]:
  return sorted(fs.find(root, withdirs=True))


def test_storage_faults_in_a_save_and_a_restore_lose_nothing(
  gcs_server, gcs_bucket, finished_run, digits_dir, monkeypatch, capsys
):
  """503s from the bucket, through a proxy: during step 3's save and during the restore of
  a finished run they are retried (gcsfs, tensorstore, the restore) and the run ends as a
  straight local one; an outage that outlasts every retry is one error line, exit 2, and
  every step and file of the workdir stays where it was."""
  import gcsfs.retry  # pylint: disable=g-import-not-at-top

  async def no_wait(_):  # gcsfs's backoff, instant: the retries themselves still happen
    pass

  monkeypatch.setattr(gcsfs.retry.asyncio, "sleep", no_wait)
  monkeypatch.setattr(orbax_steps, "RETRY_FIRST_WAIT_S", 0.0)
  workdir = f"{gcs_bucket}/run"
  argv = ["main", *_threads_flags(digits_dir), f"--workdir={workdir}"]
  proxy = gcs_proxy.GcsProxy(gcs_server.url)
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
  try:
    proxy.fail(2, r"checkpoints/3/state")  # tensorstore's array uploads
    proxy.fail(2, r"checkpoints/3/meta")  # gcsfs: Orbax's JSON item
    assert main.main(argv) == 0
    _assert_same_params(workdir, finished_run)
    proxy.fail(3, r"GET .*checkpoints%2F6%2F")  # reads of the newest step
    assert main.main(argv) == 0  # resumed at step 6: nothing left to train
    assert orbax_steps.finalized_steps(f"{workdir}/checkpoints") == [3, 6]
    fs = storage.filesystem(workdir)
    before = _listing(fs, workdir)
    capsys.readouterr()
    proxy.fail(10**6, r"GET .*checkpoints%2F6%2Fmeta")
    assert main.main(argv) == 2
  finally:
    proxy.close()
  err = capsys.readouterr().err
  (line,) = [e for e in err.splitlines() if e.startswith("Error:")]
  assert "checkpoints" in line and "left in place" in line and "Traceback" not in err, err[-3000:]
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)
  after = _listing(fs, workdir)
  assert after == before and not any(".corrupt" in p for p in after)
