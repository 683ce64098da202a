"""The write side of the weights package: a loaded model -> a folder in one format.

`save(model, fmt, out, class_names=..., image_size=...)` checks that ``model`` can be
written as ``fmt`` (an `exports.EXPORTS` name: hf, timm, npz and big_vision through their
checkpoint format's record, `formats.for_export`, whose writer the family picks;
saved_model and stablehlo through `serving`), then writes the files into a new folder
beside ``out`` (``.OUT.tmp-*``) renamed to ``out`` at the end: a failure, Ctrl-C or
SIGTERM leaves nothing in ``out``; a temporary folder left by a killed write (older than
an hour) is removed by the next write to the same ``out``. ``out`` must not exist or be empty. The
files get the user's umask modes. On a bucket (gs://) the files are written into a local
temporary folder, then uploaded one object each (`remote.upload`: a bucket renames no
folder; what was uploaded is deleted on a failure). The export command (`vit_jax.export`)
and the Python face (`vit_jax.Model.save`) both write through here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import tempfile
import threading
import time
from typing import Callable, Iterator, Optional, Sequence

import jax
import jax.numpy as jnp
from absl import logging

from vit_jax import models
from vit_jax.infra import errors, storage
from vit_jax.models import posemb
from vit_jax.weights import exports, formats, remote, sources

STALE_SECONDS = 3600  # a temporary folder this old was left by a killed write


def writer(
  model: sources.LoadedModel,
  fmt: str,
  *,
  class_names: Optional[Sequence[str]],
  image_size: tuple[int, int],
) -> Callable[[str], None]:
  """Checks that ``model`` can be written as ``fmt``; returns what writes it into a folder
  (with `formats.LABELS_FILE` beside every format but hf, which keeps the names in its config).
  An image-text model is written whole as hf (transformers' SigLIP or CLIP), npz and
  big_vision; timm, saved_model and stablehlo take its image tower (`image_tower`: its
  features; `exports.Export.image_tower`)."""
  export = exports.by_name(fmt)
  model = with_stated_grid(model)
  if export.image_tower:
    model = image_tower(model)
  if not export.keeps_grid(model.config):
    model = at_fixed_grid(model, image_size)
  module = model.module(dtype=jnp.float32)
  params = model.params
  names = list(class_names) if class_names else None
  family = models.family_of(model.config)
  data_config = model.data_config.at_size(image_size)  # the preprocessing each format states
  checkpoint = formats.for_export(export, family)  # hf, timm, npz, big_vision: a format's
  if checkpoint is not None and checkpoint.write is not None:
    write = checkpoint.write(
      model, image_size=image_size, class_names=names, data_config=data_config
    )
  elif export.serve is not None:  # saved_model, stablehlo
    serve = export.serve
    write = lambda d: serve(d, module, params, image_size)
  else:
    raise errors.CommandLineError(f"--format={fmt} cannot write a {family.name} model.")

  def write_with_labels(directory: str) -> None:
    write(directory)
    if names:
      with open(os.path.join(directory, formats.LABELS_FILE), "w") as f:
        f.write("\n".join(names) + "\n")

  return write_with_labels


def with_stated_grid(model: sources.LoadedModel) -> sources.LoadedModel:
  """A run trained on NaFlex inputs (``pp.seq_len``) with its square table's grid stated as
  the grid it is resized from (``posemb_grid``), so that a format keeping the NaFlex
  layout (timm's NaFlexViT, big_vision's naflex_vit) writes it; any other model as it is."""
  pp = model.run_config.get("pp", {}) if model.run_config is not None else {}
  if not pp.get("seq_len") or model.image_size is None:
    return model
  tower = models.image_settings(model.config)
  if tower.get("posemb_grid") is not None:
    return model
  grid = models.create_model(tower, num_classes=None).grid_hw(model.image_size)
  # (a two-tower model's settings give a field they do not have to the image tower)
  return dataclasses.replace(model, config=model.config.replace(posemb_grid=tuple(grid)))


def at_fixed_grid(model: sources.LoadedModel, image_size: tuple[int, int]) -> sources.LoadedModel:
  """``model`` with a table resized to every input (``posemb_grid``, a NaFlex tower's)
  fixed at ``image_size``'s grid, as the model resizes it there: the layout every format
  writes (a ViT's table at its input grid); any other model as it is."""
  if model.config.get("posemb_grid") is None:  # (an image-text config has none at its top)
    return model
  settings = model.config
  grid = models.create_model(settings, num_classes=None).grid_hw(image_size)
  params = jax.tree.map(lambda x: x, model.params)  # a copy of the tree, the arrays shared
  embed = params["Transformer"]["posembed_input"]
  if tuple(grid) != tuple(settings.posemb_grid):  # at its own grid: the table as it is
    embed["pos_embedding"] = posemb.table_at_grid(embed["pos_embedding"], settings, grid)
  config = settings.replace(posemb_grid=None)
  return dataclasses.replace(model, config=config, params=params, image_size=tuple(image_size))


def image_tower(model: sources.LoadedModel) -> sources.LoadedModel:
  """A model's image model alone (`models.image_settings`): an image-text model's image
  tower, its features (before the projection and the normalisation; a SigLIP's are its
  image embeddings) with the same preprocessing; an image model as it is."""
  if not models.family_of(model.config).image_tree:
    return model
  logging.info("%s is an image-text model: writing its image tower.", model.source)
  return sources.LoadedModel(
    models.image_settings(model.config), models.image_params(model.params, model.config),
    None, model.image_size, None, model.source, data_config=model.data_config,
  )  # fmt: skip


def save(
  model: sources.LoadedModel,
  fmt: str,
  out: str | os.PathLike,
  *,
  class_names: Optional[Sequence[str]],
  image_size: tuple[int, int],
) -> str:
  """Writes ``model`` as ``fmt`` into the new (or empty) folder ``out``, all or nothing
  (the module docstring); returns the absolute path or the URL of ``out``."""
  out = absolute(out)
  check_out(out)
  write = writer(model, fmt, class_names=class_names, image_size=image_size)
  if storage.is_remote(out):
    with _sigterm_raises(), tempfile.TemporaryDirectory(prefix="vit_jax-export-") as tmp:
      write(tmp)
      remote.upload(tmp, out)
    return out
  parent = os.path.dirname(out)
  os.makedirs(parent, exist_ok=True)
  _remove_stale_temporaries(out)
  with _sigterm_raises():
    tmp = tempfile.mkdtemp(prefix=_temporary_prefix(out), dir=parent)
    try:
      write(tmp)
      _user_modes(tmp)
      if os.path.isdir(out):
        os.rmdir(out)  # empty, checked above
      os.replace(tmp, out)
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
  return out


def absolute(out: str | os.PathLike) -> str:
  """``out`` as an absolute path, or as the URL it is (gs://...) without a trailing "/"."""
  text = os.fspath(out)
  return text.rstrip("/") if storage.is_remote(text) else os.path.abspath(text)


def check_out(out: str | os.PathLike) -> None:
  """Refuses an ``out`` that exists and is not an empty folder (local or on a bucket)."""
  out = absolute(out)
  if storage.is_remote(out):
    used = not remote.is_unused(out)
  else:
    used = os.path.exists(out) and (not os.path.isdir(out) or bool(os.listdir(out)))
  if used:
    raise errors.OutputExistsError(
      f"--out={out!r} exists and is not an empty folder: choose a new "
      "path (nothing is overwritten)."
    )


def _remove_stale_temporaries(out: str) -> None:
  """Removes the temporary folders of exports to ``out`` killed over an hour ago: the
  entries of its folder whose names start with its prefix, compared as text (no glob:
  ``out`` may hold ``*``, ``?`` or ``[``)."""
  parent, prefix = os.path.dirname(out), _temporary_prefix(out)
  for name in os.listdir(parent):
    path = os.path.join(parent, name)
    if not name.startswith(prefix) or os.path.islink(path):
      continue
    if os.path.isdir(path) and time.time() - os.path.getmtime(path) > STALE_SECONDS:
      logging.warning("Removing %s, left by an export to %s that was killed.", path, out)
      shutil.rmtree(path, ignore_errors=True)


def _temporary_prefix(out: str) -> str:
  return f".{os.path.basename(out)}.tmp-"


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
  """SIGTERM raises SystemExit(143) inside the block (as Ctrl-C raises KeyboardInterrupt),
  so that its cleanup runs; the process then exits with the status the shell expects."""
  if threading.current_thread() is not threading.main_thread():
    yield  # only the main thread can handle signals
    return

  def raise_exit(signum, frame):  # pylint: disable=unused-argument
    raise SystemExit(128 + signum)

  previous = signal.signal(signal.SIGTERM, raise_exit)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


def _user_modes(directory: str) -> None:
  """Gives ``directory`` and everything in it the modes of a new folder and file under the
  user's umask (a temporary folder is 0700, and some writers make their files 0600)."""
  probe = os.path.join(directory, ".mode-probe")
  os.mkdir(probe, 0o777)  # the umask applies: no process-wide os.umask() call needed
  folder_mode = os.stat(probe).st_mode & 0o777
  os.rmdir(probe)
  os.chmod(directory, folder_mode)
  for root, folders, files in os.walk(directory):
    for name in folders:
      os.chmod(os.path.join(root, name), folder_mode)
    for name in files:
      os.chmod(os.path.join(root, name), folder_mode & 0o666)
