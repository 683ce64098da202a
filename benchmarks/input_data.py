"""The input benchmarks' data: photo-like JPEGs written to a class folder, and the run
config that reads them (`input_pipeline.py` and its modes, `input_rows.py`).

The JPEGs are ~500x375 with smooth random structure, a gradient and sensor-like noise, so
they compress (~60 KiB) and decode like photographs rather than like flat images.
"""

from __future__ import annotations

import io
import os
import sys
from typing import Any

import numpy as np
from PIL import Image

# `configs/` and `vit_jax/` are folders of the repository, not installed packages.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NUM_CLASSES = 10
SIZE = (500, 375)  # width, height


def photo_jpeg(rng: np.random.Generator, size=SIZE, quality: int = 90) -> bytes:
  """A photo-like JPEG: smooth random structure over a gradient, plus sensor-like noise."""
  width, height = size
  coarse = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
  smooth = np.asarray(Image.fromarray(coarse).resize(size, Image.BICUBIC), np.float32)
  ramp = np.linspace(-40, 40, width, dtype=np.float32)[None, :, None] * rng.uniform(-1, 1, 3)
  pixels = np.clip(smooth + ramp + rng.normal(0, 8, (height, width, 3)), 0, 255)
  out = io.BytesIO()
  Image.fromarray(pixels.astype(np.uint8)).save(out, "JPEG", quality=quality)
  return out.getvalue()


def write_jpeg_folder(root: str, num_images: int, classes: int = NUM_CLASSES) -> float:
  """Writes <root>/{train,test}/class_<k>/*.jpg (`classes` test images); returns the mean
  file size in KiB."""
  rng = np.random.default_rng(0)
  total = 0
  for split, count in (("train", num_images), ("test", classes)):
    for k in range(count):
      folder = os.path.join(root, split, f"class_{k % classes}")
      os.makedirs(folder, exist_ok=True)
      jpeg = photo_jpeg(rng)
      with open(os.path.join(folder, f"{k:05d}.jpg"), "wb") as f:
        f.write(jpeg)
      total += len(jpeg)
  return total / (num_images + classes) / 1024


def folder_files(root: str, split: str) -> tuple[list[str], list[int]]:
  """(paths, labels) of `write_jpeg_folder`'s `split`, sorted by path."""
  folder = os.path.join(root, split)
  paths, labels = [], []
  for label, name in enumerate(sorted(os.listdir(folder))):
    for file in sorted(os.listdir(os.path.join(folder, name))):
      paths.append(os.path.join(folder, name, file))
      labels.append(label)
  return paths, labels


def run_config(dataset: str, crop: int, batch: int, **overrides: Any) -> Any:
  """configs/common.py's defaults with this benchmark's data keys (train/test splits,
  `crop`, train and eval batch `batch`)."""
  from configs import common  # The run defaults import JAX: only rows that run it.

  config = common.get_config()
  keys = dict(dataset=dataset, train_split="train", test_split="test", pp=dict(crop=crop))
  config.update(dict(keys, batch=batch, batch_eval=batch, **overrides))
  return config
