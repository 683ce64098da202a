"""A training run's own use of its folder (the `--workdir` of `vit_jax.main`; the layout:
`vit_jax.infra.paths`): the resume check of `config.json`, its one write, and the lock.

One run trains in a folder at a time: `RunFolder.lock` takes `run.lock` before the run
writes anything, with an exclusive create (O_EXCL locally; on a gs:// bucket an upload the
server refuses when the object exists, `vit_jax.infra.storage.create_exclusive`), so of two runs
that start together exactly one trains. A lock whose process is gone (same host, pid not
running) or whose heartbeat is older than `STALE_SECONDS` (another host that died, e.g. a
preempted VM) is taken over with a warning, on a bucket only if the lock is still the
generation read (two runs taking over one stale lock: one wins). Predict, export and
fewshot only read and take no lock.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from typing import Any, Collection, Iterator, Optional, Sequence

import jax
from absl import logging
from etils import epath

from vit_jax.infra import errors, paths, storage
from vit_jax.infra.paths import HISTORY_FILE, LOCK_FILE
from vit_jax.run import resume_policy
from vit_jax.weights import orbax_steps

# A lock whose heartbeat (refreshed at every log step and save) is older than this is
# stale: its run died on a host that cannot be asked (preempted VMs come back as others).
STALE_SECONDS = 15 * 60


def _differences(saved: Any, current: Any, prefix: str, *, new_keys: bool = True) -> list[str]:
  """`key: old -> new` for each leaf that differs between two JSON trees. With
  ``new_keys=False`` a key the saved tree lacks is no difference: the run was saved
  before the option existed, and a config without it reads as the option's default."""
  if isinstance(saved, dict) and isinstance(current, dict):
    keys = set(saved) | set(current) if new_keys else set(saved)
    return [
      line
      for key in sorted(keys)
      for line in _differences(
        saved.get(key), current.get(key), f"{prefix}.{key}", new_keys=new_keys
      )
    ]
  return [] if saved == current else [f"{prefix}: {saved!r} -> {current!r}"]


# How often, and how far apart, a lock that does not parse is read again: its run may be
# between the lock's exclusive create and its first write.
_LOCK_READS, _LOCK_READ_PAUSE_S = 5, 0.1


def _read_holder(path: epath.Path) -> dict[str, Any]:
  """The lock's holder; a lock still empty or unreadable after `_LOCK_READS` reads (a run
  that just created it, or a damaged file) holds only its file's age as its heartbeat, so
  that it is stale only when as old as a dead run's."""
  for attempt in range(_LOCK_READS):
    try:
      other = json.loads(path.read_text())
      if isinstance(other, dict):
        return other
    except (ValueError, OSError):
      pass
    if attempt + 1 < _LOCK_READS:
      time.sleep(_LOCK_READ_PAUSE_S)
  try:
    return {"beat": path.stat().mtime}
  except OSError:  # gone meanwhile: its run ended
    return {}


def _running(pid: Any) -> bool:
  """Whether a process ``pid`` runs on this host."""
  if not isinstance(pid, int) or pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except OSError as e:
    return e.errno == errno.EPERM  # exists, owned by another user
  return True


class RunFolder(paths.RunPaths):
  """A run's folder as the training run uses it: resume check, config write, lock."""

  def check_config(self, current: dict[str, Any], *, allowed: Collection[str] = ()) -> None:
    """Compares ``current`` with config.json by `resume_policy` (the keys it records in
    config.json): a change that is an error raises one error naming each changed key with
    both values; a warning is logged. Nothing is written."""
    if not self.has_config():
      return
    saved = self.read_config()
    refused, warned = [], []
    for rule in resume_policy.rules(resume_policy.CONFIG_JSON):
      lines = _differences(saved.get(rule.key), current.get(rule.key), rule.key, new_keys=False)
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

  def write_config(
    self, current: dict[str, Any], *, step: int, class_names: Optional[Sequence[str]] = None
  ) -> None:
    """Writes config.json when the run starts (process 0; every process may call it),
    atomically; a resumed run keeps the original and appends what it changed, at ``step``,
    to the history (`HISTORY_FILE`). The dataset's ``class_names`` are saved once
    (`CLASS_NAMES_FILE`): the read-only commands print them without opening the data."""
    if jax.process_index() != 0:
      return
    self.root.mkdir(parents=True, exist_ok=True)
    if class_names is not None and not self.class_names_path.exists():
      paths.write_text_atomic(
        self.class_names_path, json.dumps(list(class_names), ensure_ascii=False)
      )
    if not self.has_config():
      paths.write_text_atomic(self.config_path, json.dumps(current, indent=2, sort_keys=True))
      return
    changes = _differences(self.read_config(), current, "config")
    if changes:
      entry = dict(time=time.strftime("%Y-%m-%dT%H:%M:%S"), step=step, changes=changes)
      # Rewritten whole, not appended: a bucket's objects cannot be appended to.
      history = self.root / HISTORY_FILE
      old = history.read_text() if history.exists() else ""
      paths.write_text_atomic(history, old + json.dumps(entry) + "\n")

  @contextlib.contextmanager
  def untouched_unless_saved(self) -> Iterator[None]:
    """Leaves a fresh folder (absent or empty) as it was found when the block fails, is
    interrupted or is stopped before the run saved a step: a run that never trained leaves
    no config.json, events, lock or empty checkpoints/ behind (and no failed setting in a
    config.json that a later run would resume). Only a run that took the lock cleans up:
    one refused by another run's lock leaves that run's files alone."""
    existed = self.root.exists()
    empty = not existed or (self.root.is_dir() and not any(self.root.iterdir()))
    fresh = jax.process_index() == 0 and empty
    try:
      yield
    except BaseException:
      locked = getattr(self, "_lock_holder", None) is not None
      if fresh and locked and not orbax_steps.finalized_steps(self.checkpoints):
        if existed:
          for child in self.root.iterdir():
            if child.is_dir():
              child.rmtree()
            else:
              child.unlink()
        elif self.root.exists():
          self.root.rmtree()
        logging.info("Nothing was saved: %s is left as it was.", self.root)
      raise

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
      paths.write_text_atomic(self.root / LOCK_FILE, json.dumps(holder))

  @staticmethod
  def _create(path: epath.Path, holder: dict[str, Any]) -> bool:
    """Creates the lock file; False when it exists."""
    text = json.dumps(holder)
    if storage.is_remote(path):
      return storage.create_exclusive(path, text.encode())
    try:
      fd = os.open(os.fspath(path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w") as f:
      f.write(text)
    return True

  def _take_over_if_stale(self, path: epath.Path, holder: dict[str, Any]) -> None:
    bucket = str(path).startswith("gs://")
    seen = storage.generation(path) if bucket else None
    other = _read_holder(path)
    beat = other.get("beat", other.get("started", 0.0))
    same_host = other.get("host") == socket.gethostname()
    if same_host and _running(other.get("pid")) and other.get("pid") != os.getpid():
      stale = False
    else:
      stale = same_host or time.time() - beat > STALE_SECONDS
    if not stale and "pid" not in other:  # a run that just created it, or a damaged file
      raise errors.WorkdirInUseError(
        f"--workdir={self.root} is in use: its lock {path} is being written by the run that "
        f"took it. Wait for that run or stop it, or use another --workdir; if no run uses "
        f"the folder, delete {path}."
      )
    if not stale:
      since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(other.get("started", 0)))
      raise errors.WorkdirInUseError(
        f"--workdir={self.root} is in use by the run of pid {other.get('pid')} on host "
        f"{other.get('host')} (started {since}; lock {path}). Wait for it or stop it, or use "
        f"another --workdir; if that run is gone, delete {path}."
      )
    text = json.dumps(holder)
    if bucket:  # only if the lock is still the one read (or, if it went meanwhile, absent)
      data = text.encode()
      if not (
        storage.take_over(path, data, seen) if seen else storage.create_exclusive(path, data)
      ):
        raise errors.WorkdirInUseError(
          f"--workdir={self.root} was just taken by another run that found its stale lock "
          f"{path} at the same time. Wait for it or stop it, or use another --workdir."
        )
    else:
      paths.write_text_atomic(path, text)
    logging.warning("Took over the stale lock %s of a run that is gone: %s.", path, other)
