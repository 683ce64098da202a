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

from vit_jax import input_files
from vit_jax.data import filesystems, host_images
from vit_jax.data.dataset import Settings


def read_bytes(path: Any) -> bytes:
  """A 'path' source's file (local, or remote through `filesystems`), at most
  `input_files.MAX_IMAGE_BYTES` (OSError else)."""
  name = path.decode() if isinstance(path, bytes) else str(path)
  data = filesystems.read_head(name, input_files.MAX_IMAGE_BYTES + 1)
  if len(data) > input_files.MAX_IMAGE_BYTES:
    raise OSError(f"more than {input_files.MAX_IMAGE_BYTES:,} bytes, larger than an image may be")
  return data


class Preprocessing:
  """Preprocessing of one split's examples: train (crop, flip) or eval."""

  def __init__(self, settings: Settings, kind: str, train: bool):
    self.settings, self.kind, self.train = settings, kind, train
    self.shape = (settings.crop, settings.crop, 3)  # of one row
    cv2.setNumThreads(1)  # The stage's threads or processes are the parallelism.
    if not train:
      host_images.check_eval_config(settings.eval_data_config())

  def image(self, value: Any, uid: int, out: np.ndarray | None = None) -> np.ndarray:
    """One example's batch row, float32 [crop, crop, 3], written into ``out`` where given:
    the train crop, normalised (or rounded, with RandAugment) in place, or the eval image.
    ValueError or OSError when it fails."""
    data = read_bytes(value) if self.kind == "path" else bytes(value)
    s = self.settings
    if not self.train:
      return host_images.eval_image(data, s.eval_data_config(), out)
    rng = host_images.example_rng(s.seed, uid)
    pixels = host_images.train_crop(
      data, rng, crop=s.crop, min_area=s.min_area, flip=s.flip, out=out
    )
    host_images.normalize_into(pixels, pixels, s.randaug is not None, s.input_mean, s.input_std)
    return pixels

  def reason(self, value: Any, uid: int) -> str:
    """Why the example fails; "" when it does not (any more)."""
    try:
      self.image(value, uid)
    except (ValueError, OSError) as e:
      return str(e).strip().splitlines()[0]
    return ""
