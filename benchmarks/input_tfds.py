"""`input_pipeline.py --tfds`: a tfds dataset of the benchmark's JPEGs in 4 shards,
prepared as TFRecord and as ArrayRecord, read at the shuffle window the defaults give at
`--paper-batch` by the package's train pipeline ("ours"), by the plain tf.data pipeline a
user would write ("plain": tfds.load, shuffle, the parallel train map of `tf_input`,
batch, prefetch) and by Grain over the ArrayRecord data source with the same TensorFlow
map ("grain"). Each row runs in fresh worker processes (1, and 4 reading a quarter each,
starting their timing together) on host-local numpy batches; images/s, CPU time per
image, and bytes read per example (/proc/self/io rchar) against the stored bytes.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import input_data

_ENTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "input_pipeline.py")
_NUM_CLASSES = input_data.NUM_CLASSES
_SHARDS = 4


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
    kib = input_data.write_jpeg_folder(photos, num_images)
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


def _window(args: argparse.Namespace) -> int:
  """Examples per lane the default shuffle_buffer gives at `--paper-batch`."""
  from configs import common

  return common.get_config().shuffle_buffer // args.paper_batch


def _settings(args, file_format: str):
  """The run's data settings, decoded in this process's threads (`decode_processes=0`), so
  that its CPU time and bytes read are the whole row's (and `_ours` can stub the decode out)."""
  from vit_jax.data.settings import Settings

  window = _window(args)
  config = input_data.run_config(
    "synthetic_photos",
    224,
    args.batch,
    data_dir=_data_dir(args.root, file_format),
    shuffle_buffer=window * args.batch,
    decode_processes=0,
  )
  return Settings.from_config(config)


def _ours(args, file_format: str, process: int, count: int, decode: bool = True):
  from vit_jax.data import dataset, example_images, pipeline

  if not decode:  # Reads only: the stage leaves each batch row as it is.
    example_images.Preprocessing.image = lambda self, value, uid, out=None: out
  _builder_class()  # Registers `synthetic_photos` with tfds.
  data = dataset.Dataset(_settings(args, file_format))
  return (
    b["image"] for b in pipeline.local_train_batches(data, args.batch // count, 0, process, count)
  )


def _plain(args, file_format: str, process: int, count: int, decode: bool = True):
  """What a user would write with tfds and tf.data, reading its share of the split."""
  import tensorflow as tf
  import tensorflow_datasets as tfds

  from benchmarks import tf_input

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
    image = tf_input.train_image(ex["image"], seed, settings.crop, settings.min_area, settings.flip)
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

  from benchmarks import tf_input
  from vit_jax.data import records

  builder = _builder_class()(data_dir=_data_dir(args.root, "array_record"))
  source = builder.as_data_source(
    split="train", deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES
  )
  settings = _settings(args, "array_record")
  crop = tf.function(
    lambda data, seed: tf_input.train_image(
      data, seed, settings.crop, settings.min_area, settings.flip
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
  if "@" in name:  # Before this repository's root, which `input_data` put first.
    sys.path.insert(0, name.split("@")[1])
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
  base = [sys.executable, _ENTRY, "--tfds", "--root", args.root, "--images", str(args.images)]
  base += ["--batch", str(args.batch), "--paper-batch", str(args.paper_batch)]
  base += ["--epochs", str(args.epochs), "--bytes-epochs", str(args.bytes_epochs)]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu")
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
  window = _window(args)
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
