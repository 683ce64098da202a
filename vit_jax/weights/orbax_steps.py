"""A training run's Orbax steps read as weights, each array checked against its fingerprint.

Layout of a step (`vit_jax.run.checkpoints` writes it): `<workdir>/checkpoints/<step>/`
holds `state` (the train state: params, optimizer state, step, rng) and `meta` (JSON: the
step, a fingerprint of every array keyed by its path in the state, e.g.
"params/head/kernel", and the identity of the data the run trains on). Orbax stores no
checksums, so a flipped byte would restore silently as a wrong value: every reader
recomputes the fingerprints.

A read that fails is retried (`read_with_retries`): a step is a `CheckpointError` naming it
only on proven damage (`is_damage`: a fingerprint mismatch, a file of the step missing or
undecodable, seen on two reads in a row); any other failure (a network, timeout or
permission error, an error of unknown type) is read again `READ_ATTEMPTS` times with
doubling waits, then one `StorageError` that leaves every step in place.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Mapping, Optional, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from vit_jax.infra import errors, storage
from vit_jax.infra.aliases import Params
from vit_jax.infra.paths import as_path

STATE, META = "state", "meta"  # the two items of a step
COMMIT_MARKER = "commit_success.txt"  # Orbax's mark of a complete step on a bucket
_PARAMS = "params"
_UNREADABLE = "cannot be read (an incomplete or damaged save)"

# A read of a step that fails for a reason other than damage is made this many times in
# all, waiting RETRY_FIRST_WAIT_S before the second, twice that before the third, ...
READ_ATTEMPTS = 4
RETRY_FIRST_WAIT_S = 1.0
# tensorstore's status codes (each of its errors starts "<CODE>: ") that say the stored
# bytes are missing or not what their format says.
_DAMAGE_STATUSES = ("NOT_FOUND", "DATA_LOSS", "OUT_OF_RANGE", "FAILED_PRECONDITION")
# Orbax's words for an array of another shape, and for an item the step lacks.
_DAMAGE_WORDS = ("is not compatible with the stored shape", "was not found in the checkpoint")

_T = TypeVar("_T")


def first_line(e: BaseException) -> str:
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


def corrupt_error(step_dir: epath.Path, problem: str) -> errors.CheckpointError:
  return errors.CheckpointError(f"Checkpoint step {step_dir.name} in {step_dir.parent} {problem}.")


def storage_error(step_dir: epath.Path, e: BaseException) -> errors.StorageError:
  return errors.StorageError(
    f"Cannot read checkpoint step {step_dir.name} in {step_dir.parent} "
    f"({READ_ATTEMPTS} attempts; the last: {first_line(e)}). Every step is left in place: "
    "check the storage and its credentials, then run the same command again (a training "
    "run resumes from its newest step)."
  )


def is_damage(e: BaseException) -> bool:
  """Whether ``e``, raised reading a step, says the step's files are damaged.

  Damage: a file the step must hold is missing (FileNotFoundError, tensorstore NOT_FOUND,
  Orbax's 'Item "state" was not found in the checkpoint'); a file that is there does not
  decode (json.JSONDecodeError, UnicodeDecodeError; tensorstore DATA_LOSS, OUT_OF_RANGE: a
  file shorter than its index says, FAILED_PRECONDITION: invalid JSON, a truncated
  compressed stream); an array of another shape than the state's. Nothing else is: a
  connection, timeout or permission error, tensorstore UNAVAILABLE or DEADLINE_EXCEEDED,
  an exception of any other type. ``e`` and what it was raised from are looked at (Orbax
  raises a bare Exception from tensorstore's error).
  """
  cause: Optional[BaseException] = e
  while cause is not None:
    if isinstance(cause, (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError)):
      return True
    text = str(cause)
    if text.split(":", 1)[0].strip() in _DAMAGE_STATUSES:
      return True
    if any(words in text for words in _DAMAGE_WORDS):
      return True
    cause = cause.__cause__
  return False


def read_with_retries(step_dir: epath.Path, problem: str, read: Callable[[], _T]) -> _T:
  """``read()``, made again while it fails for a reason other than proven damage.

  Damage (`is_damage`) on two reads in a row is a CheckpointError saying the step
  ``problem``: the second read rules out a failure that looked like a missing file (fsspec's
  isdir answers False on a dropped connection). Any other failure is read again after
  RETRY_FIRST_WAIT_S, doubling, READ_ATTEMPTS times in all, one log line each, then one
  StorageError. Out of device memory raises at once.
  """
  wait, failures, damaged = RETRY_FIRST_WAIT_S, 0, False
  while True:
    try:
      return read()
    except Exception as e:  # pylint: disable=broad-except
      if errors.is_out_of_memory(e):
        raise
      where, why = f"Checkpoint step {step_dir.name} in {step_dir.parent}", first_line(e)
      if is_damage(e):
        if damaged:
          raise corrupt_error(step_dir, f"{problem}: {why}") from e
        damaged = True
        logging.warning("%s looks damaged (%s): reading it once more in %g s.", where, why, wait)
      else:
        damaged, failures = False, failures + 1
        if failures == READ_ATTEMPTS:
          raise storage_error(step_dir, e) from e
        logging.warning(
          "%s: a read failed (%s); attempt %d of %d in %g s.",
          where,
          why,
          failures + 1,
          READ_ATTEMPTS,
          wait,
        )
      time.sleep(wait)
      wait *= 2


def read_meta(step_dir: epath.Path) -> dict[str, Any]:
  """The step's meta JSON, with its fingerprints (`read_with_retries`)."""

  def read() -> Any:
    with ocp.Checkpointer(ocp.JsonCheckpointHandler()) as checkpointer:
      return checkpointer.restore(step_dir / META, args=ocp.args.JsonRestore())

  meta = read_with_retries(step_dir, f"has no readable {META} (the arrays' fingerprints)", read)
  if not isinstance(meta, dict) or not isinstance(meta.get("fingerprint"), dict):
    raise corrupt_error(step_dir, f"has no per-array fingerprints in {step_dir / META}")
  return meta


def verify(step_dir: epath.Path, saved: Mapping[str, int], tree: Any) -> None:
  """Raises CheckpointError when an array of ``tree`` differs from its saved fingerprint."""
  got = fingerprint(tree)
  bad = sorted(k for k, v in got.items() if saved.get(k) != v)
  if bad:
    raise corrupt_error(
      step_dir,
      f"is corrupt: {len(bad)} of its {len(got)} arrays differ from "
      f"the fingerprints saved with them (first: {bad[0]}); the files changed "
      "after saving",
    )


def read_host(step_dir: epath.Path, subtree: Optional[str] = None) -> Any:
  """The step's state (or its ``subtree``) as host numpy arrays, verified; each read
  made by `read_with_retries`."""
  meta = read_meta(step_dir)
  state_dir = step_dir / STATE
  with ocp.PyTreeCheckpointer() as checkpointer:
    # The tree's own metadata (`state/_METADATA`; raises when it is missing). The
    # Checkpointer's `metadata` would also look for a `state/_CHECKPOINTMETADATA`, which a
    # CheckpointManager writes one level up, and warn that it does not exist.
    tree = read_with_retries(
      step_dir, _UNREADABLE, lambda: checkpointer.handler.metadata(state_dir).tree
    )
    if subtree and subtree not in tree:
      raise corrupt_error(step_dir, f"holds no {subtree!r} in its {STATE}")
    item = {subtree: tree[subtree]} if subtree else tree
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
    args = ocp.args.PyTreeRestore(
      item=item, restore_args=as_numpy, partial_restore=subtree is not None
    )
    restored = read_with_retries(
      step_dir, _UNREADABLE, lambda: checkpointer.restore(state_dir, args=args)
    )
  verify(step_dir, meta["fingerprint"], restored)
  return restored[subtree] if subtree else restored


def finalized_steps(directory: str | os.PathLike) -> list[int]:
  """The steps of a `<workdir>/checkpoints` folder whose save completed, ascending.

  Locally a save is renamed into its step folder when complete; on a bucket (no rename)
  Orbax writes into the step folder and marks it complete last (`COMMIT_MARKER`), so a
  step killed mid-save there is a folder without the marker, and not a step."""
  path = as_path(directory)
  if not path.is_dir():
    return []
  remote = storage.is_remote(path)
  return sorted(
    int(p.name)
    for p in path.iterdir()
    if p.name.isdigit() and (p / STATE).is_dir() and (not remote or (p / COMMIT_MARKER).exists())
  )


def read_params(path: str | os.PathLike) -> Params:
  """The verified parameters of a checkpoint as host numpy arrays, in their saved layout.

  ``path``: a `<workdir>/checkpoints` folder (its newest step is read) or a step folder.
  Only the parameters are read, not the optimizer state. A step whose arrays fail their
  fingerprints, or whose files are damaged, raises `errors.CheckpointError` naming the
  step; one that cannot be read for another reason (the storage) `errors.StorageError`.
  In a multi-process run every process must call it (Orbax's restore waits at a barrier
  for all of them); each gets the whole arrays.
  """
  path = as_path(path)
  if not path.is_dir():
    raise errors.MissingError(f"No Orbax checkpoint folder at {str(path)!r}: check the path.")
  if (path / STATE).is_dir():
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
    return read_host(step_dir, _PARAMS)
  except errors.CheckpointError as e:
    older = [s for s in finalized_steps(step_dir.parent) if s < int(step_dir.name)]
    hint = f" Read an older step instead (e.g. {step_dir.parent / str(older[-1])})" if older else ""
    raise errors.CheckpointError(
      f"{e}{hint}; resuming the run moves the damaged step aside and writes it again."
    ) from e
