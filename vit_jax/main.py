"""The main job: `python -m vit_jax.main --config=configs/<file>.py[:arg] --workdir=DIR`.

`--config.key=value` overrides any config field; an unknown key is an error. Distributed
start-up comes first (see `vit_jax.distributed.initialize_distributed`).
"""
import logging as std_logging

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from vit_jax import distributed

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file, e.g. configs/quickstart.py or configs/vit.py:b16,cifar10.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints, TensorBoard events and "
                               "config.json go; an existing run there is resumed.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0 for a multi-process run.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in a multi-process run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in the run.")
_INIT_TIMEOUT = flags.DEFINE_integer("initialization_timeout", None,
                                     "Seconds to wait for every process to join.")
_HEARTBEAT_TIMEOUT = flags.DEFINE_integer(
    "heartbeat_timeout", None, "Seconds after which a silent (dead) process ends the run "
    "with an error on every other process (JAX's default: 100).")
flags.mark_flags_as_required(["config", "workdir"])


def _quiet_orbax(record) -> bool:
  """Keeps Orbax's per-save INFO chatter out of the progress lines (warnings still show)."""
  return record.levelno >= std_logging.WARNING or "orbax" not in record.pathname


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.get_absl_handler().addFilter(_quiet_orbax)
  distributed.initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value,
                                     _PROCESS_ID.value, _INIT_TIMEOUT.value,
                                     _HEARTBEAT_TIMEOUT.value)
  # Imported after start-up: nothing may touch JAX's backends before it.
  from vit_jax import train  # pylint: disable=g-import-not-at-top
  metrics = train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  logging.info("Final metrics: %s", {k: round(v, 5) for k, v in metrics.items()})


if __name__ == "__main__":
  app.run(main)
