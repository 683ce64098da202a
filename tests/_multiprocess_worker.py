"""One process of the multi-process tests (test_multiprocess.py), and their run config.

    python -m tests._multiprocess_worker MODE OUT_DIR DATA_DIR [HEARTBEAT_SECONDS]
    python -m tests._multiprocess_worker main ARGS... [--then ARGS...]...

Distributed settings come from VIT_COORDINATOR_ADDRESS / VIT_NUM_PROCESSES /
VIT_PROCESS_ID (none set: one process) and each process's devices from XLA_FLAGS.
MODE:
  train      for each strategy, `train_and_evaluate` the config below in OUT_DIR/<strategy>;
             then restore every final checkpoint, gather its parameters to the host
             (`process_allgather`), read them with `read_params`, and evaluate them as
             `config.pretrained` of an FSDP run. Process 0 writes OUT_DIR/results.npz.
  reference  the same runs and restores (not the `config.pretrained` one), plus an
             uninterrupted run of RESUME_STEPS steps (RESUME_STRATEGY).
  die        trains (in OUT_DIR/die); process 1 exits (status 3) after 2 steps. The others
             must abort.
  train,die  train, a line TRAINED, then die, in the same processes (a fresh Python
             costs seconds of imports): a run whose process dies after runs that ended.
  main       the main job, as `python -m vit_jax.main ARGS` runs it; with ``--then``, one
             job after another in this process (one `jax.distributed` start, the first
             job's), each but the last through `vit_jax.main.main`, a line `RUN_END`
             after it (the worker exits with a job's status other than 0 at once), the last
             as the command runs it, its exit status the process's.
Every process writes the programs it compiles into the session's compilation cache
(`_cache_from_every_process`), for the process of its number in the launches after it.

`get_config` makes this file a config for the main job as well:
`python -m vit_jax.main --config=tests/_multiprocess_worker.py:fsdp ...`.
"""

from __future__ import annotations

import json
import os
import runpy
import sys

import ml_collections

STRATEGIES = {  # partitioning -> mesh over 4 devices (2 processes x 2, or 1 x 4)
  "data_parallel": (("data", 4), ("model", 1)),
  "fsdp": (("data", 4), ("model", 1)),
  "tensor_parallel": (("data", 2), ("model", 2)),
}
TRAINED = "tests._multiprocess_worker: trained"  # `train,die` between the modes
STEPS = 4  # Steps of the first runs; their last checkpoint is resumed to RESUME_STEPS.
RESUME_STEPS = 6
RESUME_STRATEGY = "fsdp"
THEN = "--then"  # Between the jobs of one `main` launch.
RUN_END = "tests._multiprocess_worker: job {} of {} exited with status {}"


def get_config(strategy: str = "data_parallel") -> ml_collections.ConfigDict:
  """The `testing` ViT at 8x8 on digits, SGD at a constant rate (no dependence on
  total_steps, so a resumed longer run equals a straight one)."""
  from configs import quickstart  # pylint: disable=g-import-not-at-top
  from vit_jax.models import get_model_config  # pylint: disable=g-import-not-at-top

  if strategy not in STRATEGIES:
    raise ValueError(f"Unknown strategy {strategy!r}; use one of {list(STRATEGIES)}.")
  config = quickstart.get_config()
  config.model = get_model_config("testing")
  config.pp.crop = 8
  config.batch = 16
  config.batch_eval = 16
  # 101 test examples: the processes' shares differ (50 and 51), the last batch is padded.
  config.test_split = "test[:101]"
  config.shuffle_buffer = 64  # tfds windows of 64 // 16 = 4 examples per lane.
  # Decoded by threads: no worker processes started for each split of each run (the
  # batches are the workers', tests/test_decode_workers.py).
  config.decode_processes = 0
  config.optim.name = "sgd"
  config.lr.base = 0.1
  config.lr.warmup_steps = 0
  config.lr.decay = "constant"
  config.total_steps = STEPS
  config.log_every = 1
  config.eval_every = 2
  config.checkpoint_every = 2
  config.mesh = STRATEGIES[strategy]
  config.partitioning = strategy
  return config


def _params_to_host(params) -> dict:
  """Flat {name: numpy} of the whole arrays, on every process."""
  from flax import traverse_util  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  return traverse_util.flatten_dict(multihost_utils.process_allgather(params, tiled=True), sep="/")


def _run(mode: str, out_dir: str, data_dir: str) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import traverse_util  # pylint: disable=g-import-not-at-top

  from tests import train_fixtures  # pylint: disable=g-import-not-at-top
  from vit_jax import data, run  # pylint: disable=g-import-not-at-top
  from vit_jax.run import checkpoints as run_checkpoints  # pylint: disable=g-import-not-at-top
  from vit_jax.weights import orbax_steps

  assert jax.device_count() == 4, jax.devices()

  def config_for(strategy: str, **overrides) -> ml_collections.ConfigDict:
    config = get_config(strategy)
    config.data_dir = data_dir
    for key, value in overrides.items():
      config[key] = value
    return config

  if mode == "train,die":
    _run("train", out_dir, data_dir)
    print(TRAINED, file=sys.stderr, flush=True)
    mode = "die"
  if mode == "die":
    real_iterator = data.train_iterator

    def dies_on_process_1(*args, **kwargs):
      for step, batch in enumerate(real_iterator(*args, **kwargs)):
        if step == 2 and jax.process_index() == 1:
          print("process 1: exiting on purpose", file=sys.stderr, flush=True)
          os._exit(3)  # pylint: disable=protected-access
        yield batch

    data.train_iterator = dies_on_process_1
    run.train_and_evaluate(
      config_for("data_parallel", total_steps=50), os.path.join(out_dir, "die")
    )
    raise AssertionError("Training went on although process 1 died.")

  results, metrics = {}, {}
  runs = [(s, config_for(s)) for s in STRATEGIES]
  if mode == "reference":
    runs.append(
      (f"{RESUME_STRATEGY}_straight", config_for(RESUME_STRATEGY, total_steps=RESUME_STEPS))
    )
  for name, config in runs:
    workdir = os.path.join(out_dir, name)
    metrics[name] = run.train_and_evaluate(config, workdir)
    # Restore the final checkpoint with the run's shardings and gather it.
    trainer = train_fixtures.build_steps(config)
    manager = run_checkpoints.RunCheckpoints(os.path.join(workdir, "checkpoints"))
    try:
      state = manager.restore_latest(trainer.abstract_state)
    finally:
      manager.close()
    metrics[name]["restored_step"] = int(jax.device_get(state.step))
    for key, value in _params_to_host(state.params).items():
      results[f"{name}/params/{key}"] = value
    # read_params, called by every process, gives every process the whole arrays.
    stored = traverse_util.flatten_dict(
      orbax_steps.read_params(os.path.join(workdir, "checkpoints")), sep="/"
    )
    metrics[name]["read_params_max_diff"] = max(
      float(np.max(np.abs(stored[k] - results[f"{name}/params/{k}"]))) for k in stored
    )

  # The data-parallel result as `config.pretrained` of an FSDP run (parameters split over
  # the processes): evaluating it must give the data-parallel run's final evaluation.
  if mode == "train":
    metrics["pretrained"] = run.train_and_evaluate(
      config_for(
        "fsdp", pretrained=os.path.join(out_dir, "data_parallel", "checkpoints"), total_steps=0
      ),
      os.path.join(out_dir, "pretrained"),
    )

  if jax.process_index() == 0:
    np.savez(os.path.join(out_dir, "results.npz"), **results)
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
      json.dump({"processes": jax.process_count(), "metrics": metrics}, f, indent=1)


def _cache_from_every_process() -> None:
  """Lets every process write JAX's persistent compilation cache, not process 0 alone.

  On the CPU a program's cache key differs between the processes (it hashes the topology
  as each process sees it), and JAX writes from process 0 only: process 1 of every later
  launch compiled each program again while process 0 read its own, and came to the
  launch's first collective that much later (gloo waits 30 s, then fails the run). Each
  process writes its own entries here; a JAX whose cache writer differs is left alone."""
  import inspect  # pylint: disable=g-import-not-at-top

  from jax._src import compilation_cache, compiler, config  # pylint: disable=g-import-not-at-top
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top

  # JAX 0.10: _cache_write(cache_key, compile_time_secs, module_name, backend, executable,
  # host_callbacks), which returns at once on a process other than 0.
  writes = getattr(compiler, "_cache_write", None)
  put = getattr(compilation_cache, "put_executable_and_time", None)
  if writes is None or put is None or len(inspect.signature(writes).parameters) != 6:
    return

  def every_process_writes(cache_key, compile_time, module_name, backend, executable, callbacks):
    if jax_distributed.global_state.process_id == 0 or callbacks:  # JAX's own rules
      writes(cache_key, compile_time, module_name, backend, executable, callbacks)
    elif compile_time >= config.persistent_cache_min_compile_time_secs.value:
      put(cache_key, module_name, executable, backend, int(compile_time))

  compiler._cache_write = every_process_writes  # pylint: disable=protected-access


def main(argv: list[str]) -> None:
  _cache_from_every_process()
  if argv[1:2] == ["main"]:
    jobs = [[]]
    for arg in argv[2:]:
      if arg == THEN:
        jobs.append([])
      else:
        jobs[-1].append(arg)
    if len(jobs) > 1:
      from absl import logging  # pylint: disable=g-import-not-at-top

      from vit_jax import main as main_job  # pylint: disable=g-import-not-at-top

      for i, args in enumerate(jobs[:-1]):
        status = main_job.main(["vit_jax.main", *args])
        logging.flush()
        print(RUN_END.format(i + 1, len(jobs), status), file=sys.stderr, flush=True)
        if status:
          os._exit(status)  # pylint: disable=protected-access
      del sys.modules["vit_jax.main"]  # run afresh as __main__ (runpy warns of a copy)
    sys.argv = ["vit_jax.main", *jobs[-1]]
    runpy.run_module("vit_jax.main", run_name="__main__", alter_sys=True)
    return
  mode, out_dir, data_dir = argv[1:4]
  heartbeat = int(argv[4]) if len(argv) > 4 else None
  if mode not in ("train", "reference", "die", "train,die"):
    raise ValueError(f"Unknown mode {mode!r}; use train, reference, die, train,die or main.")
  from absl import logging  # pylint: disable=g-import-not-at-top

  from vit_jax.infra import distributed  # pylint: disable=g-import-not-at-top

  logging.set_verbosity(logging.INFO)  # Progress lines with times, for failure messages.
  distributed.initialize_distributed(initialization_timeout=60, heartbeat_timeout=heartbeat)
  _run(mode, out_dir, data_dir)


if __name__ == "__main__":
  main(sys.argv)
