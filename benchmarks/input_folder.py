"""`input_pipeline.py`'s default mode: the package's train and eval pipelines end to end
(read, decode, crop/resize, normalise, batch, global jax.Array) on a JPEG folder, at each
crop, the train pipeline also with RandAugment (`config.pp.randaug`); the rows alternate
within each round."""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from benchmarks import input_data


def _train_rate(config, mesh, steps: int, warmup: int = 3) -> float:
  """Images/s over `steps` train batches after `warmup` (the pipeline's start-up)."""
  import jax

  from vit_jax import data

  batches = data.train_iterator(data.Settings.from_config(config), mesh)
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
  import jax

  from vit_jax import data

  list(data.eval_iterator(config, mesh, split="train"))
  repeats = max(1, -(-examples // images))
  evaluation = data.eval_iterator(config, mesh, split="+".join(["train"] * repeats))
  start, count = time.perf_counter(), 0.0
  for batch in evaluation:
    count += float(jax.block_until_ready(batch["mask"]).sum())
  return count / (time.perf_counter() - start)


def folder_case(args: argparse.Namespace) -> None:
  import jax

  cores = len(os.sched_getaffinity(0))
  mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(-1, 1), ("data", "model"))
  randaug = (args.randaug[0], float(args.randaug[1]))
  rows = (("train", None), (f"train, randaug{randaug}", randaug), ("eval", None))
  with tempfile.TemporaryDirectory() as root:
    kib = input_data.write_jpeg_folder(root, args.images)
    print(
      f"{args.images} train JPEGs of 500x375 (mean {kib:.0f} KiB), batch "
      f"{args.batch}, {args.steps} timed batches, {cores} CPU cores, "
      f"devices: {jax.device_count()} x {jax.devices()[0].platform}\n"
    )
    rates: dict = {}
    for round_ in range(args.rounds):
      for crop in args.crops:
        for name, pp_randaug in rows:
          pp = dict(crop=crop, randaug=pp_randaug)
          config = input_data.run_config(
            f"folder:{root}", crop, args.batch, shuffle_buffer=10_000, pp=pp
          )
          load = os.getloadavg()[0]
          if name == "eval":
            rate = _eval_rate(config, mesh, args.steps * args.batch, args.images)
          else:
            rate = _train_rate(config, mesh, args.steps)
          rates.setdefault((name, crop), []).append(rate)
          print(f"round {round_} {name} {crop}: {rate:.0f} img/s (load {load:.1f})", flush=True)
    print("\n| pipeline | crop | images/s per round | median per core | median / train |")
    print("|---|---|---|---|---|")
    for (name, crop), rs in rates.items():
      median, train = np.median(rs), np.median(rates[("train", crop)])
      per_round = ", ".join(f"{r:.0f}" for r in rs)
      print(f"| {name} | {crop} | {per_round} | {median / cores:.0f} | {median / train:.2f} |")
