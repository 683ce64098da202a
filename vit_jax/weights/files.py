"""The files a weights source is made of, read with every check before their bytes are used.

A checkpoint folder may come from anywhere (a hub repository is downloaded as it is), so
its files are input, not trusted: each must be a regular file under a stated size (a FIFO,
a device or a multi-gigabyte config never hangs or fills memory), JSON must parse to what
it claims to be, a safetensors header must describe arrays that lie inside the file, its
arrays must be floating point (integer weights are quantised or foreign: refused, never
cast), and a file named by an index (`model.safetensors.index.json`'s ``weight_map``)
must stay inside its folder. Each problem is one `CheckpointError` naming the file.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import numpy as np

from vit_jax.infra import errors, input_files

HUB_CONFIG = "config.json"  # a hub folder's config: transformers' model, timm's architecture
MAX_JSON_BYTES = 16 * 2**20  # configs and indexes are kilobytes
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit for the JSON header
_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors' names


def regular_file(path: str, max_bytes: int | None = None) -> int:
  """The size of ``path`` when it is a regular file (links followed) within ``max_bytes``."""
  return input_files.regular_file(
    path, max_bytes, what="checkpoint file", error=errors.CheckpointError
  )


def read_json(path: str) -> dict[str, Any]:
  """The JSON object in ``path``; a non-object, invalid JSON or text, or a large file is
  one error naming it."""
  regular_file(path, MAX_JSON_BYTES)
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    raise errors.CheckpointError(f"{path!r} is not valid JSON ({e}).") from e
  if not isinstance(value, dict):
    raise errors.CheckpointError(
      f"{path!r} holds a JSON {type(value).__name__}, not an object: not a checkpoint config."
    )
  return value


def field(config: dict[str, Any], key: str, kind: type, path: str) -> Any:
  """``config[key]`` when it is a ``kind`` (an int is not a bool); else one error naming it."""
  value = config.get(key)
  if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
    raise errors.CheckpointError(
      f"{path!r}: {key} is {value!r}, not {'an' if kind is int else 'a'} {kind.__name__}."
    )
  return value


def inside(directory: str, name: Any, index: str) -> str:
  """The path of ``name`` (from the file ``index``) in ``directory``; a name that is not a
  plain relative path inside it (absolute, ``..``, a link out) is an error."""
  if not isinstance(name, str) or not name or os.path.isabs(name):
    raise errors.CheckpointError(f"{index!r} names {name!r}, not a file inside its folder.")
  root = os.path.realpath(directory)
  path = os.path.realpath(os.path.join(root, name))
  if os.path.commonpath([root, path]) != root:
    raise errors.CheckpointError(
      f"{index!r} names {name!r}, which lies outside {directory!r}: refused."
    )
  return path


def _check_safetensors_header(path: str, size: int) -> dict[str, Any]:
  """The header of ``path`` (``size`` bytes); raises when it is truncated or lies: every
  array's byte range inside the file, every dtype floating point."""
  with open(path, "rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise errors.CheckpointError(f"{path!r} is not a safetensors file (truncated).")
    (length,) = struct.unpack("<Q", head)
    if length > min(MAX_HEADER_BYTES, size - 8):
      raise errors.CheckpointError(
        f"{path!r} is not a safetensors file (its header claims {length:,} bytes of {size:,})."
      )
    try:
      header = json.loads(f.read(length))
    except (ValueError, UnicodeDecodeError) as e:
      raise errors.CheckpointError(f"{path!r} has a damaged safetensors header ({e}).") from e
  if not isinstance(header, dict):
    raise errors.CheckpointError(f"{path!r} has a damaged safetensors header (not an object).")
  data_bytes = size - 8 - length
  for name, entry in header.items():
    if name == "__metadata__":
      continue
    offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
    if (
      not isinstance(offsets, list)
      or len(offsets) != 2
      or not all(isinstance(o, int) for o in offsets)
      or not 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
      raise errors.CheckpointError(
        f"{path!r}: array {name!r} lies outside the file (data_offsets {offsets}, "
        f"{data_bytes:,} bytes of data): the file is truncated or damaged."
      )
    if entry.get("dtype") not in _FLOAT_DTYPES:
      raise errors.CheckpointError(
        f"{path!r}: array {name!r} is {entry.get('dtype')}, not floating point (quantised "
        "or not model weights); save float weights (F32, F16 or BF16)."
      )
  return header


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """The arrays of the safetensors file ``path``, after the header checks (module doc)."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

  size = regular_file(path)
  header = _check_safetensors_header(path, size)
  if any(isinstance(e, dict) and e.get("dtype") == "BF16" for e in header.values()):
    return _read_with_bfloat16(path, header)
  try:
    return load_file(path)
  except Exception as e:  # pylint: disable=broad-except  (safetensors' own error types)
    raise errors.CheckpointError(f"{path!r} cannot be read as safetensors: {e}.") from e


def _read_with_bfloat16(path: str, header: dict[str, Any]) -> dict[str, np.ndarray]:
  """The arrays of a checked safetensors file holding bfloat16 ones, which numpy's
  safetensors reader cannot name: each read at its byte range in its stored dtype
  (`ml_dtypes.bfloat16`, JAX's), cast only when the model takes it."""
  import ml_dtypes  # pylint: disable=g-import-not-at-top  (a JAX dependency)

  dtypes = {"F16": "<f2", "BF16": ml_dtypes.bfloat16, "F32": "<f4", "F64": "<f8"}
  with open(path, "rb") as f:
    (length,) = struct.unpack("<Q", f.read(8))
    data = f.read()[length:]
  arrays = {}
  for name, entry in header.items():
    if name == "__metadata__":
      continue
    start, end = entry["data_offsets"]
    dtype = np.dtype(dtypes[entry["dtype"]])
    shape = tuple(entry.get("shape", ()))
    if end - start != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
      raise errors.CheckpointError(f"{path!r}: array {name!r} does not fill its byte range.")
    arrays[name] = np.frombuffer(data[start:end], dtype).reshape(shape)
  return arrays
