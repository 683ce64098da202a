"""Checks of a run's loop settings and of the workdir's `config.json`, before anything is
written."""

from __future__ import annotations

import json
from typing import Any

import ml_collections
import tensorflow as tf

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
