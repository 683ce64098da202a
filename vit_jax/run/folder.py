"""The one place that knows a run's folder layout (the `--workdir` of `vit_jax.main`):

    <root>/config.json            the run's config, written once, by the run that starts it
    <root>/config_history.jsonl   changes a resumed run was allowed to make, one JSON a line
    <root>/checkpoints/<step>/    Orbax steps (`vit_jax.run.checkpoints`)
    <root>/tensorboard/           TensorBoard events (`vit_jax.run.progress`)
    <root>/run.lock               the training process's host, pid, start and last beat

One run trains in a folder at a time: `RunFolder.lock` takes `run.lock` before the run
writes anything (created with O_EXCL locally; on a bucket, where there is no exclusive
create, written after checking it is absent, so two starts within the same second can both
pass). A lock whose process is gone (same host, pid not running) or whose heartbeat is
older than `STALE_SECONDS` (another host that died, e.g. a preempted VM) is taken over
with a warning. Predict, export and fewshot only read and take no lock.

A run is found from any path inside it (the root, `checkpoints/` or a step folder), given
as a local path, a `file://` URL, an `epath.Path` or a `gs://` URL; every read and write
goes through `epath`/`tf.io.gfile`, so buckets work like local folders.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from typing import Any, Collection, Iterator, Optional, Union

import jax
from absl import logging
from etils import epath

from vit_jax import errors
from vit_jax.run import resume_policy

CONFIG_FILE = "config.json"
HISTORY_FILE = "config_history.jsonl"
CHECKPOINTS = "checkpoints"
EVENTS = "tensorboard"
LOCK_FILE = "run.lock"
# A lock whose heartbeat (refreshed at every log step and save) is older than this is
# stale: its run died on a host that cannot be asked (preempted VMs come back as others).
STALE_SECONDS = 15 * 60
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


def _running(pid: Any) -> bool:
  """Whether a process ``pid`` runs on this host."""
  if not isinstance(pid, int) or pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except OSError as e:
    return e.errno == errno.EPERM  # exists, owned by another user
  return True


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

  def check_config(self, current: dict[str, Any], *, allowed: Collection[str] = ()) -> None:
    """Compares ``current`` with config.json by `resume_policy` (the keys it records in
    config.json): a change that is an error raises one error naming each changed key with
    both values; a warning is logged. Nothing is written."""
    if not self.has_config():
      return
    saved = self.read_config()
    refused, warned = [], []
    for rule in resume_policy.rules(resume_policy.CONFIG_JSON):
      lines = _differences(saved.get(rule.key), current.get(rule.key), rule.key)
      if lines:
        (refused if resume_policy.is_error(rule, allowed) else warned).append((rule.key, lines))
    if refused and self.checkpoints.is_dir():
      details = "; ".join(line for _, lines in refused for line in lines)
      raise errors.ResumeError(
        f"The config's {', '.join(key for key, _ in refused)} differ from the run saved in "
        f"{self.root} ({details}): its checkpoints would not fit. Use a new --workdir, or "
        "put the old values back."
      )
    for _, lines in warned:
      for line in lines:
        logging.warning("Resuming with a changed %s.", line)

  def write_config(self, current: dict[str, Any], *, step: int) -> None:
    """Writes config.json when the run starts (process 0; every process may call it),
    atomically; a resumed run keeps the original and appends what it changed, at ``step``,
    to the history (`HISTORY_FILE`)."""
    if jax.process_index() != 0:
      return
    self.root.mkdir(parents=True, exist_ok=True)
    if not self.has_config():
      tmp = self.root / (CONFIG_FILE + ".tmp")
      tmp.write_text(json.dumps(current, indent=2, sort_keys=True))
      tmp.replace(self.config_path)
      return
    changes = _differences(self.read_config(), current, "config")
    if changes:
      entry = dict(time=time.strftime("%Y-%m-%dT%H:%M:%S"), step=step, changes=changes)
      with (self.root / HISTORY_FILE).open("a") as f:
        f.write(json.dumps(entry) + "\n")

  @contextlib.contextmanager
  def lock(self) -> Iterator[None]:
    """Holds `LOCK_FILE` while the run trains (process 0 takes it for all processes)."""
    if jax.process_index() != 0:
      yield
      return
    path = self.root / LOCK_FILE
    self.root.mkdir(parents=True, exist_ok=True)
    holder = dict(host=socket.gethostname(), pid=os.getpid(), started=time.time())
    if not self._create(path, holder):
      self._take_over_if_stale(path, holder)
    self._lock_holder = holder
    try:
      yield
    finally:
      path.unlink(missing_ok=True)

  def heartbeat(self) -> None:
    """Refreshes the lock's heartbeat (process 0; cheap: one small write)."""
    holder = getattr(self, "_lock_holder", None)
    if holder is not None:
      holder["beat"] = time.time()
      (self.root / LOCK_FILE).write_text(json.dumps(holder))

  @staticmethod
  def _create(path: epath.Path, holder: dict[str, Any]) -> bool:
    """Creates the lock file; False when it exists."""
    text = json.dumps(holder)
    if "://" in str(path):  # a bucket: no exclusive create (see the module docstring)
      if path.exists():
        return False
      path.write_text(text)
      return True
    try:
      fd = os.open(os.fspath(path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w") as f:
      f.write(text)
    return True

  def _take_over_if_stale(self, path: epath.Path, holder: dict[str, Any]) -> None:
    try:
      other = json.loads(path.read_text())
    except (ValueError, OSError):
      other = {}
    beat = other.get("beat", other.get("started", 0.0))
    same_host = other.get("host") == socket.gethostname()
    if same_host and _running(other.get("pid")) and other.get("pid") != os.getpid():
      stale = False
    else:
      stale = same_host or time.time() - beat > STALE_SECONDS
    if not stale:
      since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(other.get("started", 0)))
      raise errors.WorkdirInUseError(
        f"--workdir={self.root} is in use by the run of pid {other.get('pid')} on host "
        f"{other.get('host')} (started {since}; lock {path}). Wait for it or stop it, or use "
        f"another --workdir; if that run is gone, delete {path}."
      )
    logging.warning("Taking over the stale lock %s of a run that is gone: %s.", path, other)
    path.write_text(json.dumps(holder))
