"""The decoding stage's worker processes (`data/decode_workers.py`): the same batches as
the threads, exact resume, shared slots never rewritten while a batch is held, and a
worker's death as one error naming the fix."""

import errno
import os
import re
import signal
import time

import numpy as np
import pytest
from absl import flags
from PIL import Image

from tests import train_fixtures
from vit_jax import cli, data
from vit_jax.data import dataset, decode_stage, decode_worker, decode_workers, pipeline
from vit_jax.infra import errors

CROP = 16


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> str:
  """A folder of 40 noisy JPEGs in 2 classes (so crops differ), one of them broken."""
  root = tmp_path_factory.mktemp("photos")
  rng = np.random.default_rng(0)
  for k in range(40):
    folder = root / "train" / f"class_{k % 2}"
    folder.mkdir(parents=True, exist_ok=True)
    pixels = rng.integers(0, 256, (24 + k, 30, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(folder / f"{k:02d}.jpg", quality=90)
  (root / "train" / "class_0" / "broken.jpg").write_bytes(b"\xff\xd8\xff not a JPEG")
  (root / "test" / "class_0").mkdir(parents=True)
  Image.fromarray(pixels).save(root / "test" / "class_0" / "a.jpg")
  return str(root)


def _dataset(root: str, processes: int) -> dataset.Dataset:
  config = train_fixtures.common_config(
    dataset=f"folder:{root}",
    train_split="train",
    test_split="test",
    pp=dict(crop=CROP),
    shuffle_buffer=100,
    skip_corrupt_images=True,
    decode_processes=processes,
  )
  return dataset.Dataset(data.Settings.from_config(config))


def _train(root: str, processes: int, start: int, steps: int, batch: int = 4) -> list[dict]:
  batches = pipeline.local_train_batches(_dataset(root, processes), batch, start, 0, 1)
  out = [{k: np.array(v) for k, v in next(batches).items()} for _ in range(steps)]
  batches.close()
  return out


def test_processes_give_the_threads_batches_and_resume_exactly(photos):
  threads = _train(photos, 0, 0, 14)  # past an epoch of 41 files, the broken one skipped
  processes = _train(photos, 2, 0, 14)
  resumed = _train(photos, 2, 9, 5)
  for expected, got in zip(threads, processes):
    np.testing.assert_array_equal(got["image"], expected["image"])
    np.testing.assert_array_equal(got["label"], expected["label"])
  for expected, got in zip(threads[9:], resumed):
    np.testing.assert_array_equal(got["image"], expected["image"])
  assert np.ptp(threads[0]["image"]) > 1.0  # real crops, not blank rows


def test_eval_passes_are_the_threads_and_survive_an_abandoned_pass(photos):
  def passes(processes):
    evaluation = pipeline.EvalBatches(_dataset(photos, processes), "train", 8, 0, 1)
    abandoned = iter(evaluation)
    next(abandoned)  # a pass left open while the next runs: it gets its own workers
    first, second = list(evaluation), list(evaluation)
    abandoned.close()
    return first, second

  (threads, _), (first, second) = passes(0), passes(2)
  assert len(first) == len(threads) == 6  # 41 files in batches of 8
  for expected, a, b in zip(threads, first, second):
    np.testing.assert_array_equal(a["mask"], expected["mask"])
    np.testing.assert_array_equal(a["image"], expected["image"])
    np.testing.assert_array_equal(b["image"], expected["image"])
  assert sum(b["mask"].sum() for b in first) == 40  # the broken file masked out


def test_a_held_batch_is_never_rewritten_and_slots_are_reused(photos):
  stage = decode_stage.Stage(
    data.Settings.from_config(train_fixtures.common_config(pp=dict(crop=CROP))),
    "path",
    num_classes=2,
    train=True,
    processes=2,
  )
  files = sorted(os.path.join(d, f) for d, _, fs in os.walk(photos) for f in fs if f[0].isdigit())

  def reader():
    for start in range(0, 400, 40):  # ten epochs of the 40 good files
      ids = np.arange(start, start + 40)
      values = np.array([files[i % 40].encode() for i in ids], object)
      yield ids, ids, values, ids % 2, np.full(40, b"", object)

  stream = stage.batches(reader, local_batch=4)()
  held = next(stream)
  copy = held[1].copy()
  for _ in range(60):
    next(stream)  # each dropped at once: its slot is free for the next batch
  np.testing.assert_array_equal(held[1], copy)
  stream.close()
  (pool,) = stage._idle_pools
  # Reused: at most the batches the tasks sent ahead reach (a window of 2 * in-flight
  # groups per worker), the one being filled, the held one; not one per batch.
  ahead = 2 * decode_workers._IN_FLIGHT * 2 * decode_stage._GROUP // 4
  assert len(pool.images._slots) <= ahead + 3 < 61


def test_a_killed_worker_is_one_line_naming_it_and_the_way_out(photos, capsys, monkeypatch):
  """A worker killed by the kernel (the out-of-memory killer's SIGKILL) while a run trains:
  the command prints one line naming the worker, the signal and the way out, exit 2."""
  verbosity = flags.FLAGS["verbosity"]  # the command sets it: restored after the test
  monkeypatch.setattr(verbosity, "present", verbosity.present)
  monkeypatch.setattr(verbosity, "value", verbosity.value)
  before = _children()
  batches = pipeline.local_train_batches(_dataset(photos, 2), 4, 0, 0, 1)
  next(batches)
  workers = _children() - before
  assert len(workers) == 2
  killed = min(workers)
  os.kill(killed, signal.SIGKILL)

  def command(_):
    for _ in range(30):
      next(batches)

  assert cli.run_command([], lambda argv: argv, command) == cli.USER_ERROR_STATUS
  assert capsys.readouterr().err == (
    f"Error: Decode worker process {killed} was killed by SIGKILL, likely the kernel's "
    "out-of-memory killer (`dmesg` shows it): lower config.decode_processes (now 2; 0 "
    "decodes in this process) or config.batch, or give the machine more memory; then run "
    "the same command again (a training run resumes from its last checkpoint).\n"
  )
  assert _zombie_or_gone(killed) and all(_zombie_or_gone(pid) for pid in workers)


def test_a_worker_alive_but_silent_is_stopped_and_named(photos, monkeypatch):
  """A worker that runs but never answers (stopped here by SIGSTOP, as a read stuck on a
  dead connection would leave it): after `SILENCE_SECONDS` the stream fails naming it, the
  worker is killed, and its pool is closed instead of serving the next stream."""
  before = _children()
  batches = pipeline.local_train_batches(_dataset(photos, 2), 4, 0, 0, 1)
  next(batches)  # the workers started (their start counts as silence too)
  workers = _children() - before
  # Far longer than a task of 4 tiny images takes on a loaded machine.
  monkeypatch.setattr(decode_workers, "SILENCE_SECONDS", 5.0)
  stopped = min(workers)
  os.kill(stopped, signal.SIGSTOP)
  start = time.monotonic()
  with pytest.raises(errors.UserError) as raised:
    for _ in range(30):
      next(batches)
  assert str(raised.value).startswith(
    f"Decode worker process {stopped} answered nothing for 5 s while it had images to decode"
  )
  assert time.monotonic() - start < 60  # a bound, not a speed: without it the loop waits forever
  batches.close()
  assert all(_zombie_or_gone(pid) for pid in workers)


@pytest.mark.parametrize(
  "code, expected",
  [
    (-signal.SIGSEGV, r"process 7 was killed by SIGSEGV: set config.decode_processes=0 to"),
    (1, r"process 7 exited with status 1 \(its error, if any, is above\): set config.deco"),
    (-99, r"process 7 was killed by signal 99: set"),
  ],
)
def test_other_ends_of_a_worker_are_named(code, expected):
  error = decode_workers._ended(7, code, 3)
  assert isinstance(error, errors.UserError)
  assert re.match(rf"Decode worker {expected}", str(error))
  assert str(error).endswith("(a training run resumes from its last checkpoint).")


def _pool_error(monkeypatch, **patches) -> str:
  """The one-line error of a pool of 2 workers started with ``patches`` and given a task."""
  for name, value in patches.items():
    monkeypatch.setattr(decode_workers, name, value)
  settings = data.Settings.from_config(train_fixtures.common_config(pp=dict(crop=CROP)))
  task = ((1, CROP, CROP, 3), [("unused", 0, b"", 0)])
  with pytest.raises(errors.UserError) as raised:
    pool = decode_workers.Pool((settings, "bytes", True), 2)
    try:
      list(pool.map([0, 1, 2], lambda _: task))
    finally:
      pool.close()
  assert "\n" not in str(raised.value)
  return str(raised.value)


def test_a_worker_that_cannot_start_is_one_line(monkeypatch):
  """The interpreter cannot be started; it starts but cannot import the stage (here: cv2);
  it exits at once. Each is one line, with no traceback of the worker's."""
  monkeypatch.setattr(decode_workers.sys, "executable", "/no/such/python")
  assert re.fullmatch(
    r"Cannot start a decode worker process \(No such file or directory\): lower "
    r"config.decode_processes \(now 2; 0 decodes in this process\), then run the same "
    r"command again.",
    _pool_error(monkeypatch),
  )
  monkeypatch.undo()
  no_cv2 = "import sys; sys.modules['cv2'] = None; import runpy; "
  no_cv2 += "runpy.run_module('vit_jax.data.decode_worker', run_name='__main__')"
  assert re.fullmatch(
    r"Decode worker process \d+ cannot start \(ModuleNotFoundError: import of cv2 halted; "
    r"None in sys.modules\): set config.decode_processes=0 to decode in this process, or "
    r"repair the installation.",
    _pool_error(monkeypatch, _WORKER_ARGS=("-c", no_cv2)),
  )
  assert re.match(
    r"Decode worker process \d+ exited with status 3 \(its error, if any, is above\): set",
    _pool_error(monkeypatch, _WORKER_ARGS=("-c", "import sys; sys.exit(3)")),
  )


@pytest.mark.parametrize("call", ["memfd_create", "posix_fallocate", "mmap"])
def test_a_batch_slot_the_system_cannot_make_is_one_line(monkeypatch, call):
  def fail(*args, **kwargs):
    raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))

  monkeypatch.setattr(decode_workers.mmap if call == "mmap" else decode_workers.os, call, fail)
  images = decode_workers.SharedImages()
  with pytest.raises(errors.ConfigError) as raised:
    images.take((512, 224, 224, 3))
  assert str(raised.value) == (
    "No memory for a batch of images in shared memory (294 MiB; Cannot allocate memory): "
    "lower config.batch, or set config.decode_processes=0 to decode in this process."
  )


def test_workers_run_the_module_ignore_signals_import_no_jax_and_end_with_their_pipe():
  settings = data.Settings.from_config(train_fixtures.common_config(pp=dict(crop=CROP)))
  pool = decode_workers.Pool((settings, "bytes", True), 1)
  (pid,) = (w.process.pid for w in pool._workers)
  time.sleep(1.0)  # started and waiting for tasks
  with open(f"/proc/{pid}/cmdline") as f:
    assert f.read().split("\0")[1:3] == ["-m", "vit_jax.data.decode_worker"]
  for sig in (signal.SIGINT, signal.SIGTERM):
    os.kill(pid, sig)
  time.sleep(0.2)
  with open(f"/proc/{pid}/maps") as f:
    maps = f.read()
  assert "jaxlib" not in maps  # the package's import (`import vit_jax`) imports no JAX
  assert pool._workers[0].process.poll() is None  # alive after SIGINT and SIGTERM
  pool.close()
  assert not os.path.exists(f"/proc/{pid}/status") or _zombie_or_gone(pid)


def test_a_worker_from_a_checkout_imports_the_checkouts_package(monkeypatch):
  """This repository is no site directory: a worker's PYTHONPATH starts at it (a checkout
  that is on sys.path but not installed still starts its workers)."""
  monkeypatch.setenv("PYTHONPATH", "/elsewhere")
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  assert decode_workers._worker_env()["PYTHONPATH"] == os.pathsep.join([repo, "/elsewhere"])


def test_the_worker_module_started_by_hand_is_one_line(monkeypatch):
  monkeypatch.setattr(decode_worker.sys, "argv", ["decode_worker.py"])
  with pytest.raises(SystemExit) as raised:
    decode_worker.main()
  assert str(raised.value) == (
    "Error: vit_jax.data.decode_worker is started by the input pipeline "
    "(decode_workers.Pool) with its two pipes' file descriptors, not by hand."
  )


def test_bad_values_are_one_clear_error():
  with pytest.raises(errors.ConfigError, match=r"decode_processes=-1 must be >= 0"):
    data.Settings.from_config(train_fixtures.common_config(decode_processes=-1))


def _children() -> set[int]:
  """This process's child processes, from each of its threads' /proc list (Linux)."""
  out = set()
  for task in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{task}/children") as f:
      out |= {int(pid) for pid in f.read().split()}
  return out


def _zombie_or_gone(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] == "Z"
  except OSError:
    return True


def test_shared_memory_a_worker_cannot_open_is_one_error_not_failed_images():
  settings = data.Settings.from_config(train_fixtures.common_config(pp=dict(crop=CROP)))
  pool = decode_workers.Pool((settings, "bytes", True), 1)
  task = ((1, CROP, CROP, 3), [("/proc/no-such-process/fd/3", 0, b"\xff\xd8\xff", 0)])
  try:
    with pytest.raises(errors.UserError, match=r"cannot map the batch's shared memory .*=0"):
      list(pool.map([0], lambda _: task))
  finally:
    pool.close()
