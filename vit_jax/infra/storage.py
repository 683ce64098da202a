"""Remote storage: every URL the package touches (gs://..., any fsspec protocol), without
TensorFlow.

One layer, chosen from what the JAX stack already uses (docs/architecture.md, "Storage"):

* Files and folders go through fsspec (gcsfs for gs://): the data sources' reads
  (`vit_jax.data.filesystems`), and, through `etils.epath`'s fsspec backend, the run
  folder, TensorBoard events and Orbax's step folders and metadata.
* Orbax writes and reads the arrays with tensorstore's own GCS driver.

`etils.epath` sends gs:// paths to `tf.io.gfile` wherever TensorFlow is importable, which
neither honours an emulator nor matches the TensorFlow-free install; `configure` makes
them take fsspec on every install, and points tensorstore at the server Google's clients
are pointed at by `STORAGE_EMULATOR_HOST` (a local GCS server: the tests' own), so a user
sets one variable. It runs on every remote path (`vit_jax.infra.paths.as_path`, `filesystem`),
before Orbax makes an `epath.Path` of its own.

GCS has no rename and no append, but writes conditional on an object's generation
(`ifGenerationMatch`, 0 for "does not exist"): `create_exclusive` and `take_over` build
the run folder's lock on them.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from typing import Any, Iterator, Optional

import fsspec
from etils import epath

from vit_jax.infra import errors

EMULATOR = "STORAGE_EMULATOR_HOST"  # Google's clients (gcsfs included) read it
# tensorstore's GCS driver: its endpoint, and a fixed bearer token in place of credentials.
_TENSORSTORE_URL = "TENSORSTORE_GCS_HTTP_URL"
_TENSORSTORE_TOKEN = "GOOGLE_AUTH_TOKEN_FOR_TESTING"


def is_remote(path: str | os.PathLike) -> bool:
  """Whether ``path`` is a URL other than file:// (not on this machine's filesystem)."""
  text = os.fspath(path)
  return "://" in text and not text.startswith("file://")


class _FsspecPath(epath.gpath.PosixGPath):
  """An `epath.Path` whose gs:// files go through fsspec whether or not TensorFlow is
  importable (etils >= 1.5 picks `tf.io.gfile` when it is)."""

  @property
  def _backend(self) -> Any:
    if self._uri_scheme is None:
      return super()._backend
    return epath.backend.fsspec_backend


@functools.cache
def _register_fsspec_paths() -> None:
  epath.register_path_cls("gs://")(_FsspecPath)
  # No cached folder listings: other hosts and processes write into the same run folder
  # (a step another process saved must be seen at once). fsspec's defaults per protocol,
  # applied to every GCS filesystem made, epath's included.
  fsspec.config.conf.setdefault("gs", {})["use_listings_cache"] = False


def configure() -> None:
  """Routes gs:// `epath.Path`s (the package's and Orbax's) through fsspec, and maps
  `STORAGE_EMULATOR_HOST` onto tensorstore's variables. Cheap; called on remote paths."""
  _register_fsspec_paths()
  emulator = os.environ.get(EMULATOR, "")
  if emulator and emulator != "default":
    url = emulator if emulator.startswith(("http://", "https://")) else f"http://{emulator}"
    os.environ[_TENSORSTORE_URL] = url
    os.environ.setdefault(_TENSORSTORE_TOKEN, "emulator")  # the emulator checks no token
    # gcsfs's default class asks the bucket's layout of the control-plane API (gRPC) on
    # each call, which an emulator does not serve: read when gcsfs is first imported.
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def error(path: str, e: BaseException, doing: str = "Reading") -> errors.StorageError:
  """The error for ``doing`` ``path`` that failed with ``e`` once the client's retries were
  spent: one line naming the path, the client's reason and the way out."""
  text = str(e).strip()
  return errors.StorageError(
    f"{doing} {path} failed after the storage client's retries "
    f"({type(e).__name__}: {text.splitlines()[0][:200] if text else ''}): "
    "check the bucket and its credentials, then run the same command again."
  )


@contextlib.contextmanager
def errors_as_one_line(path: str, doing: str = "Reading") -> Iterator[None]:
  """A failure of the storage other than a missing object, as one `error` naming ``path``
  (a missing object stays a FileNotFoundError, as a missing local file)."""
  try:
    yield
  except (FileNotFoundError, errors.UserError):
    raise
  except Exception as e:  # pylint: disable=broad-except  (the client's: aiohttp, HTTP codes)
    raise error(path, e, doing) from e


def filesystem(path: str) -> fsspec.AbstractFileSystem:
  """The fsspec filesystem of URL ``path`` (gcsfs for gs://), shared by the process."""
  configure()
  return fsspec.filesystem(fsspec.utils.get_protocol(path))


def _upload_if_generation(path: str, data: bytes, expected: str) -> bool:
  """Writes object ``path`` if its generation is ``expected`` ("0": it does not exist); the
  server checks the precondition (a multipart upload with `ifGenerationMatch`). False when
  it fails (412: another process wrote first)."""
  fs = filesystem(path)
  bucket, key = path.removeprefix("gs://").split("/", 1)
  upload = fs.base.replace("/storage/v1/", "/upload/storage/v1/")  # the JSON API's uploads
  body = (
    b'--=\nContent-Type: application/json\n\n{"name": ' + json.dumps(key).encode()
    + b"}\n--=\nContent-Type: application/octet-stream\n\n" + data + b"\n--=--"
  )  # fmt: skip
  try:
    fs.call(
      "POST",
      f"{upload}b/{bucket}/o",
      uploadType="multipart",
      ifGenerationMatch=expected,
      headers={"Content-Type": 'multipart/related; boundary="="'},
      data=body,
    )
  except FileExistsError:  # gcsfs's name for 412 Precondition Failed
    return False
  finally:
    fs.invalidate_cache(path)
  return True


def create_exclusive(path: str | os.PathLike, data: bytes) -> bool:
  """Writes object ``path`` only where none exists; False when one does. On gs:// the
  server decides (`ifGenerationMatch=0`), so of two hosts creating it at once exactly one
  wins; another protocol is checked, then written (not exclusive)."""
  path = os.fspath(path)
  if path.startswith("gs://"):
    return _upload_if_generation(path, data, "0")
  fs = filesystem(path)
  if fs.exists(path):
    return False
  fs.pipe_file(path, data)
  return True


def generation(path: str | os.PathLike) -> Optional[str]:
  """The object's generation (it changes on every write); None when it does not exist."""
  fs = filesystem(os.fspath(path))
  try:
    return str(fs.info(os.fspath(path), refresh=True)["generation"])
  except FileNotFoundError:
    return None


def take_over(path: str | os.PathLike, data: bytes, seen: str) -> bool:
  """Replaces object ``path`` with ``data`` only if it is still at generation ``seen``, so
  of several processes taking over the same object at once exactly one returns True."""
  return _upload_if_generation(os.fspath(path), data, seen)
