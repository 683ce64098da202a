"""Saves and restores a training run (Orbax): asynchronous saves, resume, integrity checks.

Not the official ViT weights format: `vit_jax.checkpoint` reads and writes that `.npz`.

Layout: `<workdir>/checkpoints/<step>/{state, meta}`. `state` is the train state
(params, optimizer state, step, rng); `meta` is JSON with a fingerprint of every array.
Orbax stores no checksums, so a flipped byte would restore silently as a wrong value:
`restore_latest` recomputes the fingerprints and falls back to the newest older step
that is intact. A step killed mid-save is an ignored `*.orbax-checkpoint-tmp*` folder.
All processes call save and restore together (Orbax multi-host).
"""
from __future__ import annotations

import os
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath  # Orbax's path type: local paths and gs:// alike.

Params = dict[str, Any]


def make_manager(directory: str, *, keep: int = 3,
                 async_save: bool = True) -> ocp.CheckpointManager:
  """A manager for `directory` that keeps the newest ``keep`` steps."""
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                         enable_async_checkpointing=async_save)
  # Explicit handlers: a manager built without them cannot read an empty step folder.
  return ocp.CheckpointManager(
      _absolute(directory), options=options,
      item_handlers={"state": ocp.StandardCheckpointHandler(),
                     "meta": ocp.JsonCheckpointHandler()})


@jax.jit
def _fingerprints(tree: Any) -> list[jax.Array]:
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
  return [leaf_sum(x) for x in jax.tree.leaves(tree)]


def fingerprint(tree: Any) -> list[int]:
  return [int(v) for v in jax.device_get(_fingerprints(tree))]


def save(manager: ocp.CheckpointManager, step: int, state: Any) -> None:
  """Starts an asynchronous save of ``state`` at ``step`` (all processes call it)."""
  manager.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      meta=ocp.args.JsonSave({"step": int(step), "fingerprint": fingerprint(state)})))


def restore_latest(manager: ocp.CheckpointManager, abstract_state: Any) -> Optional[Any]:
  """Restores the newest intact step into ``abstract_state``'s structure and shardings.

  Returns None when there is no step. Corrupt or unreadable steps are skipped with a
  warning (never deleted: a person may want to look at them).
  """
  steps = sorted(manager.all_steps(), reverse=True)
  for step in steps:
    try:
      restored = manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("Checkpoint step %d cannot be restored (%s: %s); trying an older one.",
                      step, type(e).__name__, e)
      continue
    if restored.meta["fingerprint"] != fingerprint(restored.state):
      logging.warning("Checkpoint step %d fails its integrity check (its arrays changed after "
                      "saving); trying an older one.", step)
      continue
    logging.info("Restored checkpoint step %d from %s.", step, manager.directory)
    return restored.state
  if steps:
    raise RuntimeError(f"None of the checkpoint steps {steps} in {manager.directory} could be "
                       "restored (see the warnings above). Move the folder away to start afresh.")
  return None


def _absolute(path: str | os.PathLike) -> epath.Path:
  """``path`` made absolute; a URL such as gs://bucket/dir is kept as it is."""
  path = os.fspath(path)
  return epath.Path(path if "://" in path else os.path.abspath(path))


def _step_dir(path: epath.Path) -> epath.Path:
  """A step folder: ``path`` itself, or the newest finalized step of a manager root."""
  if (path / "state").is_dir():
    return path
  steps = sorted((int(p.name) for p in path.iterdir() if p.name.isdigit()
                  and (p / "state").is_dir()), reverse=True)
  if not steps:
    raise FileNotFoundError(f"No finalized Orbax checkpoint step in {str(path)!r}: pass a "
                            "`<workdir>/checkpoints` folder or one of its step folders.")
  return path / str(steps[0])


def read_params(path: str | os.PathLike) -> Params:
  """The parameters of a checkpoint as host numpy arrays, in the layout they were saved in.

  ``path``: a `<workdir>/checkpoints` folder (its newest step is read) or a step folder.
  Only the parameters are read, not the optimizer state. In a multi-process run every
  process must call it (Orbax's restore waits at a barrier for all of them); each gets
  the whole arrays.
  """
  path = _absolute(path)
  if not path.is_dir():
    raise FileNotFoundError(f"No Orbax checkpoint folder at {str(path)!r}: check the path.")
  state_dir = _step_dir(path) / "state"
  checkpointer = ocp.PyTreeCheckpointer()
  params_meta = checkpointer.metadata(state_dir).item_metadata.tree["params"]
  as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), params_meta)
  restored = checkpointer.restore(state_dir, args=ocp.args.PyTreeRestore(
      item={"params": params_meta}, restore_args={"params": as_numpy}, partial_restore=True))
  return restored["params"]
