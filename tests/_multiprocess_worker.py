"""One process of the multi-process tests (test_multiprocess.py), and their run config.

    python -m tests._multiprocess_worker MODE OUT_DIR DATA_DIR [HEARTBEAT_SECONDS]

Distributed settings come from VIT_COORDINATOR_ADDRESS / VIT_NUM_PROCESSES /
VIT_PROCESS_ID (none set: one process) and each process's devices from XLA_FLAGS.
MODE:
  train      for each strategy, `train_and_evaluate` the config below in OUT_DIR/<strategy>;
             then restore every final checkpoint, gather its parameters to the host
             (`process_allgather`), read them with `read_params`, and evaluate them as
             `config.pretrained` of an FSDP run. Process 0 writes OUT_DIR/results.npz.
  reference  the same, plus an uninterrupted run of RESUME_STEPS steps (RESUME_STRATEGY).
  die        trains; process 1 exits (status 3) after 2 steps. The others must abort.

`get_config` makes this file a config for the main job as well:
`python -m vit_jax.main --config=tests/_multiprocess_worker.py:fsdp ...`.
"""

from __future__ import annotations

import json
import os
import sys

import ml_collections

STRATEGIES = {  # partitioning -> mesh over 4 devices (2 processes x 2, or 1 x 4)
  "data_parallel": (("data", 4), ("model", 1)),
  "fsdp": (("data", 4), ("model", 1)),
  "tensor_parallel": (("data", 2), ("model", 2)),
}
STEPS = 4  # Steps of the first runs; their last checkpoint is resumed to RESUME_STEPS.
RESUME_STEPS = 6
RESUME_STRATEGY = "fsdp"


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

  if mode == "die":
    real_iterator = data.train_iterator

    def dies_on_process_1(*args, **kwargs):
      for step, batch in enumerate(real_iterator(*args, **kwargs)):
        if step == 2 and jax.process_index() == 1:
          print("process 1: exiting on purpose", file=sys.stderr, flush=True)
          os._exit(3)  # pylint: disable=protected-access
        yield batch

    data.train_iterator = dies_on_process_1
    run.train_and_evaluate(config_for("data_parallel", total_steps=50), out_dir)
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


def main(argv: list[str]) -> None:
  mode, out_dir, data_dir = argv[1:4]
  heartbeat = int(argv[4]) if len(argv) > 4 else None
  if mode not in ("train", "reference", "die"):
    raise ValueError(f"Unknown mode {mode!r}; use train, reference or die.")
  from absl import logging  # pylint: disable=g-import-not-at-top

  from vit_jax.infra import distributed  # pylint: disable=g-import-not-at-top

  logging.set_verbosity(logging.INFO)  # Progress lines with times, for failure messages.
  distributed.initialize_distributed(initialization_timeout=60, heartbeat_timeout=heartbeat)
  _run(mode, out_dir, data_dir)


if __name__ == "__main__":
  main(sys.argv)
