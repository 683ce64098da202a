"""A timm checkpoint's folder both ways, numpy only: a timm folder or `.safetensors` file ->
our model settings and parameters (`read`), and the export's folder (`write_dir`).

A timm checkpoint is a `model.safetensors` (timm's state dict) with, from the hub or
`timm.models.save_for_hf`, a `config.json` naming the architecture (``architecture``,
``model_args``, ``global_pool``, ``pretrained_cfg`` with the input ``mean``/``std``), or
with our export's `timm_model.json` (`SPEC`: the `timm.create_model` name and keyword
arguments that rebuild the architecture). What the arrays do not say comes from the
config's ``model_args``, else from the arguments timm registers for the architecture name
(`names`); the name is checked first (`expressible.check_timm`), then the family the
registry picks (`families.for_checkpoint`: by the state dict's stem, else the name's timm
module) reads the arrays. Pickled checkpoints (`.bin`, `.pth`) are never read
(`vit_jax.weights.sources`).

The export writes `WEIGHTS` with timm's key names, timm's own `config.json`
(``timm.create_model('local-dir:DIR')`` loads the folder as it is; its ``pretrained_cfg``
states the model's input size, crop, interpolation, mean and std, which timm's
`resolve_data_config` reads) and `SPEC`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import numpy as np

from vit_jax import models
from vit_jax.data import data_config as data_config_lib
from vit_jax.data.data_config import DataConfig
from vit_jax.infra import errors
from vit_jax.weights import files
from vit_jax.weights.timm import arguments, expressible, families, names

WEIGHTS = "model.safetensors"
SPEC = "timm_model.json"
CONFIG = files.HUB_CONFIG  # timm's hub config (architecture, model_args, pretrained_cfg)


def is_timm_config(path: str) -> bool:
  """Whether ``path`` is timm's hub `config.json` (it names an ``architecture``)."""
  if not os.path.isfile(path):
    return False
  return "architecture" in files.read_json(path)


def is_timm_dir(path: str) -> bool:
  spec = os.path.isfile(os.path.join(path, SPEC))
  return spec or is_timm_config(os.path.join(path, CONFIG))


def _arguments(directory: str) -> tuple[str, dict[str, Any], Optional[list[str]], dict[str, Any]]:
  """(architecture, model arguments, class names, pretrained config) from the config beside
  the weights; the arguments are the family's defaults updated with the stored ones."""
  spec_path, config_path = (os.path.join(directory, n) for n in (SPEC, CONFIG))
  if os.path.isfile(spec_path):  # our export
    spec = files.read_json(spec_path)
    # model_name None: a Mixer of a shape timm has no name for (built as its class).
    name = spec.get("model_name")
    if not isinstance(name, (str, type(None))) or not isinstance(spec.get("kwargs"), dict):
      raise errors.CheckpointError(f"{spec_path!r} has no model_name and kwargs: re-export it.")
    overlay = _object(spec, "pretrained_cfg_overlay", spec_path)
    name = name or ""
    args = {**names.model_args(name), **spec["kwargs"]}
    if "act_layer" in spec:  # a Mixer's, given apart (timm's MlpMixer takes a class)
      args["act_layer"] = spec["act_layer"]
    return name, args, None, overlay
  if is_timm_config(config_path):
    config = files.read_json(config_path)
    if not isinstance(config["architecture"], str):
      raise errors.CheckpointError(f"{config_path!r}: architecture must be a name.")
    name = config["architecture"]
    args = {**names.model_args(name), **_object(config, "model_args", config_path)}
    if config.get("global_pool") is not None:
      args["global_pool"] = config["global_pool"]
    labels = config.get("label_names")
    named = isinstance(labels, list) and all(isinstance(n, str) for n in labels)
    if labels is not None and not named:
      raise errors.CheckpointError(f"{config_path!r}: label_names must be a list of names.")
    return name, args, labels, _object(config, "pretrained_cfg", config_path)
  return "", {}, None, {}


def read_data_config(
  directory: str, config: models.Settings, image_size: tuple[int, int]
) -> data_config_lib.DataConfig:
  """The eval preprocessing of timm's ``pretrained_cfg`` beside the weights (timm's
  defaults for what it leaves out; the mean and std the model config read from it)."""
  pretrained_cfg = _arguments(directory)[3]
  config = models.model_settings(config)
  stats = {"mean": list(config.input_mean), "std": list(config.input_std)}
  return data_config_lib.from_timm({**pretrained_cfg, **stats}, image_size)


def _object(config: dict[str, Any], key: str, path: str) -> dict[str, Any]:
  """``config[key]`` as a dict (absent or null: empty); anything else is one error."""
  value = config.get(key) or {}
  if not isinstance(value, dict):
    raise errors.CheckpointError(f"{path!r}: {key} is {value!r}, not an object.")
  return dict(value)


def read(path: str) -> arguments.Loaded:
  """(model settings, per-layer params, class names or None, image size) of a timm
  `.safetensors` file or a directory holding `model.safetensors`: the name checked, then
  read by its family."""
  directory, weights = (
    (path, os.path.join(path, WEIGHTS)) if os.path.isdir(path) else (os.path.dirname(path), path)
  )
  timm_name, args, class_names, pretrained_cfg = _arguments(directory)
  expressible.check_timm(timm_name, repr(path))
  if not os.path.isfile(weights):
    raise errors.CheckpointError(
      f"No {WEIGHTS} in {directory!r} (a pickled pytorch_model.bin is not read: "
      "save the state dict with safetensors.torch.save_file first)."
    )
  tensors = files.read_safetensors(weights)
  family = families.for_checkpoint(names.module(timm_name), tensors)
  checkpoint = arguments.Checkpoint(
    tensors, timm_name, args, class_names, pretrained_cfg, repr(path)
  )
  return family.read(checkpoint)


def hub_config(spec: dict[str, Any]) -> Optional[dict[str, Any]]:
  """timm's own `config.json` (the hub's layout, what ``timm.create_model('local-dir:DIR')``
  reads) of an export's ``spec``: the architecture name, its arguments, the pooling and
  the overlay as ``pretrained_cfg`` (`write_dir` puts the data config in it).
  None for a shape timm has no name for or an activation timm's config cannot name (a
  tanh-GELU Mixer): `SPEC` rebuilds those."""
  if not spec.get("model_name") or "act_layer" in spec:  # a tanh Mixer: timm takes a class
    return None
  args = dict(spec["kwargs"])
  config = {
    "architecture": spec["model_name"],
    "num_classes": args["num_classes"],
    "model_args": args,
    "pretrained_cfg": spec["pretrained_cfg_overlay"],
  }
  if "global_pool" in args:
    config["global_pool"] = args["global_pool"]
  return config


def write_dir(
  directory: str, tensors: dict[str, np.ndarray], spec: dict[str, Any], data_config: DataConfig
) -> None:
  """The export's folder: `WEIGHTS`, `SPEC` (the create_model arguments, with the data
  config in its overlay) and, for a named architecture, timm's `config.json`."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  spec = {
    **spec,
    "pretrained_cfg_overlay": {**spec["pretrained_cfg_overlay"], **data_config.to_timm()},
  }
  save_file(tensors, os.path.join(directory, WEIGHTS))
  written = {SPEC: spec, CONFIG: hub_config(spec)}
  for name, content in written.items():
    if content is not None:
      with open(os.path.join(directory, name), "w") as f:
        json.dump(content, f, indent=2)
