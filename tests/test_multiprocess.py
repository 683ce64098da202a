"""Two processes x 2 fake CPU devices on 127.0.0.1 train, checkpoint, resume and fail
like one process with 4 devices (issue 6).

One module fixture runs everything, two launches at a time (2 cores); a fresh Python
costs seconds of imports, a run in a started one far less, so each launch runs several:
  1. `_multiprocess_worker train,die` in 2 processes (distributed settings from VIT_* env
     vars) beside `_multiprocess_worker reference` in 1 process with 4 devices: each
     partitioning strategy trains 4 steps on digits, evaluates on a split the processes
     share unevenly, restores and gathers its checkpoint, and an FSDP run evaluates the
     data-parallel checkpoint as `config.pretrained`. Then the 2 processes start a run
     whose process 1 dies.
  2. Once both processes trained (beside that dying run), 2 processes (distributed
     settings from flags) run three main jobs one after another (`_multiprocess_worker
     main ... --then ...`): a copy of the 2-process FSDP run resumed to step 6, the same
     resume with its workdir on a bucket, and a job whose process 1 gets SIGTERM at step
     10 (their programs are the first launch's, read from the compilation cache).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Optional

import numpy as np
import pytest
from flax import traverse_util

from tests import _multiprocess_worker as worker
from tests import fresh_python
from vit_jax import data
from vit_jax.infra import storage
from vit_jax.weights import orbax_steps

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH_TIMEOUT = 480  # Seconds for a pair of launches (2 shared cores: compiles are slow).
HEARTBEAT = 10  # Seconds of silence after which a process counts as dead.
DEATH_NOTICED_WITHIN = 90  # Seconds from the death to the survivor's exit (slack: load).
ATOL = 1e-5


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(devices: int, **extra: str) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if not k.startswith("VIT_")}
  env.update(
    XLA_FLAGS=fresh_python.xla_flags(devices),
    JAX_PLATFORMS="cpu",
    TF_CPP_MIN_LOG_LEVEL="3",
    PYTHONPATH=REPO,
    **extra,
  )
  return env


class _Launch:
  """Processes started together. Output goes to files: a full pipe would block them."""

  def __init__(self, name: str, log_dir: str, commands: list[tuple[list[str], dict]]):
    self.name = name
    self.start = time.monotonic()
    self.logs = [os.path.join(log_dir, f"{name}.{i}.log") for i in range(len(commands))]
    self.procs = []
    for (cmd, env), log in zip(commands, self.logs):
      with open(log, "w") as f:
        self.procs.append(
          subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
        )
    self.ended: list[Optional[float]] = [None] * len(commands)  # Seconds after start.

  def poll(self) -> bool:
    """Notes exit times; True when every process has ended."""
    for i, proc in enumerate(self.procs):
      if self.ended[i] is None and proc.poll() is not None:
        self.ended[i] = time.monotonic() - self.start
    return all(t is not None for t in self.ended)

  def kill(self) -> None:
    for proc in self.procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()

  @property
  def returncodes(self) -> list[Optional[int]]:
    """Exit statuses; None for a process killed at the deadline."""
    return [p.returncode if t is not None else None for p, t in zip(self.procs, self.ended)]

  def output(self, i: int, chars: int = 4000) -> str:
    with open(self.logs[i], errors="replace") as f:
      return f.read()[-chars:]

  def job_output(self, i: int, job: int, jobs: int) -> str:
    """Process i's output of job ``job`` (from 1) of ``jobs`` run one after another
    (`_main_jobs`); '' for a job not ended."""
    log = self.output(i, chars=10**8)
    ends = [log.find(worker.RUN_END.format(j, jobs, 0)) for j in range(1, jobs)]
    start, end = ([0, *ends, len(log)])[job - 1 : job + 1]
    return log[start:end] if start >= 0 and end >= 0 else ""

  def check(self) -> None:
    for i, rc in enumerate(self.returncodes):
      assert rc == 0, f"{self.name} process {i}: exit status {rc}\n{self.output(i)}"


def _wait(
  *launches: _Launch, timeout: float = LAUNCH_TIMEOUT, tick=lambda: None, until=lambda: False
) -> None:
  """Waits for every process of the launches, calling ``tick`` between polls, or until
  ``until()``; kills what is left at the deadline."""
  deadline = time.monotonic() + timeout
  while not all([launch.poll() for launch in launches]) and time.monotonic() < deadline:
    if until():
      return
    tick()
    time.sleep(0.2)
  for launch in launches:
    launch.kill()


def _worker(mode: str, out_dir: str, data_dir: str, *extra: str) -> list[str]:
  return [sys.executable, "-m", "tests._multiprocess_worker", mode, out_dir, data_dir, *extra]


def _two_processes(make_cmd, env_for) -> list[tuple[list[str], dict]]:
  return [(make_cmd(i), env_for(i)) for i in range(2)]


def _main_jobs(
  jobs: list[tuple[str, list[str]]], env: Optional[dict[str, str]] = None
) -> list[tuple[list[str], dict]]:
  """`python -m vit_jax.main ARGS --workdir=WORKDIR` for each (WORKDIR, ARGS) of ``jobs``,
  one after another, as processes 0 and 1 of one run, 2 devices each, started through the
  worker (`_multiprocess_worker main`): each reads the programs its process number compiled
  before (`_multiprocess_worker._cache_from_every_process`)."""
  port = _free_port()

  def command(i: int) -> list[str]:
    cmd = [sys.executable, "-m", "tests._multiprocess_worker", "main"]
    for n, (workdir, args) in enumerate(jobs):
      cmd += [worker.THEN] if n else []
      cmd += [
        *args,
        f"--workdir={workdir}",
        f"--coordinator_address=127.0.0.1:{port}",
        "--num_processes=2",
        f"--process_id={i}",
        "--initialization_timeout=60",
        "--heartbeat_timeout=60",
      ]
    return cmd

  return _two_processes(command, lambda i: _env(2, **(env or {})))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, digits_dir, gcs_server):
  root = str(tmp_path_factory.mktemp("multiprocess"))
  two, one = os.path.join(root, "two"), os.path.join(root, "one")
  os.makedirs(two)
  os.makedirs(one)
  config = worker.get_config()
  config.data_dir = digits_dir
  data.dataset_info(config)  # Builds digits once, before the processes read it.

  port = _free_port()
  train = _Launch(
    "train",
    root,
    _two_processes(
      lambda i: _worker("train,die", two, digits_dir, str(HEARTBEAT)),
      lambda i: _env(
        2, VIT_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", VIT_NUM_PROCESSES="2", VIT_PROCESS_ID=str(i)
      ),
    ),
  )
  reference = _Launch("reference", root, [(_worker("reference", one, digits_dir), _env(4))])

  def trained() -> bool:
    return all(worker.TRAINED in train.output(i, chars=10**8) for i in range(2))

  _wait(train, reference, until=lambda: reference.poll() and trained())
  for i in range(2):
    assert trained(), f"train process {i}: exit status {train.returncodes[i]}\n{train.output(i)}"
  reference.check()

  # Resume a copy of the 2-process FSDP run (step 4) to step 6 through the main job.
  resumed = os.path.join(root, "resumed")
  shutil.copytree(os.path.join(two, worker.RESUME_STRATEGY), resumed)
  resume_args = [
    f"--config=tests/_multiprocess_worker.py:{worker.RESUME_STRATEGY}",
    f"--config.data_dir={digits_dir}",
    f"--config.total_steps={worker.RESUME_STEPS}",
  ]
  # The same resume with the workdir on a bucket (a real GCS server): both processes read
  # the step, train and save their shards into it. A step copied from a local folder has
  # no commit marker (a local save is final by its rename): one is added per step, as a
  # save on a bucket writes it last.
  bucket_resumed = gcs_server.make_bucket(f"multiprocess-{os.getpid()}") + "/resumed"
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)
    fs = storage.filesystem(bucket_resumed)
    fs.put(os.path.join(two, worker.RESUME_STRATEGY) + "/", bucket_resumed, recursive=True)
    for step in orbax_steps.finalized_steps(
      os.path.join(two, worker.RESUME_STRATEGY, "checkpoints")
    ):
      fs.pipe_file(f"{bucket_resumed}/checkpoints/{step}/{orbax_steps.COMMIT_MARKER}", b"")
  # JAX's preemption service: process 1 gets SIGTERM once process 0 logged step 10.
  preempted_workdir = os.path.join(root, "preempted")
  preempted_args = [
    "--config=tests/_multiprocess_worker.py:data_parallel",
    f"--config.data_dir={digits_dir}",
    "--config.total_steps=100000",
    "--config.checkpoint_every=100000",
    "--config.eval_every=100000",
    "--config.log_every=5",
  ]
  jobs = _Launch(
    "jobs",
    root,
    _main_jobs(
      [(resumed, resume_args), (bucket_resumed, resume_args), (preempted_workdir, preempted_args)],
      env=gcs_server.env,
    ),
  )
  signalled = []

  def sigterm_at_step_10() -> None:
    if not signalled and "step 10/" in jobs.job_output(0, 3, 3):
      jobs.procs[1].send_signal(signal.SIGTERM)
      signalled.append(True)

  _wait(jobs, train, tick=sigterm_at_step_10)
  for i in range(2):  # the resumes, local and on the bucket, ended well in both processes
    for job in (1, 2):
      assert jobs.job_output(i, job, 3), f"jobs process {i}: job {job} failed\n{jobs.output(i)}"

  def load(out_dir: str) -> tuple[dict, dict]:
    with np.load(os.path.join(out_dir, "results.npz")) as f:
      arrays = dict(f)
    with open(os.path.join(out_dir, "metrics.json")) as f:
      return arrays, json.load(f)

  return dict(
    root=root,
    two=two,
    one=one,
    resumed=resumed,
    bucket_resumed=bucket_resumed,
    results=load(two),
    reference=load(one),
    jobs=jobs,
    die=train,  # its last run
    preempted_workdir=preempted_workdir,
  )


@pytest.mark.parametrize(
  "job_env,deactivated",
  [
    ({}, False),
    ({"SLURM_JOB_ID": "7", "SLURM_LOCALID": "0"}, True),
    ({"OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:1", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, True),
  ],
)
def test_explicit_settings_keep_all_local_devices_inside_a_job(monkeypatch, job_env, deactivated):
  """Inside `srun`/`mpirun`, JAX's own detection would limit each process to the one
  device numbered by its local rank: one GPU per node for one process per node."""
  import jax  # pylint: disable=g-import-not-at-top

  from vit_jax.infra import distributed  # pylint: disable=g-import-not-at-top

  for name in (
    "SLURM_JOB_ID",
    "OMPI_MCA_orte_hnp_uri",
    "VIT_COORDINATOR_ADDRESS",
    "VIT_NUM_PROCESSES",
    "VIT_PROCESS_ID",
  ):
    monkeypatch.delenv(name, raising=False)
  for name, value in job_env.items():
    monkeypatch.setenv(name, value)
  calls = []
  monkeypatch.setattr(distributed, "_initialized", False)
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  distributed.initialize_distributed("10.0.0.1:1234", 2, 1, heartbeat_timeout=30)
  expected = dict(
    coordinator_address="10.0.0.1:1234", num_processes=2, process_id=1, heartbeat_timeout_seconds=30
  )
  if deactivated:
    expected["cluster_detection_method"] = "deactivate"
  assert calls == [expected]


def test_global_train_batches_do_not_depend_on_the_process_count(digits_dir):
  """Rows [p * b, (p + 1) * b) of process p of P, stacked: the same batches for any P,
  also from a resume step; each process's first batch holds distinct examples."""
  from vit_jax.data import dataset, pipeline  # pylint: disable=g-import-not-at-top
  from vit_jax.data import settings as data_settings

  config = worker.get_config()
  config.data_dir = digits_dir
  config.train_split = "train[:200]"  # 16 lanes of 12 or 13 examples: epochs of 13 steps
  ds = dataset.Dataset(data_settings.Settings.from_config(config))

  def global_batches(processes: int, start: int, count: int) -> list[np.ndarray]:
    streams = [
      pipeline.local_train_batches(ds, config.batch // processes, start, p, processes)
      for p in range(processes)
    ]
    return [np.concatenate([next(s)["image"] for s in streams]) for _ in range(count)]

  one = global_batches(1, 0, 20)  # 20 steps of 16: past the end of an epoch (200).
  for processes in (2, 4):
    assert all(np.array_equal(a, b) for a, b in zip(one, global_batches(processes, 0, 20)))
    assert all(np.array_equal(a, b) for a, b in zip(one[14:], global_batches(processes, 14, 6)))
  rows = one[0].reshape(16, -1)
  assert len({r.tobytes() for r in rows}) == 16


def _params(arrays: dict, run: str) -> dict[str, np.ndarray]:
  prefix = f"{run}/params/"
  return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}


def _max_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
  assert sorted(a) == sorted(b)
  return max(float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))) for k in a)


@pytest.mark.parametrize("strategy", list(worker.STRATEGIES))
def test_two_processes_train_like_one(runs, strategy):
  (arrays, info), (ref_arrays, ref_info) = runs["results"], runs["reference"]
  assert (info["processes"], ref_info["processes"]) == (2, 1)
  got, want = info["metrics"][strategy], ref_info["metrics"][strategy]
  assert abs(got["train/loss"] - want["train/loss"]) <= ATOL
  assert _max_diff(_params(arrays, strategy), _params(ref_arrays, strategy)) <= ATOL
  # Evaluation: every example once although the processes hold 50 and 51 of the 101.
  assert got["eval/examples"] == want["eval/examples"] == 101
  assert got["eval/accuracy"] == want["eval/accuracy"]
  assert abs(got["eval/loss"] - want["eval/loss"]) <= ATOL
  # The final checkpoint, restored by both processes with the run's shardings, holds the
  # trained step; read_params gave both processes those same arrays whole.
  assert got["restored_step"] == worker.STEPS
  assert got["read_params_max_diff"] == 0.0


def test_a_checkpoint_of_two_processes_reads_in_one(runs):
  arrays, _ = runs["results"]
  for strategy in worker.STRATEGIES:
    stored = traverse_util.flatten_dict(
      orbax_steps.read_params(
        os.path.join(runs["two"], strategy, "checkpoints", str(worker.STEPS))
      ),
      sep="/",
    )
    assert _max_diff(stored, _params(arrays, strategy)) == 0.0


def test_only_process_zero_writes_events_and_config(runs):
  for strategy in worker.STRATEGIES:
    workdir = os.path.join(runs["two"], strategy)
    events = [
      f
      for f in os.listdir(os.path.join(workdir, "tensorboard"))
      if f.startswith("events.out.tfevents")
    ]
    assert len(events) == 1, events
    with open(os.path.join(workdir, "config.json")) as f:
      assert json.load(f)["partitioning"] == strategy


def test_pretrained_parameters_load_into_fsdp_over_processes(runs):
  _, info = runs["results"]
  loaded, trained = info["metrics"]["pretrained"], info["metrics"]["data_parallel"]
  assert loaded["eval/accuracy"] == trained["eval/accuracy"]
  assert abs(loaded["eval/loss"] - trained["eval/loss"]) <= ATOL


def test_main_resumes_at_the_saved_step_like_an_uninterrupted_run(runs):
  log = runs["jobs"].job_output(0, 1, 3)
  assert f"from step {worker.STEPS} to {worker.RESUME_STEPS}" in log, log[-3000:]
  resumed = traverse_util.flatten_dict(
    orbax_steps.read_params(os.path.join(runs["resumed"], "checkpoints", str(worker.RESUME_STEPS))),
    sep="/",
  )
  straight = _params(runs["reference"][0], f"{worker.RESUME_STRATEGY}_straight")
  assert _max_diff(resumed, straight) <= ATOL


def test_two_processes_resume_and_save_in_one_bucket_workdir(runs, monkeypatch, gcs_server):
  """The resume above with its workdir on a bucket: the same step 6, bit for bit."""
  log = runs["jobs"].job_output(0, 2, 3)
  assert f"from step {worker.STEPS} to {worker.RESUME_STEPS}" in log, log[-3000:]
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)
  on_bucket, local = (
    traverse_util.flatten_dict(
      orbax_steps.read_params(f"{workdir}/checkpoints/{worker.RESUME_STEPS}"), sep="/"
    )
    for workdir in (runs["bucket_resumed"], runs["resumed"])
  )
  assert on_bucket.keys() == local.keys()
  for key in local:
    np.testing.assert_array_equal(on_bucket[key], local[key], err_msg=key)


def test_a_dead_process_ends_the_run_with_an_error(runs):
  die = runs["die"]
  rc_survivor, rc_dead = die.returncodes
  assert rc_dead == 3, die.output(1)
  assert rc_survivor is not None, f"process 0 was still running\n{die.output(0)}"
  assert rc_survivor != 0
  assert die.ended[0] - die.ended[1] < DEATH_NOTICED_WITHIN, die.ended
  log = die.output(0, chars=10**6)
  assert "another task died" in log or "stopped sending heartbeats" in log, log[-4000:]


def test_sigterm_to_one_process_stops_both_at_the_same_saved_step(runs):
  """JAX's preemption service: process 1 gets SIGTERM; both save one agreed step, exit 143."""
  launch = runs["jobs"]  # the last of its jobs
  assert launch.returncodes == [143, 143], [launch.output(i) for i in range(2)]
  saved = orbax_steps.finalized_steps(os.path.join(runs["preempted_workdir"], "checkpoints"))
  assert len(saved) == 1 and saved[0] >= 10, saved
  for i in range(2):
    log = launch.job_output(i, 3, 3)
    assert f"Stopped by SIGTERM at step {saved[0]}: saved" in log, launch.output(i)
