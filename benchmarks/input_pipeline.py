"""Input pipeline throughput: images/s of the train and eval pipelines from JPEG folders.

Writes a folder of synthetic photo-like JPEGs (~500x375, smooth structure plus noise,
so they compress like photographs rather than like white noise) into a temporary
directory, then times `vit_jax.data.train_iterator` / `eval_iterator` end to end
(read, decode, crop/resize, normalise, batch, global jax.Array on the local devices)
at each crop size; eval times one pass over the same images read several times. Prints a
table: total images/s and images/s per CPU core.

  python benchmarks/input_pipeline.py [--images 400] [--batch 64] [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import jax
import ml_collections
import numpy as np
from PIL import Image

from vit_jax import data


def write_jpeg_folder(
  root: str, num_images: int, size=(500, 375), classes: int = 10, seed: int = 0
) -> float:
  """Writes <root>/{train,test}/<class>/*.jpg; returns the mean file size in KiB."""
  rng = np.random.default_rng(seed)
  total = 0
  for split, count in (("train", num_images), ("test", classes)):
    for k in range(count):
      coarse = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
      smooth = np.asarray(Image.fromarray(coarse).resize(size, Image.BICUBIC), np.float32)
      pixels = np.clip(smooth + rng.normal(0, 8, smooth.shape), 0, 255).astype(np.uint8)
      folder = os.path.join(root, split, f"class_{k % classes}")
      os.makedirs(folder, exist_ok=True)
      path = os.path.join(folder, f"{k:05d}.jpg")
      Image.fromarray(pixels).save(path, quality=90)
      total += os.path.getsize(path)
  return total / (num_images + classes) / 1024


def _config(root: str, crop: int, batch: int) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(
    dict(
      dataset=f"folder:{root}",
      data_dir=None,
      manual_dir=None,
      train_split="train",
      test_split="test",
      num_classes=None,
      pp=dict(crop=crop, min_area=0.05, flip=True),
      batch=batch,
      batch_eval=batch,
      shuffle_buffer=10_000,
      prefetch=2,
      seed=0,
      skip_corrupt_images=False,
    )
  )


def _train_rate(config, mesh, steps: int, warmup: int = 3) -> float:
  """Images/s over `steps` train batches after `warmup` (tf.data start-up)."""
  batches = data.train_iterator(config, mesh)
  for _ in range(warmup):
    jax.block_until_ready(next(batches))
  start, images = time.perf_counter(), 0
  for _ in range(steps):
    images += jax.block_until_ready(next(batches))["image"].shape[0]
  return images / (time.perf_counter() - start)


def _eval_rate(config, mesh, examples: int, images: int) -> float:
  """Real (mask 1) images/s of one eval pass over about `examples` examples.

  The pass reads the train split several times over ('train+train+...'), so that it is
  long enough to time; a short pass over 'train' warms up first.
  """
  list(data.eval_iterator(config, mesh, split="train"))
  repeats = max(1, -(-examples // images))
  evaluation = data.eval_iterator(config, mesh, split="+".join(["train"] * repeats))
  start, count = time.perf_counter(), 0.0
  for batch in evaluation:
    count += float(jax.block_until_ready(batch["mask"]).sum())
  return count / (time.perf_counter() - start)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--images", type=int, default=400, help="train images written")
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--steps", type=int, default=20, help="timed batches per row")
  parser.add_argument("--crops", type=int, nargs="+", default=[224, 384])
  args = parser.parse_args()

  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(-1, 1), ("data", "model"))
  with tempfile.TemporaryDirectory() as root:
    kib = write_jpeg_folder(root, args.images)
    print(
      f"{args.images} train JPEGs of 500x375 (mean {kib:.0f} KiB), batch "
      f"{args.batch}, {args.steps} timed batches, {cores} CPU cores, "
      f"devices: {jax.device_count()} x {jax.devices()[0].platform}\n"
    )
    print("| pipeline | crop | images/s | images/s per core |")
    print("|---|---|---|---|")
    for crop in args.crops:
      config = _config(root, crop, args.batch)
      for name, rate in (
        ("train", _train_rate(config, mesh, args.steps)),
        ("eval", _eval_rate(config, mesh, args.steps * args.batch, args.images)),
      ):
        print(f"| {name} | {crop} | {rate:.0f} | {rate / cores:.0f} |", flush=True)


if __name__ == "__main__":
  main()
