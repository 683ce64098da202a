"""The official ViT weights format: `.npz` read and write, scanned <-> per-layer layouts.

Official files are flat `np.savez` archives whose keys are Flax parameter paths joined by
'/' (keys and shapes: docs/checkpoint_format.md). A scanned encoder (`nn.scan`) keeps every
block's arrays once, under `Transformer/encoderblock/`, with a leading depth axis; the
per-layer layout has `Transformer/encoderblock_{i}/`. Files are written per-layer, as the
official ones. Adapting weights to a new model for fine-tuning is `vit_jax.weights.fit`;
saving a training run is `vit_jax.run.checkpoints`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zipfile
import zlib
from typing import Any, Callable, Mapping, Optional

import flax.linen as nn
import ml_collections
import numpy as np
from absl import logging
from flax import traverse_util

from vit_jax import models
from vit_jax.data import data_config as data_config_lib
from vit_jax.data import folder_tokenizer, tokenizer_kinds
from vit_jax.infra import errors, input_files
from vit_jax.infra.aliases import Params
from vit_jax.weights import architecture

EXPORT_FILE = "model.npz"  # the archive in a folder an npz export (`Model.save`) writes
SCANNED_BLOCK = "encoderblock"
DATA_CONFIG_KEY = "data_config"  # the sidecar's key of the eval preprocessing
_LAYER_BLOCK = re.compile(r"^encoderblock_(\d+)$")


def is_scanned(params: Mapping[str, Any]) -> bool:
  """Whether the encoder blocks are stored once with a leading depth axis."""
  return SCANNED_BLOCK in params.get("Transformer", {})


def scanned_to_layers(params: Params) -> Params:
  """Splits `Transformer/encoderblock` [L, ...] into `encoderblock_{i}` [...] (exact)."""
  if not is_scanned(params):
    return params
  transformer = dict(params["Transformer"])
  stacked = traverse_util.flatten_dict(transformer.pop(SCANNED_BLOCK))
  depth = {v.shape[0] for v in stacked.values()}
  if len(depth) != 1:
    raise ValueError(f"Scanned encoder arrays disagree on the depth axis: {sorted(depth)}.")
  for i in range(depth.pop()):
    transformer[f"encoderblock_{i}"] = traverse_util.unflatten_dict(
      {k: v[i] for k, v in stacked.items()}
    )
  return {**params, "Transformer": transformer}


def layers_to_scanned(params: Params) -> Params:
  """Stacks `encoderblock_{0..L-1}` into `Transformer/encoderblock` [L, ...] (exact)."""
  if is_scanned(params):
    return params
  if "Transformer" not in params:
    raise errors.CheckpointError(
      "No Transformer encoder to stack: an MLP-Mixer has no scanned layout (leave --scanned out)."
    )
  transformer = dict(params["Transformer"])
  layers = sorted((int(m.group(1)), k) for k in transformer if (m := _LAYER_BLOCK.match(k)))
  if [i for i, _ in layers] != list(range(len(layers))):
    raise ValueError(f"Encoder blocks are not numbered 0..L-1: {[k for _, k in layers]}.")
  flats = [traverse_util.flatten_dict(transformer.pop(k)) for _, k in layers]
  stacked = {k: np.stack([np.asarray(f[k]) for f in flats]) for k in flats[0]}
  transformer[SCANNED_BLOCK] = traverse_util.unflatten_dict(stacked)
  return {**params, "Transformer": transformer}


def to_layout(params: Params, scanned: bool) -> Params:
  """Converts a parameter tree to the scanned or the per-layer encoder layout."""
  return layers_to_scanned(params) if scanned else scanned_to_layers(params)


def _squeeze_groupnorm(path: str, value: np.ndarray) -> np.ndarray:
  # Older hybrid files store GroupNorm scale/bias as (1, 1, 1, W).
  leaf_module = path.split("/")[-2] if "/" in path else ""
  if leaf_module.startswith("gn") and value.ndim == 4 and value.shape[:3] == (1, 1, 1):
    return value.reshape(value.shape[-1])
  return value


def load_npz(path: str | os.PathLike) -> Params:
  """Reads an official-layout `.npz` (per-layer or scanned) into a nested parameter tree.

  A file that is not such an archive is one `errors.CheckpointError` naming the path and
  the cause (not a zip, a single `.npy`, truncated or damaged, empty, pickled objects).
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise errors.MissingError(f"No checkpoint file at {path!r}: check the path.")

  def fail(cause: str) -> errors.CheckpointError:
    return errors.CheckpointError(f"Cannot read checkpoint {path!r}: {cause}.")

  if not os.path.getsize(path):
    raise fail("the file is empty (0 bytes)")
  try:
    archive = np.load(path, allow_pickle=False)
  except ValueError as e:  # numpy tries pickle for anything without .npy/.npz magic
    raise fail(
      "it is not a .npz archive (it starts neither like a zip nor like a .npy file)"
    ) from e
  except (OSError, EOFError, zipfile.BadZipFile) as e:
    raise fail(f"it is truncated or damaged ({e})") from e
  if not isinstance(archive, np.lib.npyio.NpzFile):
    raise fail(
      "it is a single .npy array, not a .npz archive of named parameters (write "
      "one with np.savez or vit_jax.weights.npz.save_npz)"
    )
  with archive:
    try:
      flat = {k: _squeeze_groupnorm(k, archive[k]) for k in archive.files}
    except ValueError as e:  # object arrays: numpy would have to unpickle them
      raise fail(
        f"it is not a plain-array .npz: it holds pickled objects, which are not loaded ({e})"
      ) from e
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
      raise fail(f"it is truncated or damaged ({type(e).__name__}: {e})") from e
  if not flat:
    raise fail("the archive is empty (no arrays)")
  return traverse_util.unflatten_dict(flat, sep="/")


def top_keys(path: str) -> set[str]:
  """The first components of the archive's keys (``img``, ``txt``, ...), read from its
  listing without its arrays; empty for a file that is no readable archive."""
  try:
    with zipfile.ZipFile(path) as archive:
      return {name.removesuffix(".npy").split("/")[0] for name in archive.namelist()}
  except (OSError, zipfile.BadZipFile):
    return set()


def config_path(path: str | os.PathLike) -> str:
  """Where the model config of an `.npz` is kept: ``m.npz`` -> ``m.config.json`` (beside
  the archive, so the archive stays the official layout that other readers take)."""
  return os.path.splitext(os.fspath(path))[0] + ".config.json"


def save_npz(
  path: str | os.PathLike,
  params: Params,
  *,
  scanned: bool = False,
  config: Optional[Mapping[str, Any]] = None,
  data_config: Optional[Mapping[str, Any]] = None,
) -> None:
  """Writes parameters as an official per-layer `.npz` (float32, scanned trees converted),
  or with ``scanned`` the stacked encoder layout (big_vision's); with ``config`` (a model
  config) also `config_path`, which `weights.load` reads back: what the arrays cannot say
  (the GELU's form, the input mean and std) survives the round trip; ``data_config``
  (`DataConfig.to_dict`, the eval preprocessing) is kept in it under DATA_CONFIG_KEY.

  The files appear atomically: a crash mid-write leaves any earlier file untouched.
  """
  path = os.fspath(path)
  flat = traverse_util.flatten_dict(to_layout(nn.unbox(dict(params)), scanned), sep="/")
  arrays = {}
  for k, v in flat.items():
    v = np.asarray(v)
    # bfloat16 and other extension dtypes do not round-trip through np.load; widen them.
    arrays[k] = v.astype(np.float32) if v.dtype.kind == "V" or v.dtype.name == "bfloat16" else v
  _write_atomically(path, lambda f: np.savez(f, **arrays))
  if config is not None:  # after the archive: a path that cannot be written fails there first
    saved = json.loads(ml_collections.ConfigDict(config).to_json_best_effort())
    if data_config is not None:
      saved[DATA_CONFIG_KEY] = dict(data_config)
    text = json.dumps(saved)
    _write_atomically(config_path(path), lambda f: f.write(text.encode()))


def _write_atomically(path: str, write: Any) -> None:
  """``write(file)`` into a temporary beside ``path``, then renamed onto it."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    with open(tmp, "wb") as f:
      write(f)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def check_tree(
  loaded: Mapping[str, Any], expected: Mapping[str, Any], source: str = "checkpoint"
) -> None:
  """Raises one ValueError listing missing keys, unexpected keys and shape mismatches."""

  def shapes(tree: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    flat = traverse_util.flatten_dict(nn.unbox(dict(tree)), sep="/")
    return {k: tuple(np.shape(v)) for k, v in flat.items()}

  got, want = shapes(loaded), shapes(expected)
  missing = sorted(want.keys() - got.keys())
  unexpected = sorted(got.keys() - want.keys())
  mismatched = sorted(
    f"{k}: {source} {got[k]} vs model {want[k]}"
    for k in got.keys() & want.keys()
    if got[k] != want[k]
  )
  if missing or unexpected or mismatched:
    lines = [f"The {source} does not fit the model:"]
    for title, items in (
      ("missing keys", missing),
      ("unexpected keys", unexpected),
      ("shape mismatches", mismatched),
    ):
      if items:
        lines.append(f"  {title} ({len(items)}):")
        lines.extend(f"    {item}" for item in items)
    raise ValueError("\n".join(lines))


# ---------------------------------------------------------- the `.npz` as a checkpoint


def read(
  path: str, model_name: Optional[str]
) -> tuple[
  models.Settings, Params, Optional[tuple[int, int]], Optional[data_config_lib.DataConfig]
]:
  """(model settings, per-layer params, image size, the preprocessing saved with it or None)
  of an official-layout `.npz`: the architecture ``model_name`` names, else our export's
  config beside it (`config_path`), else the one its array shapes say."""
  params = scanned_to_layers(load_npz(path))
  saved_data = None
  if model_name:
    # The registry leaves pre_logits out; official ImageNet-21k files have one.
    pre_logits = params.get("pre_logits")
    config = models.variant_settings(model_name).replace(
      representation_size=None if pre_logits is None else pre_logits["kernel"].shape[-1],
      classifier="token" if "cls" in params else "gap",
    )
  elif os.path.isfile(config_path(path)):
    config, saved_data = _saved_config(config_path(path))
  else:
    config = architecture.infer_settings(params)
    logging.info("%s: inferred architecture %s.", path, config.name)
  image = models.image_settings(config)  # an image-text export's image tower
  size = architecture.trained_image_size(models.image_params(params, config), image)
  data_config = None
  if saved_data is not None:
    data_config = data_config_lib.from_dict(saved_data, repr(config_path(path)))
    size = size or data_config.input_size  # a table resized to every input: the saved size
  return config, params, size, data_config


def _saved_config(path: str) -> tuple[models.Settings, Optional[dict[str, Any]]]:
  """The model settings of the config `save_npz` wrote beside an archive (a file of any
  age: options it predates at their defaults; checked by the fit check) and the data
  config saved in it (None in files written before it was)."""
  try:
    saved = json.loads(input_files.read_text(path, what="model config"))
  except json.JSONDecodeError as e:
    raise errors.CheckpointError(
      f"{path!r} is not JSON ({e.msg}, line {e.lineno}): remove it to infer the model from "
      "the arrays, or write it again with the archive."
    ) from None
  if not isinstance(saved, dict) or not isinstance(saved.get("transformer", {}), dict):
    raise errors.CheckpointError(
      f"{path!r} is not a model config: remove it to infer the model from the arrays."
    )
  saved_data = saved.pop(DATA_CONFIG_KEY, None)
  return models.model_settings(ml_collections.ConfigDict(saved)), saved_data


def read_tokenizer(path: str, config: models.Settings) -> Any:
  """The transformers tokenizer files an image-text export copied beside the archive, if
  any (`writer`); None for image models."""
  directory = os.path.dirname(path)
  if not models.is_two_tower(config):
    return None
  if tokenizer_kinds.FOLDER.find(directory) is None:
    return None
  return folder_tokenizer.read_folder_tokenizer(directory)


def writer(
  model: Any,
  *,
  image_size: tuple[int, int],  # pylint: disable=unused-argument  (the arrays say it)
  class_names: Optional[list[str]],  # pylint: disable=unused-argument  (labels.txt: writers)
  data_config: data_config_lib.DataConfig,
) -> Callable[[str], None]:
  """What writes ``model`` (a `sources.LoadedModel`) into a folder: `EXPORT_FILE` with
  its model config and ``data_config`` beside it, and an image-text model's tokenizer
  files copied from the transformers folder it was read from (nothing for one read from
  elsewhere)."""
  source = model.source if os.path.isdir(str(model.source)) else None
  names = tokenizer_kinds.FOLDER.files
  copied = [n for n in names if source and os.path.isfile(os.path.join(source, n))]

  def write(directory: str) -> None:
    save_npz(
      os.path.join(directory, EXPORT_FILE),
      model.params,
      config=models.to_config(model.config),
      data_config=data_config.to_dict(),
    )
    for name in copied:
      shutil.copyfile(os.path.join(source, name), os.path.join(directory, name))

  return write
