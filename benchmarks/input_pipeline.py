"""Input pipeline throughput: images/s (and bytes read) of the train and eval pipelines.

Each mode runs on data it writes itself: photo-like JPEGs (~500x375, smooth structure,
gradients and noise, so they compress like photographs, ~60 KiB; `input_data.py`). The
tf.data rows are the benchmark's own plain tf.data pipeline (`tf_input.py`).

  * Default (`input_folder.py`): a JPEG folder; times `vit_jax.data.train_iterator` /
    `eval_iterator` end to end (read, decode, crop/resize, normalise, batch, global
    jax.Array) at each crop, and the train pipeline again with RandAugment
    (`config.pp.randaug`, `--randaug`, default (2, 10)); the rows alternate within each of
    `--rounds` rounds.

      python benchmarks/input_pipeline.py [--images 400] [--batch 64] [--steps 20] \
        [--rounds 3] [--randaug 2 10]

  * `--randaug-cost` (`input_randaug.py`): CPU milliseconds per image (one thread) of the
    package's train preprocessing of one such JPEG at `--crops`[0], without and with
    RandAugment `--randaug`, beside the plain tf.data train map and, where timm is
    installed, timm's train transform with Pillow, without and with its RandAugment; then
    the train step's RandAugment on the default JAX device.

      python benchmarks/input_pipeline.py --randaug-cost [--rounds 3] [--randaug 2 10]

  * `--tfds` (`input_tfds.py`): a tfds dataset of such JPEGs in 4 shards, prepared as
    TFRecord and as ArrayRecord (preparation time and size are printed), read by the
    package's train pipeline at the shuffle window the defaults give at `--paper-batch`
    (config.shuffle_buffer // paper batch examples per lane, reproduced at `--batch` by
    shuffle_buffer = window x batch), beside the plain tf.data pipeline (tfds.load,
    shuffle, the parallel train map, batch, prefetch) and a Grain pipeline over the
    ArrayRecord data source with the same map. Each row runs in fresh processes (1, and 4
    reading a quarter each); images/s, CPU time per image, and the bytes read per example
    against the stored bytes.

      python benchmarks/input_pipeline.py --tfds [--images 6000] [--batch 128] [--rounds 3]

  * `--compare` (`input_rows.py`): train: the plain tf.data pipeline, the package's Grain
    stage and a torch `DataLoader` (torchvision decode, the same crop); eval: the plain
    tf.data eval and the package's `eval_iterator`; on `--images` JPEGs (default 6,000;
    `--smoke`: 600), images/s and images per CPU-second, rows interleaved.

      python benchmarks/input_pipeline.py --compare [--smoke] [--workers 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

# `benchmarks/` is a folder of the repository, imported as a namespace package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import input_data, input_folder, input_randaug, input_rows, input_tfds  # noqa: E402


def compare_case(args: argparse.Namespace) -> None:
  images = args.images or (600 if args.smoke else 6000)
  batch, steps = args.batch or 128, args.steps if not args.smoke else 4
  workers = args.workers or len(os.sched_getaffinity(0))
  with tempfile.TemporaryDirectory() as root:
    kib = input_data.write_jpeg_folder(root, images)
    print(f"{images} train JPEGs of 500x375 (mean {kib:.0f} KiB), batch {batch}, {steps} timed")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    input_rows.compare(root, workers, batch, steps, args.rounds)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tfds", action="store_true", help="the tfds case (see above)")
  parser.add_argument("--compare", action="store_true", help="tf.data, Grain, DataLoader; eval")
  parser.add_argument("--smoke", action="store_true", help="compare: 600 images, 4 steps")
  parser.add_argument("--workers", type=int, default=None, help="compare: cores (all)")
  parser.add_argument("--images", type=int, default=None, help="train images written")
  parser.add_argument("--batch", type=int, default=None)
  parser.add_argument("--steps", type=int, default=20, help="folder case: timed batches")
  parser.add_argument("--crops", type=int, nargs="+", default=[224, 384])
  parser.add_argument("--root", default="/tmp/vit_jax_photos", help="tfds case: data")
  parser.add_argument("--paper-batch", type=int, default=4096, help="gives the window")
  parser.add_argument("--rounds", type=int, default=3, help="rows alternate in each round")
  parser.add_argument(
    "--randaug", type=int, nargs=2, default=[2, 10], help="folder case: (layers, magnitude)"
  )
  parser.add_argument("--epochs", type=float, default=2, help="tfds case: timed epochs")
  parser.add_argument("--bytes-epochs", type=float, default=5, help="0: no bytes table")
  parser.add_argument("--processes", type=int, nargs="+", default=[1, 4])
  parser.add_argument(
    "--rows",
    type=lambda s: tuple(s.split(":")),
    nargs="+",
    default=[("plain", "tfrecord"), ("ours", "tfrecord"), ("ours", "array_record")],
    help="pipeline:format pairs (plain, ours, ours@/other/checkout, grain: needs grain)",
  )
  parser.add_argument("--randaug-cost", action="store_true", help="RandAugment's cost")
  parser.add_argument("--device-batch", type=int, default=64, help="randaug-cost: step batch")
  parser.add_argument("--device-repeats", type=int, default=10, help="randaug-cost: timed calls")
  parser.add_argument(
    "--step-model", default=None, help="randaug-cost: also time this model's train step"
  )
  parser.add_argument("--worker", help=argparse.SUPPRESS)
  parser.add_argument("--timm-worker", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--barrier", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.timm_worker:
    input_randaug.timm_worker(args)
  elif args.compare:
    compare_case(args)
  elif args.randaug_cost:
    input_randaug.randaug_cost_case(args)
  elif not args.tfds:
    args.images, args.batch = args.images or 400, args.batch or 64
    input_folder.folder_case(args)
  else:
    args.images, args.batch = args.images or 6000, args.batch or 128
    input_tfds.worker(args) if args.worker else input_tfds.tfds_case(args)


if __name__ == "__main__":
  main()
