"""The one place that knows a run's folder layout (the `--workdir` of `vit_jax.main`):

    <root>/config.json            the run's config, written once it has passed its checks
    <root>/checkpoints/<step>/    Orbax steps (`vit_jax.run.checkpoints`)
    <root>/tensorboard/           TensorBoard events (`vit_jax.run.progress`)

A run is found from any path inside it (the root, `checkpoints/` or a step folder), given
as a local path, a `file://` URL, an `epath.Path` or a `gs://` URL; every read and write
goes through `epath`/`tf.io.gfile`, so buckets work like local folders.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Union

import jax
from absl import logging
from etils import epath

from vit_jax import errors

CONFIG_FILE = "config.json"
CHECKPOINTS = "checkpoints"
EVENTS = "tensorboard"
# Config sections a resumed run must keep (its checkpoints hold this model), and those
# that may change with a warning.
_MODEL_KEYS = ("model", "num_classes", "pp")
_SCHEDULE_KEYS = ("total_steps", "lr", "optim", "batch", "accum_steps")
_FILE_URL = "file://"

Location = Union[str, os.PathLike]


def as_path(location: Location) -> epath.Path:
  """``location`` as an absolute `epath.Path`: a `file://` URL becomes its local path, and a
  URL such as gs://bucket/dir is kept as it is."""
  if isinstance(location, epath.Path):
    return location
  text = os.fspath(location)
  if text.startswith(_FILE_URL):
    text = text[len(_FILE_URL) :]
  return epath.Path(text if "://" in text else os.path.abspath(text))


def _differences(saved: Any, current: Any, prefix: str) -> list[str]:
  """`key: old -> new` for each leaf that differs between two JSON trees."""
  if isinstance(saved, dict) and isinstance(current, dict):
    return [
      line
      for key in sorted(set(saved) | set(current))
      for line in _differences(saved.get(key), current.get(key), f"{prefix}.{key}")
    ]
  return [] if saved == current else [f"{prefix}: {saved!r} -> {current!r}"]


class RunFolder:
  """A run's root folder and the paths inside it."""

  def __init__(self, root: Location):
    self.root = as_path(root)

  @classmethod
  def containing(cls, location: Location) -> Optional["RunFolder"]:
    """The run that ``location`` (its root, `checkpoints/` or a step folder) belongs to:
    the nearest of it and its two parents with a `config.json`; None when there is none."""
    path = as_path(location)
    for candidate in (path, path.parent, path.parent.parent):
      if (candidate / CONFIG_FILE).is_file():
        return cls(candidate)
    return None

  @property
  def config_path(self) -> epath.Path:
    return self.root / CONFIG_FILE

  @property
  def checkpoints(self) -> epath.Path:
    return self.root / CHECKPOINTS

  @property
  def events(self) -> str:
    return os.fspath(self.root / EVENTS)

  def checkpoint_source(self, location: Location) -> epath.Path:
    """What to read parameters from for ``location`` inside this run: the step folder or
    `checkpoints/` it names, else this run's `checkpoints/` (its newest step)."""
    path = as_path(location)
    return self.checkpoints if path == self.root else path

  def has_config(self) -> bool:
    return self.config_path.exists()

  def read_config(self) -> dict[str, Any]:
    """The JSON config the run saved; an unreadable one is an error naming the file."""
    path = self.config_path
    try:
      saved = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError, OSError) as e:
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

  def check_config(self, current: dict[str, Any]) -> None:
    """A resume that changes the model is an error naming each changed key with both
    values; a changed schedule is a warning. Nothing is written."""
    if not self.has_config():
      return
    saved = self.read_config()
    changed = {k: _differences(saved.get(k), current.get(k), k) for k in _MODEL_KEYS}
    changed = {k: lines for k, lines in changed.items() if lines}
    if changed and self.checkpoints.is_dir():
      details = "; ".join(line for lines in changed.values() for line in lines)
      raise errors.ResumeError(
        f"The config's {', '.join(changed)} differ from the run saved in {self.root} "
        f"({details}): its checkpoints would not fit. Use a new --workdir, or put the old "
        "values back."
      )
    for key in _SCHEDULE_KEYS:
      for line in _differences(saved.get(key), current.get(key), key):
        logging.warning("Resuming with a changed %s.", line)

  def write_config(self, current: dict[str, Any]) -> None:
    """Writes config.json (process 0; every process may call it), atomically."""
    if jax.process_index() != 0:
      return
    self.root.mkdir(parents=True, exist_ok=True)
    tmp = self.root / (CONFIG_FILE + ".tmp")
    tmp.write_text(json.dumps(current, indent=2, sort_keys=True))
    tmp.replace(self.config_path)
