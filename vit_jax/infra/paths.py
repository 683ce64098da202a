"""Locations as paths, and where a training run keeps its files.

Every location a user gives (a local path, a ``file://`` URL, an `epath.Path`, a
``gs://`` URL) becomes one absolute `epath.Path` (`as_path`), so buckets work like local
folders. A run's folder (the ``--workdir`` of `vit_jax.main`):

    <root>/config.json            the run's config, written once, by the run that starts it
    <root>/class_names.json       its dataset's class names (a JSON list), written with it
    <root>/config_history.jsonl   changes a resumed run was allowed to make, one JSON a line
    <root>/checkpoints/<step>/    Orbax steps (`vit_jax.weights.orbax_steps` reads them)
    <root>/tensorboard/           TensorBoard events (`vit_jax.run.progress`)
    <root>/run.lock               the training process's host, pid, start and last beat

`RunPaths` names these for every reader of a run (weights, the commands);
`vit_jax.run.folder.RunFolder` adds what only the training run does (lock, config writes).
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Union

from etils import epath

from vit_jax.infra import errors, input_files, storage

CONFIG_FILE = "config.json"
CLASS_NAMES_FILE = "class_names.json"
HISTORY_FILE = "config_history.jsonl"
CHECKPOINTS = "checkpoints"
EVENTS = "tensorboard"
LOCK_FILE = "run.lock"
_FILE_URL = "file://"

Location = Union[str, os.PathLike]


def as_path(location: Location) -> epath.Path:
  """``location`` as an absolute `epath.Path`: a `file://` URL becomes its local path, and a
  URL such as gs://bucket/dir is kept as it is."""
  if isinstance(location, epath.Path) and not storage.is_remote(location):
    return location
  text = os.fspath(location)
  if text.startswith(_FILE_URL):
    text = text[len(_FILE_URL) :]
  if "://" not in text:
    return epath.Path(os.path.abspath(text))
  storage.configure()  # before Orbax makes its own epath.Path of it
  return epath.Path(text)


def write_text_atomic(path: epath.Path, text: str) -> None:
  """Writes ``text`` to ``path`` so that a reader sees the old file or the new one, never
  a part: locally a temporary file renamed over it; on a bucket one upload (an object
  appears whole, and a bucket has no rename). The temporary file is the writing process's
  own, so two processes writing one path never share it."""
  if storage.is_remote(path):
    path.write_text(text)
    return
  tmp = path.parent / f"{path.name}.{os.getpid()}.tmp"
  tmp.write_text(text)
  tmp.replace(path)


class RunPaths:
  """A run's root folder and the paths inside it."""

  def __init__(self, root: Location):
    self.root = as_path(root)

  @classmethod
  def containing(cls, location: Location) -> Optional["RunPaths"]:
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

  @property
  def class_names_path(self) -> epath.Path:
    return self.root / CLASS_NAMES_FILE

  def has_config(self) -> bool:
    return self.config_path.exists()

  def _check_file(self, path: epath.Path) -> None:
    """A local file of the run must be a regular file within `input_files.MAX_TEXT_BYTES`
    before it is read (a FIFO would block, a huge file fill memory)."""
    if input_files.is_local(os.fspath(path)):
      input_files.regular_file(
        os.fspath(path), input_files.MAX_TEXT_BYTES, what="run file", error=errors.ResumeError
      )

  def read_class_names(self) -> Optional[list[str]]:
    """The class names the run saved; None for a run that saved none (made before runs
    saved them, or a dataset without names)."""
    path = self.class_names_path
    if not path.exists():
      return None
    self._check_file(path)
    try:
      names = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
      names = e
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
      raise errors.CheckpointError(
        f"{path} is not a JSON list of class names ({str(names)[:100]}): fix it, move it "
        "away, or pass --labels."
      )
    return names

  def read_config(self) -> dict[str, Any]:
    """The JSON config the run saved; an unreadable one is an error naming the file."""
    path = self.config_path
    self._check_file(path)
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
