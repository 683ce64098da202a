"""The main job: `python -m vit_jax.main --config=configs/<file>.py[:arg] --workdir=DIR`.

`--config.key=value` overrides any config field; an unknown key is an error listing the
closest valid keys. Distributed start-up comes first (see
`vit_jax.infra.distributed.initialize_distributed`).

Logging and errors as for every command (`vit_jax.cli`): an error the user can cause
prints one line and exits with status 2. SIGTERM (preemption) or SIGINT (Ctrl-C) saves the
step in flight and exits with 143 or 130 (`vit_jax.run.preemption`); running the command
again resumes. `main(argv)` is the whole job, callable in-process; it returns the exit status.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Sequence

import jax
import ml_collections
from absl import flags, logging

from vit_jax import cli
from vit_jax.infra import distributed, errors

_CACHE_MAX_BYTES = 2 * 2**30


def _define_flags(flag_values: flags.FlagValues, argv: Sequence[str]) -> dict[str, Any]:
  """The job's flags on ``flag_values``."""
  holders = dict(
    config=cli.define_config_flags(
      flag_values,
      argv,
      "Experiment config file, e.g. configs/quickstart.py or configs/vit.py:b16,cifar10.",
    ),
    workdir=flags.DEFINE_string(
      "workdir",
      None,
      "Where checkpoints, TensorBoard events and config.json go; an existing run there is resumed.",
      flag_values=flag_values,
    ),
    coordinator_address=flags.DEFINE_string(
      "coordinator_address",
      None,
      "host:port of process 0 for a multi-process run.",
      flag_values=flag_values,
    ),
    num_processes=flags.DEFINE_integer(
      "num_processes", None, "Processes in a multi-process run.", flag_values=flag_values
    ),
    process_id=flags.DEFINE_integer(
      "process_id", None, "This process's index in the run.", flag_values=flag_values
    ),
    initialization_timeout=flags.DEFINE_integer(
      "initialization_timeout",
      None,
      "Seconds to wait for every process to join.",
      flag_values=flag_values,
    ),
    heartbeat_timeout=flags.DEFINE_integer(
      "heartbeat_timeout",
      None,
      "Seconds after which a silent (dead) process ends the "
      "run with an error on every other process (JAX's default: 100).",
      flag_values=flag_values,
    ),
  )
  return holders


def _parse(argv: Sequence[str]) -> dict[str, Any]:
  """The flag values; a `CommandLineError` for a bad command line."""
  flag_values = cli.new_flag_values()
  holders = _define_flags(flag_values, argv)
  values = cli.parse_command_flags(flag_values, argv, holders, ("config", "workdir"))
  if not isinstance(values["config"], ml_collections.ConfigDict):
    try:  # config_flags keeps a failed load for the first use of the config
      values["config"].to_dict()
    except Exception as e:  # pylint: disable=broad-except
      raise errors.CommandLineError(f"Cannot load the config file: {cli.last_line(str(e))}") from e
  return values


def _enable_compilation_cache() -> None:
  """Keeps compiled XLA programs on disk, so that a rerun skips their compilation.

  Programs that took at least a second to compile are kept (JAX's
  ``jax_persistent_cache_min_compile_time_secs``). JAX keys each entry by the program, its
  compile options, the devices and the JAX/XLA versions: a changed config or model compiles
  anew. The directory is ``$XDG_CACHE_HOME/vit_jax/xla`` (default ``~/.cache/vit_jax/xla``),
  bounded at `_CACHE_MAX_BYTES` (least recently used entries go first);
  ``JAX_COMPILATION_CACHE_DIR`` chooses another one and ``JAX_ENABLE_COMPILATION_CACHE=false``
  turns it off.
  """
  if jax.config.jax_compilation_cache_dir:  # the user's choice
    return
  cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  jax.config.update("jax_compilation_cache_dir", os.path.join(cache_home, "vit_jax", "xla"))
  jax.config.update("jax_compilation_cache_max_size", _CACHE_MAX_BYTES)


def _train(values: dict[str, Any]) -> int:
  """Trains and evaluates the parsed command line's config in its workdir; the status
  (128 + the signal's number when SIGTERM or SIGINT stopped the run after saving)."""
  config, workdir = values["config"], values["workdir"]
  distributed.initialize_distributed(
    values["coordinator_address"],
    values["num_processes"],
    values["process_id"],
    values["initialization_timeout"],
    values["heartbeat_timeout"],
  )
  # Imported after start-up: nothing may touch JAX's backends before it.
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  from vit_jax import run as run_lib  # pylint: disable=g-import-not-at-top
  from vit_jax.models import backend_defaults  # pylint: disable=g-import-not-at-top
  from vit_jax.run import preemption  # pylint: disable=g-import-not-at-top

  # The run's first line: the attention and dtype it computes with, and why (the resolver
  # applies the same choice).
  choice = backend_defaults.choose(
    models.model_settings(config.model), backend_defaults.platform(jax.devices())
  )
  logging.info("%s", choice.describe())

  try:
    metrics = run_lib.train_and_evaluate(config, workdir)
  except KeyboardInterrupt:  # Ctrl-C before the run's own signal handling (start-up)
    logging.warning("Interrupted while starting; the workdir %s is left as it was.", workdir)
    return 128 + signal.SIGINT
  except preemption.Stopped as e:  # saved
    logging.warning("%s", e)
    # The command leaves with os._exit (`cli.exit_with`): leave the cluster first, all
    # processes together (a coordinator gone early would abort the others).
    jax.distributed.shutdown()
    return e.status
  logging.info("Final metrics: %s", {k: round(v, 5) for k, v in metrics.items()})
  return 0


def main(argv: Sequence[str]) -> int:
  """Parses ``argv`` (argv[0]: the program), trains and evaluates; the exit status."""
  return cli.run_command(argv, _parse, _train, context=lambda v: (v["workdir"], v["config"]))


if __name__ == "__main__":
  _enable_compilation_cache()  # the command's; `main` in-process leaves JAX's config alone
  cli.exit_with(main(sys.argv))
