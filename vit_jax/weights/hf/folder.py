"""A transformers checkpoint folder's files, shared by its classes (`vit`, `two_tower`):
their names, ``config.json``'s ``model_type`` (which class a folder is), the safetensors
shards, the image processor, and the writing of a folder's files."""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import numpy as np

from vit_jax.infra import errors
from vit_jax.weights import files

SAFETENSORS = ".safetensors"
WEIGHTS = "model" + SAFETENSORS
CONFIG = files.HUB_CONFIG
PREPROCESSOR = "preprocessor_config.json"
PROCESSOR = "processor_config.json"  # transformers 5 saves the image processor in it
_DEFAULT_EPS = 1e-12  # transformers' ViTConfig default (google/vit-* say it too)


def directory(path: str) -> Optional[str]:
  """The folder a transformers checkpoint at ``path`` is: ``path`` itself, or the folder of
  a `.safetensors` file; None for anything else."""
  if os.path.isdir(path):
    return path
  return os.path.dirname(path) if path.endswith(SAFETENSORS) and os.path.isfile(path) else None


def model_type(directory: str) -> Optional[str]:
  """``config.json``'s ``model_type`` in ``directory``; None without one."""
  path = os.path.join(directory, CONFIG)
  if not os.path.isfile(path):
    return None
  found = files.read_json(path).get("model_type")
  return found if isinstance(found, str) else None


def read_tensors(directory: str) -> dict[str, np.ndarray]:
  """Every array of the folder's safetensors file, or of the shards its index names."""
  index = os.path.join(directory, WEIGHTS + ".index.json")
  if os.path.isfile(index):
    weight_map = files.read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
      raise errors.CheckpointError(f"{index!r} has no weight_map object: re-save the model.")
    shards = sorted({files.inside(directory, name, index) for name in weight_map.values()})
  elif os.path.isfile(os.path.join(directory, WEIGHTS)):
    shards = [os.path.join(directory, WEIGHTS)]
  else:
    raise errors.MissingError(
      f"No {WEIGHTS} in {directory!r} (pytorch_model.bin is not read: "
      "save the model with safe_serialization=True)."
    )
  tensors = {}
  for shard in shards:
    tensors.update(files.read_safetensors(shard))
  return tensors


def image_processor(directory: str) -> tuple[Optional[dict[str, Any]], str]:
  """The folder's image processor config and its file: ``preprocessor_config.json``, else
  ``processor_config.json``'s ``image_processor`` (what transformers 5 saves); None: none."""
  for name in (PREPROCESSOR, PROCESSOR):
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      found = files.read_json(path)
      found = found.get("image_processor", found) if name == PROCESSOR else found
      if isinstance(found, dict):
        return found, path
  return None, directory


def is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def layer_norm_eps(hf_config: dict[str, Any], path: str) -> float:
  """config.json's ``layer_norm_eps`` (transformers' default when absent), a positive number."""
  eps = hf_config.get("layer_norm_eps", _DEFAULT_EPS)
  if not is_number(eps) or not eps > 0:
    raise errors.CheckpointError(f"{path!r}: layer_norm_eps is {eps!r}, not a positive number.")
  return float(eps)


def write_files(
  directory: str, tensors: dict[str, np.ndarray], configs: dict[str, dict[str, Any]]
) -> None:
  """`WEIGHTS` (safetensors, marked for torch) and each JSON file of ``configs`` (by name)."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  save_file(tensors, os.path.join(directory, WEIGHTS), metadata={"format": "pt"})
  for name, content in configs.items():
    with open(os.path.join(directory, name), "w") as f:
      json.dump(content, f, indent=2)
