"""Saves and restores a training run (Orbax): asynchronous saves, verified reads, retention.

Not the official ViT weights format: `vit_jax.checkpoint` reads and writes that `.npz`.

Layout: `<workdir>/checkpoints/<step>/{state, meta}`. `state` is the train state
(params, optimizer state, step, rng); `meta` is JSON: the step, a fingerprint of every
array keyed by its path in the state (e.g. "params/head/kernel"), and the identity of the
data the run trains on (see `check_resume`). Orbax stores no checksums, so a flipped byte
would restore silently as a wrong value; every reader recomputes the fingerprints:

* `RunCheckpoints.restore_latest` (resume) moves a step that cannot be read or fails its
  fingerprints aside, to `<step>.corrupt-<time>` (never deleted: a person may want to look
  at it), and tries the next older one; the run then writes that step again.
* `read_params` (evaluation, fine-tuning, predict, export) raises `CheckpointError`.

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
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath  # Orbax's path type: local paths and gs:// alike.
from jax.experimental import multihost_utils

from vit_jax import errors
from vit_jax.aliases import Params
from vit_jax.run import resume_policy

_STATE, _META = "state", "meta"
_PARAMS = "params"


def _absolute(path: str | os.PathLike) -> epath.Path:
  """``path`` made absolute; a URL such as gs://bucket/dir is kept as it is."""
  path = os.fspath(path)
  return epath.Path(path if "://" in path else os.path.abspath(path))


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return f"{type(e).__name__}: {text.splitlines()[0][:300] if text else ''}"


@jax.jit
def _leaf_sums(leaves: list[Any]) -> list[jax.Array]:
  """A wrapping uint32 sum of each leaf's bits: any single flipped bit changes it."""

  def leaf_sum(x):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    if x.dtype.itemsize == 4:
      bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    elif x.dtype.itemsize == 2:
      bits = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    else:
      bits = x.astype(jnp.uint32)
    return jnp.sum(bits, dtype=jnp.uint32)

  return [leaf_sum(x) for x in leaves]


def fingerprint_keys(tree: Any) -> list[str]:
  """The key `fingerprint` gives each leaf of ``tree``: its path, e.g. "params/head/kernel"."""
  return [
    jax.tree_util.keystr(path, simple=True, separator="/")
    for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]
  ]


def fingerprint(tree: Any) -> dict[str, int]:
  """{`fingerprint_keys` of each leaf: the sum of its bits}.

  Host (numpy) trees are summed on the CPU: a checkpoint read back for checking needs no
  accelerator memory.
  """
  leaves = jax.tree.leaves(tree)
  if all(isinstance(x, np.ndarray) for x in leaves):
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
      sums = _leaf_sums(leaves)
  else:
    sums = _leaf_sums(leaves)
  return dict(zip(fingerprint_keys(tree), (int(v) for v in jax.device_get(sums))))


def _corrupt(step_dir: epath.Path, problem: str) -> errors.CheckpointError:
  return errors.CheckpointError(f"Checkpoint step {step_dir.name} in {step_dir.parent} {problem}.")


def _read_meta(step_dir: epath.Path) -> dict[str, Any]:
  """The step's meta JSON, with its fingerprints; CheckpointError when it is unreadable."""
  try:
    with ocp.Checkpointer(ocp.JsonCheckpointHandler()) as checkpointer:
      meta = checkpointer.restore(step_dir / _META, args=ocp.args.JsonRestore())
  except Exception as e:  # pylint: disable=broad-except
    raise _corrupt(
      step_dir, f"has no readable {_META} (the arrays' fingerprints): {_first_line(e)}"
    ) from e
  if not isinstance(meta, dict) or not isinstance(meta.get("fingerprint"), dict):
    raise _corrupt(step_dir, f"has no per-array fingerprints in {step_dir / _META}")
  return meta


def _check(step_dir: epath.Path, saved: Mapping[str, int], tree: Any) -> None:
  """Raises CheckpointError when an array of ``tree`` differs from its saved fingerprint."""
  got = fingerprint(tree)
  bad = sorted(k for k, v in got.items() if saved.get(k) != v)
  if bad:
    raise _corrupt(
      step_dir,
      f"is corrupt: {len(bad)} of its {len(got)} arrays differ from "
      f"the fingerprints saved with them (first: {bad[0]}); the files changed "
      "after saving",
    )


def _read_host(step_dir: epath.Path, subtree: Optional[str] = None) -> Any:
  """The step's state (or its ``subtree``) as host numpy arrays, verified."""
  meta = _read_meta(step_dir)
  state_dir = step_dir / _STATE
  try:
    with ocp.PyTreeCheckpointer() as checkpointer:
      # The tree's own metadata (`state/_METADATA`; raises when it is missing). The
      # Checkpointer's `metadata` would also look for a `state/_CHECKPOINT_METADATA`, which a
      # CheckpointManager writes one level up, and warn that it does not exist.
      tree = checkpointer.handler.metadata(state_dir).tree
      item = {subtree: tree[subtree]} if subtree else tree
      as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
      restored = checkpointer.restore(
        state_dir,
        args=ocp.args.PyTreeRestore(
          item=item, restore_args=as_numpy, partial_restore=subtree is not None
        ),
      )
  except Exception as e:  # pylint: disable=broad-except
    raise _corrupt(
      step_dir, f"cannot be read (an incomplete or damaged save): {_first_line(e)}"
    ) from e
  _check(step_dir, meta["fingerprint"], restored)
  return restored[subtree] if subtree else restored


def finalized_steps(directory: str | os.PathLike) -> list[int]:
  """The steps of a `<workdir>/checkpoints` folder whose save completed, ascending."""
  path = _absolute(directory)
  if not path.is_dir():
    return []
  return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit() and (p / _STATE).is_dir())


def read_params(path: str | os.PathLike) -> Params:
  """The verified parameters of a checkpoint as host numpy arrays, in their saved layout.

  ``path``: a `<workdir>/checkpoints` folder (its newest step is read) or a step folder.
  Only the parameters are read, not the optimizer state. A step whose arrays fail their
  fingerprints, or that cannot be read, raises `errors.CheckpointError` naming the step.
  In a multi-process run every process must call it (Orbax's restore waits at a barrier
  for all of them); each gets the whole arrays.
  """
  path = _absolute(path)
  if not path.is_dir():
    raise errors.MissingError(f"No Orbax checkpoint folder at {str(path)!r}: check the path.")
  if (path / _STATE).is_dir():
    step_dir = path
  else:
    steps = finalized_steps(path)
    if not steps:
      raise errors.MissingError(
        f"No finalized Orbax checkpoint step in {str(path)!r}: pass a "
        "`<workdir>/checkpoints` folder or one of its step folders."
      )
    step_dir = path / str(steps[-1])
  try:
    return _read_host(step_dir, _PARAMS)
  except errors.CheckpointError as e:
    older = [s for s in finalized_steps(step_dir.parent) if s < int(step_dir.name)]
    hint = f" Read an older step instead (e.g. {step_dir.parent / str(older[-1])})" if older else ""
    raise errors.CheckpointError(
      f"{e}{hint}; resuming the run moves the damaged step aside and writes it again."
    ) from e


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
      meta = _read_meta(_absolute(directory) / str(step))
    except errors.CheckpointError:
      continue  # restore_latest moves it aside
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
    self.directory = _absolute(directory)
    self.keep = keep
    self._data = dict(data or {})
    self._verified: Optional[int] = None  # newest step known intact
    self._state_bytes: Optional[int] = None
    options = ocp.CheckpointManagerOptions(
      max_to_keep=None, create=True, enable_async_checkpointing=async_save
    )
    # Explicit handlers: a manager built without them cannot read an empty step folder.
    self._manager = ocp.CheckpointManager(
      self.directory,
      options=options,
      item_handlers={_STATE: ocp.StandardCheckpointHandler(), _META: ocp.JsonCheckpointHandler()},
    )

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: Any) -> None:
    """Starts an asynchronous save of ``state`` at ``step`` (all processes call it)."""
    self.wait_until_finished()
    self._prune()
    self._state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
    meta = {"step": int(step), "fingerprint": fingerprint(state), "data": self._data}
    with self._disk_errors():
      self._manager.save(
        step,
        args=ocp.args.Composite(
          **{_STATE: ocp.args.StandardSave(state), _META: ocp.args.JsonSave(meta)}
        ),
      )

  def restore_latest(self, abstract_state: Any) -> Optional[Any]:
    """The newest intact step, restored into ``abstract_state``'s structure and shardings.

    Returns None when there is no step. A corrupt step is moved aside with a warning;
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
    with self._disk_errors():
      self._manager.wait_until_finished()

  def close(self) -> None:
    """Completes the saves already started, applies retention, and closes the manager."""
    try:
      self.wait_until_finished()
      self._prune()
    finally:
      self._manager.close()

  def _restore_verified(self, step_dir: epath.Path, abstract_state: Any) -> Any:
    saved = _read_meta(step_dir)["fingerprint"]
    try:
      restored = self._manager.restore(
        int(step_dir.name),
        args=ocp.args.Composite(**{_STATE: ocp.args.StandardRestore(abstract_state)}),
      )
    except Exception as e:  # pylint: disable=broad-except
      if errors.is_out_of_memory(e):
        raise
      raise _corrupt(
        step_dir, f"cannot be read (an incomplete or damaged save): {_first_line(e)}"
      ) from e
    _check(step_dir, saved, restored[_STATE])
    return restored[_STATE]

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
    """Deletes steps older than the newest ``keep``, keeping the newest one known intact."""
    steps = self.all_steps()
    old, kept = steps[: -self.keep], steps[-self.keep :]
    if not old:
      return
    if self._verified not in kept:
      newest = self.directory / str(steps[-1])
      try:
        _read_host(newest)
      except errors.CheckpointError as e:
        logging.warning("%s Keeping the older steps %s.", e, old)
        return
      self._verified = steps[-1]
    for step in old:
      self._manager.delete(step)

  @contextlib.contextmanager
  def _disk_errors(self) -> Iterator[None]:
    """Turns a full disk into one OutOfDiskError with the bytes a step needs."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      if errors.is_out_of_disk(e):
        raise errors.out_of_disk(str(self.directory), self._state_bytes) from e
      raise
