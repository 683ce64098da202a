"""Checks of a run's loop settings and of the workdir's `config.json` before the run writes
anything, and the writing of that `config.json` once they pass."""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections
import tensorflow as tf
from absl import logging

from vit_jax import errors

# Loop settings: the smallest value each may take.
_MINIMUM = {
  "total_steps": 0,
  "log_every": 1,
  "eval_every": 1,
  "checkpoint_every": 1,
  "keep_checkpoints": 1,
}


def check_loop(config: ml_collections.ConfigDict) -> None:
  """Step counts and intervals are whole numbers in range; config.pretrained exists."""
  for key, low in _MINIMUM.items():
    value = config[key]
    if not isinstance(value, int) or value < low:
      raise errors.ConfigError(f"config.{key}={value!r} must be an integer >= {low}.")
  if config.pretrained and not tf.io.gfile.exists(config.pretrained):
    raise errors.MissingError(
      f"config.pretrained={config.pretrained!r} does not exist: give an official .npz file "
      "or a run's <workdir>/checkpoints folder."
    )


def check_evaluate_only(config: ml_collections.ConfigDict, *, resumable: bool) -> None:
  """``total_steps=0`` (evaluate only) needs weights to evaluate: ``config.pretrained`` or a
  step of the run in the workdir (``resumable``)."""
  if config.total_steps == 0 and not config.pretrained and not resumable:
    raise errors.ConfigError(
      "config.total_steps=0 only evaluates, but there is nothing to evaluate: no "
      "config.pretrained and no checkpoint in the workdir (it would evaluate a random "
      "initialization). Set config.pretrained=<.npz or <workdir>/checkpoints>, or "
      "config.total_steps > 0 to train."
    )


def read_run_config(path: str) -> dict[str, Any]:
  """The JSON config a run saved at ``path``; an unreadable one is an error naming it."""
  try:
    with tf.io.gfile.GFile(path) as f:
      saved = json.load(f)
  except (ValueError, UnicodeDecodeError, tf.errors.OpError) as e:
    raise errors.ResumeError(
      f"{path} is not a readable run config ({type(e).__name__}: {e}). Fix it, or move it "
      "away to resume with this config (the checkpoints stay)."
    ) from e
  if not isinstance(saved, dict):
    raise errors.ResumeError(
      f"{path} holds a JSON {type(saved).__name__}, not a run config (an object). Fix it, "
      "or move it away to resume with this config (the checkpoints stay)."
    )
  return saved


def write_or_compare_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes config.json; on resume, a changed model is an error, a changed schedule a warning.

  Every process checks; process 0 writes. Paths go through tf.io.gfile (gs:// works).
  """
  path = os.path.join(workdir, "config.json")
  current = json.loads(config.to_json_best_effort())
  if tf.io.gfile.exists(path):
    saved = read_run_config(path)
    model_keys = ("model", "num_classes", "pp")
    changed = [k for k in model_keys if saved.get(k) != current.get(k)]
    if changed and tf.io.gfile.isdir(os.path.join(workdir, "checkpoints")):
      raise errors.ResumeError(
        f"The config's {', '.join(changed)} differ from the run saved in {workdir}: its "
        "checkpoints would not fit. Use a new --workdir, or put the old values back."
      )
    schedule_keys = ("total_steps", "lr", "optim", "batch", "accum_steps")
    for k in schedule_keys:
      if saved.get(k) != current.get(k):
        logging.warning("Resuming with a changed %s: %s -> %s.", k, saved.get(k), current.get(k))
  if jax.process_index() == 0:
    tmp = path + ".tmp"
    with tf.io.gfile.GFile(tmp, "w") as f:
      json.dump(current, f, indent=2, sort_keys=True)
    tf.io.gfile.rename(tmp, path, overwrite=True)
