"""One example -> its row of a batch's images, on the host: read the file (a 'path'
source) or take the encoded bytes, decode, then the train crop and normalisation or the
eval image (`host_images`). What the decoding stage runs per example, in its threads
(`decode_stage`) or in its worker processes (`decode_workers`); it imports neither Grain
nor TensorFlow, so a worker process starts with it alone.
"""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from vit_jax.data import filesystems, host_images
from vit_jax.data.settings import Settings
from vit_jax.infra import input_files


def _name(path: Any) -> str:
  return path.decode() if isinstance(path, bytes) else str(path)


def _too_large() -> OSError:
  return OSError(f"more than {input_files.MAX_IMAGE_BYTES:,} bytes, larger than an image may be")


def read_bytes(path: Any) -> bytes:
  """A 'path' source's file (local, or remote through `filesystems`), at most
  `input_files.MAX_IMAGE_BYTES` (OSError else)."""
  data = filesystems.read_head(_name(path), input_files.MAX_IMAGE_BYTES + 1)
  if len(data) > input_files.MAX_IMAGE_BYTES:
    raise _too_large()
  return data


class ReadAhead:
  """The remote files among a group of 'path' values, read at once (a bucket's requests
  take tens of milliseconds: one after another, a worker would wait on each); `data(k)` is
  value k's bytes, or None for a local file, read when decoded."""

  def __init__(self, values: list[Any]):
    names = [_name(v) for v in values]
    remote = [k for k, name in enumerate(names) if not input_files.is_local(name)]
    self._remote = {k: i for i, k in enumerate(remote)}  # value -> its read
    self._reads = None
    if remote:
      paths = [names[k] for k in remote]
      self._reads = filesystems.RemoteReads(paths, input_files.MAX_IMAGE_BYTES)

  def __bool__(self) -> bool:
    return self._reads is not None

  def data(self, k: int) -> bytes | None:
    """Value k's file (OSError when missing or larger than an image may be), None where
    it is local; a storage failure is a StorageError."""
    if k not in self._remote:
      return None
    data = self._reads.get(self._remote[k])
    if data is None:
      raise _too_large()
    return data


class Preprocessing:
  """Preprocessing of one split's examples: train (crop, flip) or eval."""

  def __init__(self, settings: Settings, kind: str, train: bool):
    self.settings, self.kind, self.train = settings, kind, train
    self.shape = settings.image_shape  # of one row
    cv2.setNumThreads(1)  # The stage's threads or processes are the parallelism.
    if not train:
      host_images.check_eval_config(settings.eval_data_config())

  def is_remote(self, value: Any) -> bool:
    """Whether ``value`` is the path of a file on a bucket (a URL other than file://)."""
    return self.kind == "path" and not input_files.is_local(_name(value))

  def read_ahead(self, values: list[Any]) -> ReadAhead | None:
    """The remote files of a group of examples' values, being read at once; None when
    there are none (the values are encoded images, or local paths)."""
    if self.kind != "path":
      return None
    ahead = ReadAhead(values)
    return ahead if ahead else None

  def image(
    self, value: Any, uid: int, out: np.ndarray | None = None, data: bytes | None = None
  ) -> np.ndarray:
    """One example's batch row, float32 [crop, crop, 3], written into ``out`` where given:
    the train crop, normalised (or rounded, with RandAugment) in place, or the eval image.
    ``data``: the file of a 'path' value, read already (`read_ahead`). ValueError or
    OSError when it fails."""
    if data is None:
      data = read_bytes(value) if self.kind == "path" else bytes(value)
    s = self.settings
    if s.naflex is not None:
      return self._naflex(data, uid, out)
    if not self.train:
      return host_images.eval_image(data, s.eval_data_config(), out)
    rng = host_images.example_rng(s.seed, uid)
    pixels = host_images.train_crop(
      data, rng, crop=s.crop, min_area=s.min_area, flip=s.flip, out=out
    )
    s.train_images.encode_into(pixels, pixels)
    return pixels

  def _naflex(self, data: bytes, uid: int, out: np.ndarray | None) -> np.ndarray:
    """NaFlex's packed row (`Settings.naflex`): in training the inception crop's window at
    its own aspect ratio (flipped as the square crop is), in evaluation the whole image."""
    s = self.settings
    if self.train:
      rng = host_images.example_rng(s.seed, uid)
      pixels = host_images.train_window(data, rng, min_area=s.min_area, flip=s.flip)
      mean, std = s.input_mean, s.input_std
    else:
      pixels = host_images.decode(data)
      mean, std = s.eval_data_config().mean, s.eval_data_config().std
    return s.naflex.pack_into(pixels, mean, std, out)

  def reason(self, value: Any, uid: int) -> str:
    """Why the example fails; "" when it does not (any more)."""
    try:
      self.image(value, uid)
    except (ValueError, OSError) as e:
      return str(e).strip().splitlines()[0]
    return ""
