"""Input pipeline throughput: images/s (and bytes read) of the train and eval pipelines.

Two cases, each on data the script writes itself: synthetic photo-like JPEGs (~500x375,
smooth structure, gradients and noise, so they compress like photographs, ~60 KiB).

  * Default: a JPEG folder; times `vit_jax.data.train_iterator` / `eval_iterator` end to
    end (read, decode, crop/resize, normalise, batch, global jax.Array) at each crop, and
    the train pipeline again with RandAugment (`config.pp.randaug`, `--randaug`, default
    (2, 10)); the rows alternate within each of `--rounds` rounds.

      python benchmarks/input_pipeline.py [--images 400] [--batch 64] [--steps 20] \
        [--rounds 3] [--randaug 2 10]

  * `--randaug-cost`: CPU milliseconds per image (process time, so other jobs on the
    machine count less than in images/s) of the train preprocessing of one such JPEG at
    `--crops`[0] in a one-thread tf.data map, without and with RandAugment `--randaug`,
    of one round of each RandAugment op on the resized image (per batch of 64, as the
    pipeline runs them), and, where timm is installed, of timm's train transform on the
    same JPEG with Pillow, without and with its RandAugment; the rows alternate in each
    of `--rounds` rounds, medians printed.

      python benchmarks/input_pipeline.py --randaug-cost [--rounds 3] [--randaug 2 10]

  * `--tfds`: a tfds dataset of such JPEGs in 4 shards, prepared as TFRecord and as
    ArrayRecord (preparation time and size are printed), read by the train pipeline at the
    shuffle window the defaults give at `--paper-batch` (config.shuffle_buffer //
    paper batch examples per lane, reproduced at `--batch` by shuffle_buffer = window x
    batch), beside the plain tf.data pipeline a user would write (tfds.load, shuffle,
    parallel decode_and_crop_jpeg + resize + flip, batch, prefetch) and, when `grain` is
    installed, a Grain pipeline over the ArrayRecord data source. Each row runs in fresh
    processes (1, and 4 reading a quarter each as the pipeline's processes do; they
    start timing together) on host-local numpy batches; the pipelines alternate within
    each round. Prints images/s, CPU time per image, and the bytes read per example
    (/proc/self/io rchar: what the readers requested) against the stored bytes.

      python benchmarks/input_pipeline.py --tfds [--images 6000] [--batch 128] [--rounds 3]

  * `--compare`: the tf.data stage, the Grain stage and a torch `DataLoader` (torchvision
    decode, the same crop) on `--images` JPEGs (default 6,000; `--smoke`: 600), images/s
    and images per CPU-second, rows interleaved (`benchmarks/input_rows.py`).

      python benchmarks/input_pipeline.py --compare [--smoke] [--workers 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import io
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

# `configs/` is a folder of the repository, not part of the installed package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import common  # noqa: E402

_NUM_CLASSES = 10
_SHARDS = 4


def photo_jpeg(rng: np.random.Generator, size=(500, 375), quality: int = 90) -> bytes:
  """A photo-like JPEG: smooth random structure over a gradient, plus sensor-like noise."""
  width, height = size
  coarse = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
  smooth = np.asarray(Image.fromarray(coarse).resize(size, Image.BICUBIC), np.float32)
  ramp = np.linspace(-40, 40, width, dtype=np.float32)[None, :, None] * rng.uniform(-1, 1, 3)
  pixels = np.clip(smooth + ramp + rng.normal(0, 8, (height, width, 3)), 0, 255)
  out = io.BytesIO()
  Image.fromarray(pixels.astype(np.uint8)).save(out, "JPEG", quality=quality)
  return out.getvalue()


def write_jpeg_folder(root: str, num_images: int, classes: int = _NUM_CLASSES) -> float:
  """Writes <root>/{train,test}/<class>/*.jpg; returns the mean file size in KiB."""
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


def _config(dataset: str, crop: int, batch: int, **overrides):
  """configs/common.py's defaults with this benchmark's data keys."""
  config = common.get_config()
  keys = dict(dataset=dataset, train_split="train", test_split="test", pp=dict(crop=crop))
  config.update(dict(keys, batch=batch, batch_eval=batch, **overrides))
  return config


# The JPEG folder case: train and eval end to end, to global jax.Arrays.


def _train_rate(config, mesh, steps: int, warmup: int = 3) -> float:
  """Images/s over `steps` train batches after `warmup` (tf.data start-up)."""
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


def folder_case(args) -> None:
  import jax

  cores = len(os.sched_getaffinity(0))
  mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(-1, 1), ("data", "model"))
  randaug = (args.randaug[0], float(args.randaug[1]))
  rows = (("train", None), (f"train, randaug{randaug}", randaug), ("eval", None))
  with tempfile.TemporaryDirectory() as root:
    kib = write_jpeg_folder(root, args.images)
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
          config = _config(f"folder:{root}", crop, args.batch, shuffle_buffer=10_000, pp=pp)
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


def _cpu_ms_per_image(fn, count: int = 512) -> float:
  """Process CPU ms per element of a one-thread tf.data map of `fn(index)`, batched by 64
  as the pipeline does, second pass."""
  import tensorflow as tf

  ds = tf.data.Dataset.range(count).map(fn, num_parallel_calls=1).batch(64)
  for _ in ds:  # Traces and warms up.
    pass
  start = time.process_time()
  for _ in ds:
    pass
  return (time.process_time() - start) / count * 1e3


def timm_worker(args) -> None:
  """timm's train transform on the benchmark's JPEG with Pillow (decode, RandomResizedCrop,
  flip, ToTensor, Normalize; no colour jitter), without and with its RandAugment: CPU ms
  per image of each row, JSON to stdout. Its own process: torch imported after
  TensorFlow crashes."""
  import torch
  from timm.data import create_transform

  torch.set_num_threads(1)  # One thread, as the tf.data map.
  jpeg = photo_jpeg(np.random.default_rng(0))
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


def _timm_costs(args) -> dict:
  """timm_worker's rows in a fresh process; empty when timm is not installed."""
  if importlib.util.find_spec("timm") is None:
    return {}
  command = [sys.executable, __file__, "--timm-worker", "--crops", str(args.crops[0])]
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
    np.asarray(Image.open(io.BytesIO(photo_jpeg(rng))).resize((crop, crop))) for _ in range(8)
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

  from vit_jax import run
  from vit_jax.models import get_model_config

  out = {}
  for name, setting in (("train step", None), (f"train step + RandAugment{randaug}", randaug)):
    config = common.get_config()
    config.pp.crop, config.batch, config.model = crop, batch, get_model_config(model)
    config.model.transformer.dropout_rate = config.model.transformer.attention_dropout_rate = 0.0
    config.pp.randaug, config.num_classes = setting, _NUM_CLASSES
    steps = run.build(config, open_data=False)
    images = np.random.default_rng(0).integers(0, 256, (batch, crop, crop, 3)).astype(np.float32)
    labels = np.eye(_NUM_CLASSES, dtype=np.float32)[np.arange(batch) % _NUM_CLASSES]
    data = jax.device_put({"image": images, "label": labels}, steps.batch_sharding)
    holder = {"state": steps.init_state()}

    def step(batch_, key, holder=holder, steps=steps):
      holder["state"], metrics = steps.train_step(holder["state"], batch_)
      return metrics

    out[name] = _device_ms(step, data, repeats)
  return out


def randaug_cost_case(args) -> None:
  import jax
  import tensorflow as tf

  from vit_jax.data import preprocess

  crop, (layers, magnitude) = args.crops[0], args.randaug
  randaug = (layers, float(magnitude))
  jpeg = tf.constant(photo_jpeg(np.random.default_rng(0)))
  seed = lambda i: tf.stack([tf.constant(0, tf.int64), i])
  image_fn = lambda setting: (
    lambda i: preprocess.train_image(
      jpeg, seed(i), crop=crop, min_area=0.05, flip=True, randaug=setting
    )
  )
  # The CPU side: with RandAugment the pipeline hands the rounded crop (the step augments).
  rows = {"train": image_fn(None), f"train, randaug{randaug} (CPU part)": image_fn(randaug)}
  costs: dict = {}
  loads = []
  for _ in range(args.rounds):
    loads.append(os.getloadavg()[0])
    for name, fn in rows.items():
      costs.setdefault(name, []).append(_cpu_ms_per_image(fn))
    for name, ms in _timm_costs(args).items():
      costs.setdefault(name, []).append(ms)
  print(f"CPU ms per image at {crop}x{crop} (one thread), load at each round's start {loads}:")
  print("| row | CPU ms per round | median |\n|---|---|---|")
  for name, ms in costs.items():
    print(f"| {name} | {', '.join(f'{m:.2f}' for m in ms)} | {np.median(ms):.2f} |")
  median = {name: np.median(ms) for name, ms in costs.items()}
  ours, augmented = median["train"], median[f"train, randaug{randaug} (CPU part)"]
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


# The tfds case: prepared datasets, pipelines in fresh processes.


@functools.cache
def _builder_class():
  """The `synthetic_photos` tfds builder (imports tfds only where it is needed)."""
  import tensorflow_datasets as tfds

  class SyntheticPhotos(tfds.core.GeneratorBasedBuilder):
    """JPEGs read from $VIT_JAX_PHOTOS/{train,test}/<class>/*.jpg, stored as they are."""

    VERSION = tfds.core.Version("1.0.0")
    code_path = pathlib.Path(__file__)  # tfds cannot find it without importlib_resources.

    def _info(self):
      return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict(
          {
            "image": tfds.features.Image(encoding_format="jpeg"),
            "label": tfds.features.ClassLabel(num_classes=_NUM_CLASSES),
          }
        ),
      )

    def _split_generators(self, dl_manager):
      root = os.environ["VIT_JAX_PHOTOS"]
      splits = ("train", "test")
      return {split: self._generate_examples(os.path.join(root, split)) for split in splits}

    def _generate_examples(self, folder):
      for label in range(_NUM_CLASSES):
        class_dir = os.path.join(folder, f"class_{label}")
        for name in sorted(os.listdir(class_dir)):
          yield name, {"image": os.path.join(class_dir, name), "label": label}

  return SyntheticPhotos


def _data_dir(root: str, file_format: str) -> str:
  return os.path.join(root, file_format)


def prepare(root: str, num_images: int) -> None:
  """Writes the JPEGs and prepares both file formats once (reused when present)."""
  import tensorflow_datasets as tfds

  photos = os.path.join(root, "jpeg")
  if not os.path.isdir(photos):
    kib = write_jpeg_folder(photos, num_images)
    print(f"Wrote {num_images} JPEGs of 500x375, mean {kib:.1f} KiB.")
  os.environ["VIT_JAX_PHOTOS"] = photos
  builder_class = _builder_class()
  for file_format in ("tfrecord", "array_record"):
    builder = builder_class(data_dir=_data_dir(root, file_format))
    if builder.is_prepared():
      continue
    start = time.perf_counter()
    builder.download_and_prepare(
      file_format=file_format, download_config=tfds.download.DownloadConfig(num_shards=_SHARDS)
    )
    seconds = time.perf_counter() - start
    files = builder.info.splits["train"].filepaths
    size = sum(os.path.getsize(f) for f in files)
    print(
      f"Prepared {file_format}: {seconds:.1f} s, train split {size / 2**20:.1f} MiB in "
      f"{len(files)} files ({size / num_images / 1024:.1f} KiB per example)."
    )


def _rchar() -> int:
  """Bytes this process has read through read syscalls so far."""
  with open("/proc/self/io") as f:
    return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def _settings(args, file_format: str):
  from vit_jax.data.dataset import Settings

  window = common.get_config().shuffle_buffer // args.paper_batch
  config = _config(
    "synthetic_photos",
    224,
    args.batch,
    data_dir=_data_dir(args.root, file_format),
    shuffle_buffer=window * args.batch,
  )
  return Settings.from_config(config)


def _ours(args, file_format: str, process: int, count: int, decode: bool = True):
  import tensorflow as tf

  from vit_jax.data import dataset, pipeline

  if not decode:  # Reads only: the example function drops the image, keeps the label.
    pipeline._example_fn = lambda settings, kind, num_classes, train: (
      lambda position, uid, value, label: (position, tf.zeros([1]), tf.one_hot(label, 10))
    )
  _builder_class()  # Registers `synthetic_photos` with tfds.
  data = dataset.Dataset(_settings(args, file_format))
  return (
    b["image"] for b in pipeline.local_train_batches(data, args.batch // count, 0, process, count)
  )


def _plain(args, file_format: str, process: int, count: int, decode: bool = True):
  """What a user would write with tfds and tf.data, reading its share of the split."""
  import tensorflow as tf
  import tensorflow_datasets as tfds

  from vit_jax.data import preprocess

  _builder_class()
  settings = _settings(args, file_format)
  split = tfds.even_splits("train", count)[process]
  ds = tfds.load(
    "synthetic_photos",
    split=split,
    data_dir=settings.data_dir,
    decoders={"image": tfds.decode.SkipDecoding()},
    shuffle_files=True,
  )

  def example(i, ex):
    seed = tf.stack([tf.constant(settings.seed, tf.int64), i])
    image = preprocess.train_image(
      ex["image"],
      seed,
      crop=settings.crop,
      min_area=settings.min_area,
      flip=settings.flip,
      randaug=settings.randaug,
    )
    return image, tf.one_hot(ex["label"], _NUM_CLASSES)

  ds = ds.repeat().shuffle(settings.shuffle_buffer // count).enumerate()
  if not decode:  # Reads only.
    example = lambda i, ex: (ex["image"], ex["label"])  # noqa: E731
  ds = ds.map(example, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(args.batch // count).prefetch(tf.data.AUTOTUNE)
  return (image for image, _ in ds.as_numpy_iterator())


def _grain(args, file_format: str, process: int, count: int, decode: bool = True):
  """Grain over the ArrayRecord data source: global shuffle, per-process slice, the
  same TensorFlow decode and crop in Grain's reader threads."""
  import grain
  import tensorflow as tf
  import tensorflow_datasets as tfds

  from vit_jax.data import preprocess, records

  builder = _builder_class()(data_dir=_data_dir(args.root, "array_record"))
  source = builder.as_data_source(
    split="train", deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES
  )
  settings = _settings(args, "array_record")
  crop = tf.function(
    lambda data, seed: preprocess.train_image(
      data,
      seed,
      crop=settings.crop,
      min_area=settings.min_area,
      flip=settings.flip,
      randaug=settings.randaug,
    )
  )

  def example(i: int, record: bytes):
    values, labels = records.parse([record])
    if not decode:  # Reads only.
      return values, labels
    image = crop(tf.constant(values[0]), tf.constant([settings.seed, i], tf.int64))
    return image.numpy(), np.eye(_NUM_CLASSES, dtype=np.float32)[labels[0]]

  ds = grain.MapDataset.source(source).seed(settings.seed).shuffle().repeat()
  ds = ds[process::count].map_with_index(example).batch(args.batch // count)
  threads = len(os.sched_getaffinity(0)) * 2
  ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=threads))
  return (images for images, _ in ds)


_PIPELINES = {"plain": _plain, "ours": _ours, "grain": _grain}


def worker(args) -> None:
  """One process of one row, JSON to stdout. mode 'time': warm-up, then `--epochs` of
  its share timed. mode 'bytes': reads only (no decode) for `--bytes-epochs`, counted
  from the pipeline's construction (which reads no data; modules it imports lazily are
  loaded by then) to the end, over every image delivered (what was read ahead at the
  end counts too: an upper bound)."""
  name, file_format, process, count, mode = args.worker.split(":")
  process, count = int(process), int(count)
  pipeline = _PIPELINES[name.split("@")[0]]
  batches = pipeline(args, file_format, process, count, decode=mode == "time")
  before = _rchar()
  if mode == "bytes":
    steps = round(args.bytes_epochs * args.images / args.batch)
    images = sum(len(next(batches)) for _ in range(steps))
    result = dict(bytes_per_image=(_rchar() - before) / images)
  else:
    for _ in range(max(1, 1024 // (args.batch // count))):  # Start-up, buffers fill.
      next(batches)
    pathlib.Path(args.barrier, str(process)).touch()  # The processes start timing together.
    while len(os.listdir(args.barrier)) < count:
      time.sleep(0.01)
    steps = max(1, round(args.epochs * args.images / args.batch))
    start, cpu, images = time.time(), time.process_time(), 0
    for _ in range(steps):
      images += len(next(batches))
    result = dict(images=images, start=start, end=time.time(), cpu=time.process_time() - cpu)
  result["code"] = os.path.dirname(os.path.dirname(sys.modules["vit_jax"].__file__))
  print("RESULT" + json.dumps(result), flush=True)
  os._exit(0)  # Skips tf.data's teardown of pipelines still running (seconds, not data).


def _run_row(args, name: str, file_format: str, count: int, mode: str) -> list[dict]:
  """Starts `count` worker processes at once; their results.

  A name `ours@/path` runs the pipeline of the checkout at /path (e.g. an older version).
  """
  checkout = {"PYTHONPATH": name.split("@")[1]} if "@" in name else {}
  base = [sys.executable, __file__, "--tfds", "--root", args.root, "--images", str(args.images)]
  base += ["--batch", str(args.batch), "--paper-batch", str(args.paper_batch)]
  base += ["--epochs", str(args.epochs), "--bytes-epochs", str(args.bytes_epochs)]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu", **checkout)
  with tempfile.TemporaryDirectory(prefix="vit_jax_barrier") as barrier:
    procs = [
      subprocess.Popen(
        base + ["--barrier", barrier, "--worker", f"{name}:{file_format}:{p}:{count}:{mode}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
      )
      for p in range(count)
    ]
    results = []
    for proc in procs:
      out, err = proc.communicate()
      if proc.returncode:
        raise RuntimeError(f"{name} {file_format} worker failed:\n{err[-3000:]}")
      results.append(json.loads(out.split("RESULT")[-1]))
  return results


def tfds_case(args) -> None:
  os.makedirs(args.root, exist_ok=True)
  prepare(args.root, args.images)
  stored = {}
  builder_class = _builder_class()
  for file_format in ("tfrecord", "array_record"):
    files = builder_class(data_dir=_data_dir(args.root, file_format)).info.splits["train"].filepaths
    stored[file_format] = sum(os.path.getsize(f) for f in files) / args.images
  window = common.get_config().shuffle_buffer // args.paper_batch
  print(
    f"\n{args.images} JPEGs, batch {args.batch} (global), window {window} per lane "
    f"(shuffle_buffer {window * args.batch}), crop 224, {len(os.sched_getaffinity(0))} "
    f"cores; stored bytes per example: "
    + ", ".join(f"{fmt} {b / 1024:.1f} KiB" for fmt, b in stored.items())
  )
  print(f"\nBytes read per example over {args.bytes_epochs} epochs (reads only, no decode):")
  print("| pipeline | format | processes | bytes read / stored bytes |\n|---|---|---|---|")
  for count in args.processes if args.bytes_epochs > 0 else []:
    for name, fmt in args.rows:
      per_image = np.mean([r["bytes_per_image"] for r in _run_row(args, name, fmt, count, "bytes")])
      print(f"| {name} | {fmt} | {count} | {per_image / stored[fmt]:.3f} |", flush=True)
  results: dict = {}
  print(f"\nThroughput, {args.epochs} epochs timed per row, rows alternating in each round:")
  for round_ in range(args.rounds):
    for count in args.processes:
      for name, fmt in args.rows:
        load = os.getloadavg()[0]
        rs = _run_row(args, name, fmt, count, "time")
        span = max(r["end"] for r in rs) - min(r["start"] for r in rs)
        rate = sum(r["images"] for r in rs) / span  # All processes together.
        cpu_ms = 1000 * sum(r["cpu"] for r in rs) / sum(r["images"] for r in rs)
        results.setdefault((name, fmt, count), []).append((rate, cpu_ms, load))
        print(
          f"round {round_} {name} {fmt} x{count}: {rate:.0f} img/s, {cpu_ms:.2f} CPU ms per "
          f"image (load {load:.1f})",
          flush=True,
        )
  print("\n| pipeline | format | processes | img/s per round | CPU ms per image | load |")
  print("|---|---|---|---|---|---|")
  for (name, fmt, count), rs in results.items():
    rates = ", ".join(f"{rate:.0f}" for rate, _, _ in rs)
    cpu = np.median([cpu_ms for _, cpu_ms, _ in rs])
    loads = ", ".join(f"{load:.1f}" for *_, load in rs)
    print(f"| {name} | {fmt} | {count} | {rates} | {cpu:.2f} | {loads} |")


def compare_case(args) -> None:
  from benchmarks import input_rows

  images = args.images or (600 if args.smoke else 6000)
  batch, steps = args.batch or 128, args.steps if not args.smoke else 4
  workers = args.workers or len(os.sched_getaffinity(0))
  with tempfile.TemporaryDirectory() as root:
    kib = write_jpeg_folder(root, images)
    print(f"{images} train JPEGs of 500x375 (mean {kib:.0f} KiB), batch {batch}, {steps} timed")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    input_rows.compare(root, workers, batch, steps, args.rounds)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tfds", action="store_true", help="the tfds case (see above)")
  parser.add_argument("--compare", action="store_true", help="tf.data, Grain, DataLoader")
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
    timm_worker(args)
  elif args.compare:
    compare_case(args)
  elif args.randaug_cost:
    randaug_cost_case(args)
  elif not args.tfds:
    args.images, args.batch = args.images or 400, args.batch or 64
    folder_case(args)
  else:
    args.images, args.batch = args.images or 6000, args.batch or 128
    worker(args) if args.worker else tfds_case(args)


if __name__ == "__main__":
  main()
