"""Saves and restores a training run (Orbax): asynchronous saves, verified reads, retention.

Not the official ViT weights format: `vit_jax.weights.npz` reads and writes that `.npz`.

Layout: `<workdir>/checkpoints/<step>/{state, meta}`. `state` is the train state
(params, optimizer state, step, rng); `meta` is JSON: the step, a fingerprint of every
array keyed by its path in the state (e.g. "params/head/kernel"), and the identity of the
data the run trains on (see `check_resume`). Orbax stores no checksums, so a flipped byte
would restore silently as a wrong value; every reader recomputes the fingerprints:

* `RunCheckpoints.restore_latest` (resume) moves a step aside only on proven damage
  (`orbax_steps.is_damage`: a fingerprint mismatch, a file of the step missing or
  undecodable, seen on two reads in a row), to `<step>.corrupt-<time>` (never deleted: a
  person may want to look at it), and tries the next older one; the run then writes that
  step again.
* `read_params` (evaluation, fine-tuning, predict, export) raises `CheckpointError` for
  such a step.
* A read that fails for any other reason (a network, timeout or permission error, on a
  cloud bucket the common case) is made again `orbax_steps.READ_ATTEMPTS` times with
  doubling waits, then raises one `StorageError`: every step stays in place, and the same
  command resumes once the storage answers.

Retention keeps the newest ``keep`` steps, but never deletes the newest step known to be
intact (restored, or read back and matched) while the steps after it are unverified: the
newest step is read back first. A step killed mid-save is an ignored
`*.orbax-checkpoint-tmp*` folder. All processes call save and restore together.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Collection, Iterator, Mapping, Optional

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath  # Orbax's path type: local paths and gs:// alike.
from jax.experimental import multihost_utils

from vit_jax.infra import errors
from vit_jax.infra.paths import as_path
from vit_jax.run import resume_policy, save_loop
from vit_jax.weights.orbax_steps import (
  META,
  STATE,
  finalized_steps,
  fingerprint,
  fingerprint_keys,
  first_line,
  read_host,
  read_meta,
  read_with_retries,
  verify,
)


def check_resume(
  directory: str | os.PathLike,
  data: Mapping[str, Any],
  abstract_state: Any,
  *,
  allowed: Collection[str] = (),
) -> bool:
  """Raises ResumeError when the run in ``directory`` does not fit this config.

  ``data``: what this config trains on (`RunSpec.data_identity`: the keys
  `resume_policy` records with each checkpoint); ``abstract_state``: the train state it
  builds. Other arrays (another optimizer or model) are an error; a changed data key is
  what `resume_policy` says, with the switches ``allowed`` on (a change allowed is
  logged). Reads only the newest readable step's meta and changes nothing. Returns
  whether there is a step to resume.
  """
  steps = finalized_steps(directory)
  for step in reversed(steps):
    try:
      meta = read_meta(as_path(directory) / str(step))
    except errors.CheckpointError:
      continue  # damaged: restore_latest moves it aside (a StorageError stops the run)
    saved, wanted = set(meta["fingerprint"]), set(fingerprint_keys(abstract_state))
    if saved != wanted:
      missing, unexpected = sorted(wanted - saved), sorted(saved - wanted)
      raise errors.ResumeError(
        f"Checkpoint step {step} in {directory} holds other arrays than this config's train "
        f"state (missing {len(missing)}, e.g. {missing[:2]}; unexpected {len(unexpected)}, "
        f"e.g. {unexpected[:2]}): config.optim or the model changed. Put the old values "
        "back or use a new --workdir; nothing was changed."
      )
    stored = meta.get("data")
    if not stored:
      break
    resume_policy.check_tokenizer(stored, data, f"{directory} (step {step})")
    changed = [
      rule
      for rule in resume_policy.rules(resume_policy.CHECKPOINT)
      if rule.key in stored and rule.key in data and stored[rule.key] != data[rule.key]
    ]
    refused = [rule for rule in changed if resume_policy.is_error(rule, allowed)]
    if refused:
      what = "; ".join(f"{r.key}: {stored[r.key]!r} -> {data[r.key]!r}" for r in refused)
      switches = sorted({r.switch for r in refused if r.switch})
      fix = (
        f" (or set {' and '.join(f'config.{s}=True' for s in switches)} to go on with the "
        "new data order)"
        if switches
        else ""
      )
      raise errors.ResumeError(
        f"The run in {directory} (step {step}) trained on other data than this config "
        f"({what}). Put the old values back{fix}, or use a new --workdir to start a new "
        "run; nothing was changed."
      )
    for rule in changed:
      logging.warning(
        "Resuming with a changed %s: %r -> %r (config.%s=True).",
        rule.key,
        stored[rule.key],
        data[rule.key],
        rule.switch,
      )
    break
  return bool(steps)


class RunCheckpoints:
  """The checkpoints of one run: asynchronous saves, verified resume, retention."""

  def __init__(
    self,
    directory: str | os.PathLike,
    *,
    keep: int = 3,
    data: Optional[Mapping[str, Any]] = None,
    async_save: bool = True,
  ):
    """``keep``: newest steps kept (>= 1: `vit_jax.run.resolve` checks
    config.keep_checkpoints); ``data``: recorded with each step (`check_resume`)."""
    self.directory = as_path(directory)
    self.keep = keep
    self._data = dict(data or {})
    self._verified: Optional[int] = None  # newest step known intact
    self._state_bytes: Optional[int] = None
    save_loop.drain_before_close()  # a failed save ends in its one error, nothing printed
    options = ocp.CheckpointManagerOptions(
      max_to_keep=None, create=True, enable_async_checkpointing=async_save
    )
    # Explicit handlers: a manager built without them cannot read an empty step folder.
    self._manager = ocp.CheckpointManager(
      self.directory,
      options=options,
      item_handlers={STATE: ocp.StandardCheckpointHandler(), META: ocp.JsonCheckpointHandler()},
    )

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: Any) -> None:
    """Starts an asynchronous save of ``state`` at ``step`` (all processes call it)."""
    self.wait_until_finished()
    self._prune()
    self._state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
    meta = {"step": int(step), "fingerprint": fingerprint(state), "data": self._data}
    with self._save_errors():
      self._manager.save(
        step,
        args=ocp.args.Composite(
          **{STATE: ocp.args.StandardSave(state), META: ocp.args.JsonSave(meta)}
        ),
      )

  def restore_latest(self, abstract_state: Any) -> Optional[Any]:
    """The newest intact step, restored into ``abstract_state``'s structure and shardings.

    Returns None when there is no step. A damaged step is moved aside with a warning; a
    step that cannot be read for another reason raises StorageError, every step kept.
    `check_resume` has checked before that the steps fit this config.
    """
    for step in reversed(self.all_steps()):
      step_dir = self.directory / str(step)
      try:
        state = self._restore_verified(step_dir, abstract_state)
      except errors.CheckpointError as e:
        self._move_aside(step_dir, str(e))
        continue
      self._verified = step
      logging.info("Restored checkpoint step %d from %s.", step, self.directory)
      return state
    return None

  def wait_until_finished(self) -> None:
    with self._save_errors():
      self._manager.wait_until_finished()

  def close(self) -> None:
    """Completes the saves already started, applies retention, and closes the manager."""
    try:
      self.wait_until_finished()
      self._prune()
    finally:
      self._manager.close()

  def _restore_verified(self, step_dir: epath.Path, abstract_state: Any) -> Any:
    saved = read_meta(step_dir)["fingerprint"]
    args = ocp.args.Composite(**{STATE: ocp.args.StandardRestore(abstract_state)})
    restored = read_with_retries(
      step_dir,
      "cannot be read (an incomplete or damaged save)",
      lambda: self._manager.restore(int(step_dir.name), args=args),
    )
    verify(step_dir, saved, restored[STATE])
    return restored[STATE]

  def _move_aside(self, step_dir: epath.Path, problem: str) -> None:
    target = step_dir.parent / f"{step_dir.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"
    if jax.process_index() == 0:
      step_dir.rename(target)
    multihost_utils.sync_global_devices(f"run_checkpoints:moved {step_dir}")
    self._manager.reload()
    logging.warning(
      "%s Moved it aside to %s (not deleted); resuming from an older step, "
      "and this run writes step %s again.",
      problem,
      target,
      step_dir.name,
    )

  def _prune(self) -> None:
    """Deletes steps older than the newest ``keep``, keeping the newest one known intact
    (all of them while the newest cannot be read, damaged or not)."""
    steps = self.all_steps()
    old, kept = steps[: -self.keep], steps[-self.keep :]
    if not old:
      return
    if self._verified not in kept:
      newest = self.directory / str(steps[-1])
      try:
        read_host(newest)
      except (errors.CheckpointError, errors.StorageError) as e:
        logging.warning("%s Keeping the older steps %s.", e, old)
        return
      self._verified = steps[-1]
    for step in old:
      self._manager.delete(step)

  @contextlib.contextmanager
  def _save_errors(self) -> Iterator[None]:
    """Turns a failed save into one error: a full disk into OutOfDiskError with the bytes a
    step needs; any other failure of the storage (a bucket that stopped answering after
    tensorstore's and gcsfs's retries, an I/O error) into StorageError. The step being
    written is incomplete (an Orbax temporary, or on a bucket a step without its commit
    marker), so it is not resumed from; the steps before it are in place."""
    try:
      yield
    except errors.UserError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      if errors.is_out_of_disk(e):
        raise errors.out_of_disk(str(self.directory), self._state_bytes) from e
      raise errors.StorageError(
        f"Saving a checkpoint into {self.directory} failed ({first_line(e)}). The steps "
        "saved before it are in place: check the storage and its credentials, then run the "
        "same command again; it resumes from the newest complete step."
      ) from e
