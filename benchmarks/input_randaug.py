"""`input_pipeline.py --randaug-cost`: what RandAugment costs, on the host and on the device.

On the host, CPU ms per image (process time, so other jobs on the machine count less) of
one photo-like JPEG at `--crops`[0], one thread: the package's decoding stage without and
with RandAugment (with it the stage rounds the crop and the train step augments), the
benchmark's plain tf.data train map (`tf_input.train_image`) beside them, and, where timm
is installed, timm's train transform with Pillow, without and with its RandAugment. On
the default JAX device, ms per image of the train step's RandAugment against the
normalisation it replaces, and (`--step-model`) of a model's train step without and with
it. The host rows alternate in each of `--rounds` rounds, medians printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import subprocess
import sys
import time

import numpy as np
from PIL import Image

from benchmarks import input_data

_ENTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "input_pipeline.py")
_COUNT = 512  # Images timed per host row.


def _tf_cpu_ms(crop: int, jpeg: bytes, count: int = _COUNT) -> float:
  """Process CPU ms per image of a one-thread tf.data map of the plain train
  preprocessing, batched by 64, second pass."""
  import tensorflow as tf

  from benchmarks import tf_input

  data = tf.constant(jpeg)

  def fn(i: tf.Tensor) -> tf.Tensor:
    return tf_input.train_image(data, tf.stack([tf.constant(0, tf.int64), i]), crop, 0.05, True)

  ds = tf.data.Dataset.range(count).map(fn, num_parallel_calls=1).batch(64)
  for _ in ds:  # Traces and warms up.
    pass
  start = time.process_time()
  for _ in ds:
    pass
  return (time.process_time() - start) / count * 1e3


def _stage_cpu_ms(crop: int, jpeg: bytes, randaug, count: int = _COUNT) -> float:
  """Process CPU ms per image of the package's decoding stage (`decode_stage.Stage.image`:
  decode, train crop, flip, normalise or round) in this thread, after a warm-up."""
  from vit_jax import data
  from vit_jax.data import decode_stage

  config = input_data.run_config("folder:unused", crop, 64, pp=dict(crop=crop, randaug=randaug))
  stage = decode_stage.Stage(data.Settings.from_config(config), "bytes", 10, True, workers=1)
  out = np.empty([crop, crop, 3], np.float32)
  for uid in range(32):
    stage.image(jpeg, uid, out)
  start = time.process_time()
  for uid in range(count):
    stage.image(jpeg, uid, out)
  return (time.process_time() - start) / count * 1e3


def timm_worker(args: argparse.Namespace) -> None:
  """timm's train transform on the benchmark's JPEG with Pillow (decode, RandomResizedCrop,
  flip, ToTensor, Normalize; no colour jitter), without and with its RandAugment: CPU ms
  per image of each row, JSON to stdout. Its own process: torch imported after
  TensorFlow crashes."""
  import torch
  from timm.data import create_transform

  torch.set_num_threads(1)  # One thread, as the other rows.
  jpeg = input_data.photo_jpeg(np.random.default_rng(0))
  layers, magnitude = args.randaug
  policy = f"rand-m{magnitude}-n{layers}-mstd0"
  rows = {
    "timm train": None,
    f"timm train, {policy} (each op with p 0.5)": policy,
    f"timm train, {policy}-p1 (each op applied)": f"{policy}-p1",
  }
  costs = {}
  for name, auto_augment in rows.items():
    transform = create_transform(
      args.crops[0], is_training=True, color_jitter=None, auto_augment=auto_augment
    )
    for _ in range(32):  # Warm-up.
      transform(Image.open(io.BytesIO(jpeg)).convert("RGB"))
    start, count = time.process_time(), 256
    for _ in range(count):
      transform(Image.open(io.BytesIO(jpeg)).convert("RGB"))
    costs[name] = (time.process_time() - start) / count * 1e3
  print("RESULT" + json.dumps(costs), flush=True)


def _timm_costs(args: argparse.Namespace) -> dict:
  """timm_worker's rows in a fresh process; empty when timm is not installed."""
  if importlib.util.find_spec("timm") is None:
    return {}
  command = [sys.executable, _ENTRY, "--timm-worker", "--crops", str(args.crops[0])]
  command += ["--randaug", *map(str, args.randaug)]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  out = subprocess.run(command, capture_output=True, text=True, env=env, check=True).stdout
  return json.loads(out.split("RESULT")[-1])


def _device_ms(fn, batch: dict, repeats: int) -> tuple[float, float]:
  """(wall ms, process CPU ms) per call of the compiled `fn(batch, key)` after a warm-up
  call, each call with its own key."""
  import jax

  jax.block_until_ready(fn(batch, jax.random.PRNGKey(0)))
  start, cpu = time.perf_counter(), time.process_time()
  for i in range(repeats):
    jax.block_until_ready(fn(batch, jax.random.PRNGKey(i + 1)))
  return (time.perf_counter() - start) / repeats * 1e3, (time.process_time() - cpu) / repeats * 1e3


def device_randaug_costs(crop: int, randaug: tuple, batch: int, repeats: int) -> dict:
  """ms per image of the train step's RandAugment (`randaug.make_augmenter`, compiled on
  the default JAX backend) on a batch of photo-like crops, against the normalisation it
  replaces: {row: (wall ms, process CPU ms)}."""
  import jax
  import jax.numpy as jnp

  from vit_jax.data import randaug as randaug_lib

  mean = std = (0.5, 0.5, 0.5)
  augment = jax.jit(randaug_lib.make_augmenter(randaug, mean, std))
  normalise = jax.jit(
    lambda b, key: {"image": randaug_lib.normalize(b["image"].astype(jnp.uint8), mean, std)}
  )
  rng = np.random.default_rng(0)
  crops = [
    np.asarray(Image.open(io.BytesIO(input_data.photo_jpeg(rng))).resize((crop, crop)))
    for _ in range(8)
  ]
  images = np.stack([np.asarray(crops[i % 8]) for i in range(batch)]).astype(np.float32)
  batch_ = {"image": jax.device_put(images)}
  rows = {"normalise only": normalise, f"RandAugment{randaug} + normalise": augment}
  return {
    name: tuple(ms / batch for ms in _device_ms(fn, batch_, repeats)) for name, fn in rows.items()
  }


def train_step_costs(model: str, crop: int, randaug: tuple, batch: int, repeats: int) -> dict:
  """ms per compiled train step of `model` at `crop` without and with RandAugment in the
  step: {row: (wall ms, process CPU ms)}."""
  import jax

  from configs import common
  from vit_jax import run
  from vit_jax.models import get_model_config

  classes, out = input_data.NUM_CLASSES, {}
  for name, setting in (("train step", None), (f"train step + RandAugment{randaug}", randaug)):
    config = common.get_config()
    config.pp.crop, config.batch, config.model = crop, batch, get_model_config(model)
    config.model.transformer.dropout_rate = config.model.transformer.attention_dropout_rate = 0.0
    config.pp.randaug, config.num_classes = setting, classes
    steps = run.build(config, open_data=False)
    images = np.random.default_rng(0).integers(0, 256, (batch, crop, crop, 3)).astype(np.float32)
    labels = np.eye(classes, dtype=np.float32)[np.arange(batch) % classes]
    data = jax.device_put({"image": images, "label": labels}, steps.batch_sharding)
    holder = {"state": steps.init_state()}

    def step(batch_, key, holder=holder, steps=steps):
      holder["state"], metrics = steps.train_step(holder["state"], batch_)
      return metrics

    out[name] = _device_ms(step, data, repeats)
  return out


def _host_costs(args: argparse.Namespace, crop: int, randaug: tuple) -> dict[str, list[float]]:
  """The host rows, each round's CPU ms per image."""
  jpeg = input_data.photo_jpeg(np.random.default_rng(0))
  rows = {
    "vit_jax train (decoding stage)": lambda: _stage_cpu_ms(crop, jpeg, None),
    f"vit_jax train, randaug{randaug} (CPU part)": lambda: _stage_cpu_ms(crop, jpeg, randaug),
    "tf.data train (plain)": lambda: _tf_cpu_ms(crop, jpeg),
  }
  costs: dict[str, list[float]] = {}
  for round_ in range(args.rounds):
    print(f"round {round_} (load {os.getloadavg()[0]:.1f})", flush=True)
    for name, fn in rows.items():
      costs.setdefault(name, []).append(fn())
    for name, ms in _timm_costs(args).items():
      costs.setdefault(name, []).append(ms)
  return costs


def randaug_cost_case(args: argparse.Namespace) -> None:
  import jax

  crop, (layers, magnitude) = args.crops[0], args.randaug
  randaug = (layers, float(magnitude))
  costs = _host_costs(args, crop, randaug)
  print(f"CPU ms per image at {crop}x{crop} (one thread):")
  print("| row | CPU ms per round | median |\n|---|---|---|")
  for name, ms in costs.items():
    print(f"| {name} | {', '.join(f'{m:.2f}' for m in ms)} | {np.median(ms):.2f} |")
  median = {name: np.median(ms) for name, ms in costs.items()}
  ours = median["vit_jax train (decoding stage)"]
  augmented = median[f"vit_jax train, randaug{randaug} (CPU part)"]
  print(
    f"\nRandAugment{randaug} adds {augmented - ours:.2f} CPU ms per image to the pipeline: "
    f"{ours / augmented:.2f}x of the images per CPU second without it."
  )
  for name in [name for name in median if name.startswith("timm train, ")]:
    print(f"ours with RandAugment (CPU) / {name}: {augmented / median[name]:.2f}")

  device = f"{jax.device_count()} x {jax.devices()[0].device_kind}"
  batch = args.device_batch
  print(f"\nOn the device ({device}, load {os.getloadavg()[0]:.1f}), batch {batch}:")
  print("| row | wall ms per image | process CPU ms per image |\n|---|---|---|")
  for name, (wall, cpu) in device_randaug_costs(crop, randaug, batch, args.device_repeats).items():
    print(f"| {name} | {wall:.3f} | {cpu:.3f} |")
  if args.step_model:
    print(f"\n{args.step_model} at {crop}, batch {batch} (load {os.getloadavg()[0]:.1f}):")
    print("| row | wall ms per step | process CPU ms per step |\n|---|---|---|")
    step_costs = train_step_costs(args.step_model, crop, randaug, batch, args.device_repeats)
    for name, (wall, cpu) in step_costs.items():
      print(f"| {name} | {wall:.1f} | {cpu:.1f} |")
