"""Checkpoints and exports on a bucket (gs://, any URL `vit_jax.infra.storage` reaches), read and
written through fsspec, without TensorFlow.

Reading (`local_copy`): a training run's Orbax steps are read where they are (`holds_steps`;
tensorstore reads the arrays). Any other checkpoint on a bucket (an `.npz` or `.safetensors`
file, a transformers, timm or `Model.save` folder) is copied into a local temporary folder
and read there by the same readers and checks as a local one; the copy is removed once
read. A file comes with the small files its readers look for beside it (`SIDECARS`: an
`.npz`'s `.config.json`, a tokenizer, `labels.txt`); a folder with the files at its top
level, but for pickles and other frameworks' weights, which no reader opens. An error of
the readers names the bucket's path, not the copy's.

Writing (`upload`): an export is written into a local temporary folder, as a local one is,
then each file is uploaded. A bucket renames no folder, but an object appears whole; the
largest file (the weights) goes last, so a write killed mid-way leaves no folder that loads
with part of its files, and a failure, Ctrl-C or SIGTERM deletes what was uploaded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Iterator

import fsspec
from absl import logging

from vit_jax.infra import errors, storage
from vit_jax.infra.paths import CHECKPOINTS, as_path
from vit_jax.weights import orbax_steps

SIDECARS = (".json", ".model", ".txt")  # configs, SentencePiece models, labels and vocabularies
MAX_SIDECAR_BYTES = 64 * 2**20  # a tokenizer.json is megabytes
# Files of a folder no reader opens: pickles (refused unread) and other frameworks' weights.
NOT_READ = (".bin", ".pth", ".pt", ".ckpt", ".pkl", ".pickle", ".msgpack", ".h5", ".onnx")


def _url(location: str | os.PathLike) -> str:
  return os.fspath(location).rstrip("/")


def holds_steps(location: str | os.PathLike) -> bool:
  """Whether folder ``location`` holds a training run's Orbax steps, which are read where
  they are: a run's folder (its `checkpoints/`), its `checkpoints/`, or one step."""
  path = as_path(location)
  return (
    (path / CHECKPOINTS).is_dir()
    or (path / orbax_steps.STATE).is_dir()
    or bool(orbax_steps.finalized_steps(path))
  )


@contextlib.contextmanager
def local_copy(location: str | os.PathLike) -> Iterator[str]:
  """A local path to read for ``location``: itself when it is local, nothing (the readers
  then say what is missing) or a run's folder on a bucket; else a copy of the bucket's file
  or folder (module docstring), removed when the block ends."""
  url = _url(location)
  if not storage.is_remote(url):
    yield os.fspath(location)
    return
  fs = storage.filesystem(url)
  with storage.errors_as_one_line(url, "Reading"):
    kind = fs.info(url)["type"] if fs.exists(url) else None
    in_place = kind is None or (kind == "directory" and holds_steps(url))
  if in_place:
    yield url
    return
  folder = url if kind == "directory" else url.rsplit("/", 1)[0]
  copy = tempfile.mkdtemp(prefix="vit_jax-checkpoint-")
  try:
    with storage.errors_as_one_line(url, "Reading"):
      _download(fs, folder, copy, only=None if kind == "directory" else url)
    yield copy if kind == "directory" else os.path.join(copy, url.rsplit("/", 1)[1])
  except errors.UserError as e:
    e.args = (str(e).replace(copy, folder),)  # name the bucket's files, not the copy's
    raise
  finally:
    shutil.rmtree(copy, ignore_errors=True)


def _download(fs: fsspec.AbstractFileSystem, folder: str, target: str, only: str | None) -> None:
  """Copies the files at the top of ``folder`` into ``target``: with ``only``, that file and
  its `SIDECARS`; else all but `NOT_READ`."""
  for entry in fs.ls(folder, detail=True):
    name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
    url = f"{folder}/{name}"
    if entry["type"] != "file" or not name:
      continue
    if only is not None:
      sidecar = name.endswith(SIDECARS) and entry["size"] <= MAX_SIDECAR_BYTES
      if url != only and not sidecar:
        continue
    elif name.lower().endswith(NOT_READ):
      continue
    fs.get_file(url, os.path.join(target, name))


def files(location: str | os.PathLike) -> list[tuple[str, int]]:
  """(path relative to folder ``location``, size in bytes) of every file in it, sorted."""
  url = _url(location)
  fs = storage.filesystem(url)
  with storage.errors_as_one_line(url, "Listing"):
    found = fs.find(url, detail=True)
  prefix = url.split("://", 1)[1] + "/"  # fsspec names objects without the protocol
  return sorted(
    (name[len(prefix) :], int(entry["size"]))
    for name, entry in found.items()
    if entry["type"] == "file" and name.startswith(prefix) and name != prefix
  )


def is_unused(location: str | os.PathLike) -> bool:
  """Whether nothing is stored at ``location`` but, at most, an empty folder."""
  url = _url(location)
  fs = storage.filesystem(url)
  with storage.errors_as_one_line(url, "Listing"):
    return not fs.isfile(url) and not files(url)


def upload(folder: str, location: str | os.PathLike) -> None:
  """Uploads the files under local ``folder`` into ``location``, the largest last; what was
  uploaded is deleted when one fails or the process is interrupted."""
  url = _url(location)
  fs = storage.filesystem(url)
  paths = [os.path.join(root, name) for root, _, names in os.walk(folder) for name in names]
  uploaded: list[str] = []
  try:
    with storage.errors_as_one_line(url, "Writing"):
      for path in sorted(paths, key=lambda p: (os.path.getsize(p), p)):
        target = f"{url}/{os.path.relpath(path, folder).replace(os.sep, '/')}"
        fs.put_file(path, target)
        uploaded.append(target)
  except BaseException:
    if uploaded:
      try:
        fs.rm(uploaded)
      except Exception as e:  # pylint: disable=broad-except  (the first error is the one raised)
        logging.warning("Could not delete the partial export in %s (%s): delete it.", url, e)
    raise
