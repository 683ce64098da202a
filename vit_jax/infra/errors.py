"""Errors a user can cause: one exception type, and the system failures that are such errors.

Every command (`vit_jax.cli`) prints a `UserError`'s message alone (no traceback; it is
logged at `--verbosity=1`) and exits with status 2. Each subclass also derives from the built-in
type that callers caught before (ValueError, FileNotFoundError), so they keep working.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from typing import Any, Optional


class UserError(Exception):
  """An error the user can fix; the message names the value and the fix."""


class CommandLineError(UserError, ValueError):
  """A flag or argument the command cannot take: unknown, missing, a bad value."""


class ConfigError(UserError, ValueError):
  """A config value, or a combination of values, that cannot work."""


class MissingError(UserError, FileNotFoundError):
  """A file, folder or prepared dataset that the config names does not exist."""


class CheckpointError(UserError, ValueError):
  """A stored checkpoint (`.npz` or a run's step) is damaged or does not fit."""


class StorageError(UserError):
  """A checkpoint step that could not be read, again and again, for a reason other than
  damage to its files (a network, timeout or permission error): every step is left in
  place, and running the command again once the storage answers resumes."""


class ResumeError(UserError, ValueError):
  """The run in the workdir was made with other data, seed or model than the config's."""


class WorkdirInUseError(UserError):
  """Another run is training in the workdir (its lock file names it)."""


class DivergenceError(UserError):
  """Training produced a non-finite loss, gradient norm or parameter."""


class OutOfDiskError(UserError):
  """A write failed because the workdir's disk is full."""


class InputFileError(UserError, ValueError):
  """An input file that is not a regular file, is larger than its bound or is not what it
  should be (text that is not UTF-8, an image of too many pixels)."""


class OutputExistsError(UserError, FileExistsError):
  """The output folder exists and is not empty: nothing is overwritten."""


class UnusableFolderError(UserError):
  """The folder to write to is a file, not writable, read-only, or cannot be created."""


class OutOfMemoryError(UserError):
  """The compiled train or eval step needs more device memory than there is."""


# What creating or writing under a folder fails with when the folder cannot be used: OSError
# numbers, and TensorFlow's errors for the same (tf.io.gfile, also for gs:// paths).
_UNUSABLE_ERRNOS = (
  errno.EACCES,
  errno.EPERM,
  errno.EROFS,
  errno.ENOTDIR,
  errno.EEXIST,
  errno.ENOENT,
)
_UNUSABLE_TF_ERRORS = (
  "PermissionDeniedError",
  "FailedPreconditionError",
  "NotFoundError",
  "UnimplementedError",
  "AlreadyExistsError",
)
_PATHS = re.compile(r"(?:[a-z][a-z0-9+]*://|/)[^\s;:'\",]*")  # paths and URLs in a message
_BYTES = re.compile(r"allocat\w*\s+(\d[\d.]*)\s*([KMGT]i?B|bytes|B)\b", re.IGNORECASE)
_UNITS = {
  "b": 1,
  "bytes": 1,
  "kb": 1e3,
  "mb": 1e6,
  "gb": 1e9,
  "tb": 1e12,
  "kib": 2**10,
  "mib": 2**20,
  "gib": 2**30,
  "tib": 2**40,
}


def says_out_of_disk(text: str) -> bool:
  """Whether an error message reports a write that failed for lack of disk space."""
  return "No space left" in text or ("RESOURCE_EXHAUSTED" in text and "writ" in text.lower())


def is_out_of_disk(e: BaseException) -> bool:
  """Whether ``e`` (or what it wraps) is a write that failed for lack of disk space."""
  while e is not None:
    if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or says_out_of_disk(str(e)):
      return True
    e = e.__cause__ or e.__context__
  return False


def is_out_of_memory(e: BaseException) -> bool:
  """Whether ``e`` is XLA's failure to allocate device memory (at run time, or a TPU
  compiler's refusal: `... exceeds available HBM`)."""
  text = str(e)
  return (
    "RESOURCE_EXHAUSTED" in text
    and not is_out_of_disk(e)
    and any(word in text.lower() for word in ("memory", "allocat", "hbm"))
  )


def _mentions(e: BaseException, directory: str) -> bool:
  """Whether ``e`` names ``directory``, a folder above it (one that is a file, say) or a
  path in it."""
  named = _PATHS.findall(str(e)) + [os.fspath(getattr(e, "filename", None) or "")]
  return directory in str(e) or any(
    path.rstrip("/")
    and (
      path == directory
      or directory.startswith(path.rstrip("/") + "/")
      or path.startswith(directory + "/")
    )
    for path in named
  )


def unusable_folder(e: BaseException, directory: str) -> Optional[UnusableFolderError]:
  """The error for ``e`` when it is a failure to create or write ``directory`` (or a path
  under it): a file in its place, no permission, a read-only file system, a missing bucket."""
  directory = directory.rstrip("/")
  while e is not None:
    unusable = (isinstance(e, OSError) and e.errno in _UNUSABLE_ERRNOS) or (
      type(e).__module__.startswith("tensorflow") and type(e).__name__ in _UNUSABLE_TF_ERRORS
    )
    if unusable and _mentions(e, directory):
      text = str(e).strip()
      reason = text.splitlines()[0][:300] if text else type(e).__name__
      return UnusableFolderError(
        f"Cannot write to {directory} ({reason}): choose a folder that can be created and "
        "written to."
      )
    e = e.__cause__ or e.__context__
  return None


def out_of_disk(directory: str, needed_bytes: Optional[int] = None) -> OutOfDiskError:
  """The error for a full disk under ``directory``, with the bytes free and needed."""
  try:
    free = f"{shutil.disk_usage(directory).free:,} bytes free"
  except OSError:  # a URL such as gs://, or a folder that is gone
    free = "free space unknown"
  need = f"needs about {needed_bytes:,} bytes" if needed_bytes else "needs more space"
  return OutOfDiskError(
    f"Out of disk space writing to {directory} ({free}; a checkpoint step of this run "
    f"{need}). Free space there or use a --workdir on a larger disk, then run the same "
    "command again: it resumes from the last complete step."
  )


def memory_advice(*, batch: int, accum_steps: Any, remat: bool, crop: Optional[int] = None) -> str:
  """What lowers a train step's device memory, with each setting's value now: the one
  advice of every out-of-memory error (``crop``: also name config.pp.crop)."""
  lower = f"config.batch (now {batch})"
  if crop is not None:
    lower = f"config.pp.crop (now {crop}) or {lower}"
  return (
    f"lower {lower}, raise config.accum_steps (now {accum_steps}; 'auto' picks one that "
    f"fits a device's memory), or set config.model.remat=True (now {remat})"
  )


def out_of_memory(e: BaseException, config: Any) -> OutOfMemoryError:
  """The error for XLA's out-of-memory ``e``, naming the settings that lower the need."""
  match = _BYTES.search(str(e))
  need = "more memory than the device has"
  if match:
    size = float(match.group(1)) * _UNITS[match.group(2).lower()]
    need = f"{size / 2**30:.2f} GiB ({int(size):,} bytes) in one allocation, which did not fit"
  first = next(
    (line for line in str(e).splitlines() if "RESOURCE_EXHAUSTED" in line),
    str(e).splitlines()[0] if str(e) else "",
  )
  return OutOfMemoryError(
    f"Out of device memory: the step needs {need} (XLA: {first.strip()[:200]}): "
    + memory_advice(batch=config.batch, accum_steps=config.accum_steps, remat=config.model.remat)
    + "."
  )


# The setup.py extra that installs each optional package, by its top-level module: what a
# command that imports one without it is missing.
EXTRA_OF_MODULE = {
  "tensorflow": "tf",
  "tokenizers": "text",
  "sentencepiece": "text",
  "torch": "interop",
  "torchvision": "interop",
  "timm": "interop",
  "transformers": "interop",
  "matplotlib": "notebooks",
  "skimage": "notebooks",
  "libtpu": "tpu",
}


def missing_extra(e: BaseException) -> Optional[UserError]:
  """The UserError naming the extra to install when ``e`` (or an error it came from) is an
  optional package's import failing; None otherwise."""
  seen: set[int] = set()
  cause: Optional[BaseException] = e
  while cause is not None and id(cause) not in seen:
    seen.add(id(cause))
    module = (getattr(cause, "name", None) or "").partition(".")[0]
    if isinstance(cause, ModuleNotFoundError) and module in EXTRA_OF_MODULE:
      extra = EXTRA_OF_MODULE[module]
      return UserError(
        f"This needs {module}, which is not installed: the {extra!r} extra brings it "
        f'(pip install -e ".[{extra}]").'
      )
    cause = cause.__cause__ or cause.__context__
  return None


def as_user_error(e: BaseException, *, workdir: Optional[str], config: Any) -> Optional[UserError]:
  """``e`` itself, or the UserError a full disk, device memory, an unusable ``workdir``
  (the folder the command writes to, if any) or a missing optional package means; None
  otherwise."""
  if isinstance(e, UserError):
    return e
  if missing := missing_extra(e):
    return missing
  if workdir and is_out_of_disk(e):
    return out_of_disk(workdir)
  if workdir and (unusable := unusable_folder(e, workdir)):
    return unusable
  if is_out_of_memory(e) and config is not None:
    return out_of_memory(e, config)
  return None
