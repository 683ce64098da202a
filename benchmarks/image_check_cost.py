r"""What the image header check costs the `folder:` input pipeline: CPU time per image.

    python benchmarks/image_check_cost.py [--images=1000] [--size=256] [--repeats=3]

Writes ``--images`` random RGB JPEGs of ``--size`` pixels to a temporary folder, then maps
their paths through tf.data as the eval pipeline does (read, decode, resize to 224,
normalise), with and without `vit_jax.data.decodable.decodable` before decoding, and
prints the process's CPU time (user + system) per image of each, ``--repeats`` times
alternately. CPU time, not wall time: on a shared machine it varies less. Also prints
the Python check alone (`image_header.decodable`) per file.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import timeit

import numpy as np
import tensorflow as tf
from PIL import Image

from vit_jax.data import data_config, decodable, image_header, preprocess


def cpu_seconds() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def cpu_us_per_image(paths: list[str], check: bool) -> float:
  def example(path: tf.Tensor) -> tf.Tensor:
    data = tf.io.read_file(path)
    image = decodable.decodable(data) if check else data
    return preprocess.eval_image(image, data_config.official((224, 224)))

  ds = tf.data.Dataset.from_tensor_slices(paths)
  ds = ds.map(example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).batch(100)
  start = cpu_seconds()
  for _ in ds:
    pass
  return 1e6 * (cpu_seconds() - start) / len(paths)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--images", type=int, default=1000)
  parser.add_argument("--size", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  with tempfile.TemporaryDirectory() as folder:
    paths = []
    for i in range(args.images):
      paths.append(os.path.join(folder, f"{i}.jpg"))
      pixels = rng.integers(0, 256, (args.size, args.size, 3), np.uint8)
      Image.fromarray(pixels).save(paths[-1], quality=90)
    with open(paths[0], "rb") as f:
      blob = f.read()
    alone = timeit.timeit(lambda: image_header.decodable(blob), number=10_000) / 10_000
    print(f"image_header.decodable alone: {alone * 1e6:.1f} us per file")
    cpu_us_per_image(paths, True)  # traces both functions and warms the file cache
    cpu_us_per_image(paths, False)
    for _ in range(args.repeats):
      without, with_check = cpu_us_per_image(paths, False), cpu_us_per_image(paths, True)
      print(f"CPU per image: {without:.0f} us without the check, {with_check:.0f} us with it")


if __name__ == "__main__":
  main()
