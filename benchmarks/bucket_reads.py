"""The input pipeline's images/s with its data on local disk and on a bucket.

    python benchmarks/bucket_reads.py [--images 1000] [--batch 128] [--steps 30] \
      [--rounds 3] [--latency-ms 0 20] [--storage-cores 1] \
      [--sources folder array_record tfrecord] [--smoke]

The same data in both places: a folder of the input benchmarks' photo-like JPEGs
(500x375, ~60 KiB; `input_data.py`) and a tfds dataset of those JPEGs prepared as
ArrayRecord (and TFRecord, with `--sources tfrecord`; 4 files a split, `input_tfds.py`).
The bucket is a real GCS server (fake-gcs-server, `tests/gcs_server.py`) behind a TCP relay
that adds `--latency-ms` to every request (`tests/gcs_proxy.LatencyRelay`, in this process), as a
bucket's tens of milliseconds (several values: a bucket row each; 0 against 20 says how
much of the latency is hidden); the pipeline reaches it through STORAGE_EMULATOR_HOST.

Each row (a source, local or on the bucket) runs in a fresh process: the train pipeline
with its defaults (decode worker processes, one per core), crop 224, host numpy batches
(`pipeline.local_train_batches`); the seconds to the first batch (listing the folder,
reading the tfds metadata; from the bucket, the copy of the dataset's files into a fresh
cache each round: the start-up a first run pays), then `--warmup` batches, then `--steps`
timed: images/s, and the pipeline's CPU milliseconds per image (its process and worker
processes). The rows alternate within each of `--rounds` rounds. The storage's own CPU
(the server and the relay, which share the machine here and would not on a cloud host) is
printed per request beside the table; `--storage-cores N` gives them the last N cores and
every row (local ones too) the others. `--smoke`: 48 images, batch 8, crop 32, 2 steps, 1
round.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import input_data  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DATASET = "synthetic_photos"  # `input_tfds`' builder of the JPEGs
_SHARDS = 4
_LABELS = {
  "folder": "image folder (`folder:`)",
  "array_record": "tfds ArrayRecord (`data_dir`)",
  "tfrecord": "tfds TFRecord (`data_dir`)",
}


def _process_cpu_seconds(pid: int) -> float:
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _prepare(root: str, images: int, sources: list[str]) -> dict:
  """Writes the JPEG folder and prepares the tfds formats asked for; {source: local path}."""
  import tensorflow_datasets as tfds

  from benchmarks import input_tfds

  photos = os.path.join(root, "jpeg")
  kib = input_data.write_jpeg_folder(photos, images)
  width, height = input_data.SIZE
  print(f"{images} train JPEGs of {width}x{height}, mean {kib:.0f} KiB", flush=True)
  places = {"folder": photos}
  os.environ["VIT_JAX_PHOTOS"] = photos
  builder_class = input_tfds._builder_class()  # pylint: disable=protected-access
  for file_format in [s for s in sources if s != "folder"]:
    places[file_format] = os.path.join(root, file_format)
    builder = builder_class(data_dir=places[file_format])
    tfds.disable_progress_bar()
    builder.download_and_prepare(
      file_format=file_format, download_config=tfds.download.DownloadConfig(num_shards=_SHARDS)
    )
  return places


def _config(source: str, place: str, args: argparse.Namespace) -> Any:
  if source == "folder":
    return input_data.run_config(f"folder:{place}", args.crop, args.batch)
  return input_data.run_config(_DATASET, args.crop, args.batch, data_dir=place)


def measure(source: str, place: str, args: argparse.Namespace) -> dict:
  """One row in this process: seconds to the first batch, then images, wall and CPU
  seconds (this process and its worker processes) of `args.steps` batches after
  `args.warmup`."""
  from benchmarks import input_rows, input_tfds
  from vit_jax.data import dataset, pipeline
  from vit_jax.data import settings as data_settings

  input_tfds._builder_class()  # registers the builder with tfds  # pylint: disable=protected-access
  start = time.perf_counter()
  settings = data_settings.Settings.from_config(_config(source, place, args))
  batches = pipeline.local_train_batches(dataset.Dataset(settings), args.batch, 0, 0, 1)
  next(batches)
  first_s = time.perf_counter() - start
  for _ in range(args.warmup):
    next(batches)
  cpu = input_rows._tree_cpu_seconds(os.getpid())  # pylint: disable=protected-access
  start, images = time.perf_counter(), 0
  for _ in range(args.steps):
    images += len(next(batches)["label"])
  wall = time.perf_counter() - start
  cpu = input_rows._tree_cpu_seconds(os.getpid()) - cpu  # pylint: disable=protected-access
  batches.close()
  return dict(first_s=first_s, images=images, wall_s=wall, cpu_s=cpu)


def _run_row(source: str, place: str, args: argparse.Namespace, env: dict, cores: list) -> dict:
  """`measure` in a fresh process on ``cores`` (its decode workers: one per core)."""
  row = json.dumps(dict(source=source, place=place, args=vars(args)))
  done = subprocess.run(
    [sys.executable, os.path.abspath(__file__), "--row", row],
    capture_output=True,
    text=True,
    cwd=_ROOT,
    env=env,
    preexec_fn=lambda: os.sched_setaffinity(0, cores),
  )
  if done.returncode:
    raise RuntimeError(f"{source} at {place} failed:\n{done.stderr[-3000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def _median(values: list[float]) -> float:
  return float(np.median(values))


def _place(where: str) -> str:
  return "local" if where == "local" else "bucket"


def _table(results: dict, sources: list[str], latencies: list[float], cores: str) -> list[str]:
  """Per source: images/s (median, each round in brackets) local and from the bucket at each
  latency, the ratios to local, the seconds to the first batch and the CPU per image."""
  buckets = [f"bucket {ms:g} ms" for ms in latencies]
  head = " | ".join(f"{b} images/s | {b} / local" for b in buckets)
  lines = [
    f"| data ({cores}) | local images/s | {head} | first batch after, local / "
    f"{buckets[-1]} (s) | pipeline CPU ms per image, local / {buckets[-1]} |",
    "|---" * (4 + 2 * len(buckets)) + "|",
  ]
  for source in sources:
    rates, firsts, cpus = {}, {}, {}
    for where in ["local", *buckets]:
      runs = results[(source, where)]
      rates[where] = [r["images"] / r["wall_s"] for r in runs]
      firsts[where] = _median([r["first_s"] for r in runs])
      cpus[where] = _median([1e3 * r["cpu_s"] / r["images"] for r in runs])
    local = _median(rates["local"])
    each = {w: ", ".join(f"{r:.0f}" for r in rs) for w, rs in rates.items()}
    cells = " | ".join(
      f"{_median(rates[b]):.0f} ({each[b]}) | **{_median(rates[b]) / local:.2f}**" for b in buckets
    )
    last = buckets[-1]
    lines.append(
      f"| {_LABELS[source]} | {local:.0f} ({each['local']}) | {cells} "
      f"| {firsts['local']:.1f} / {firsts[last]:.1f} | {cpus['local']:.2f} / {cpus[last]:.2f} |"
    )
  return lines


def _upload(places: dict, bucket: str) -> dict:
  """Puts each local source into the bucket; {source: its URL}."""
  from vit_jax.infra import storage

  remote = {}
  for source, place in places.items():
    remote[source] = f"{bucket}/{source}"
    storage.filesystem(bucket).put(place, remote[source], recursive=True)
  return remote


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--images", type=int, default=1000, help="train JPEGs written")
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--crop", type=int, default=224)
  parser.add_argument("--warmup", type=int, default=3, help="batches after the first")
  parser.add_argument("--steps", type=int, default=30, help="timed batches")
  parser.add_argument("--rounds", type=int, default=3, help="rows alternate in each round")
  parser.add_argument(
    "--latency-ms", type=float, nargs="+", default=[20], help="added to every request: a row each"
  )
  parser.add_argument(
    "--storage-cores",
    type=int,
    default=0,
    help="the last N cores for the server and the relay, the others for every row (0: shared)",
  )
  parser.add_argument(
    "--sources", nargs="+", default=["folder", "array_record"], choices=sorted(_LABELS)
  )
  parser.add_argument("--smoke", action="store_true", help="48 images, 2 steps, 1 round")
  parser.add_argument("--row", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.row:
    row = json.loads(args.row)
    print(json.dumps(measure(row["source"], row["place"], argparse.Namespace(**row["args"]))))
    return
  if args.smoke:
    args.images, args.batch, args.crop, args.warmup, args.steps, args.rounds = 48, 8, 32, 1, 2, 1

  from tests import gcs_proxy, gcs_server

  cores = sorted(os.sched_getaffinity(0))
  rows_cores, storage_cores = cores, cores
  if args.storage_cores:
    rows_cores, storage_cores = cores[: -args.storage_cores], cores[-args.storage_cores :]
  described = (
    f"{len(rows_cores)} of {len(cores)} cores" if args.storage_cores else f"{len(cores)} cores"
  )
  with tempfile.TemporaryDirectory(prefix="vit_jax_bucket_reads") as root:
    places = {"local": _prepare(root, args.images, args.sources)}
    server = gcs_server.GcsServer(pathlib.Path(root, "gcs"))
    server.start()
    os.sched_setaffinity(server._process.pid, storage_cores)  # pylint: disable=protected-access
    os.sched_setaffinity(0, storage_cores)  # the relay's thread; each row sets its own
    relay = gcs_proxy.LatencyRelay(server.url)
    try:
      os.environ.update(server.env)  # the upload goes straight to the server
      places["bucket"] = _upload(places["local"], server.make_bucket("vit-jax-bench"))
      latencies = ", ".join(f"{ms:g}" for ms in args.latency_ms)
      print(
        f"batch {args.batch}, crop {args.crop}, {args.steps} timed batches after "
        f"{args.warmup + 1}, {args.rounds} rounds, {latencies} ms added to every request; "
        f"rows on {described}\n{_uptime()}",
        flush=True,
      )
      results: dict = {}
      storage_ms: list[float] = []  # the server's and the relay's CPU per request
      wheres = ["local", *(f"bucket {ms:g} ms" for ms in args.latency_ms)]
      for round_ in range(args.rounds):
        for source in args.sources:
          for where, latency_ms in zip(wheres, [0, *args.latency_ms]):
            relay.latency_s = latency_ms / 1000
            cache = tempfile.mkdtemp(dir=root, prefix="cache")  # a first run's: copied anew
            env = dict(os.environ, **relay.env, XDG_CACHE_HOME=cache, TF_CPP_MIN_LOG_LEVEL="3")
            load = os.getloadavg()[0]
            requests, cpu = relay.requests, _storage_cpu(server)
            place = places[_place(where)][source]
            result = _run_row(source, place, args, env, rows_cores)
            if where != "local" and relay.requests > requests:
              storage_ms.append(1e3 * (_storage_cpu(server) - cpu) / (relay.requests - requests))
            results.setdefault((source, where), []).append(result)
            rate = result["images"] / result["wall_s"]
            print(
              f"round {round_} {source} {where}: {rate:.0f} img/s, first batch after "
              f"{result['first_s']:.1f} s (load {load:.1f})",
              flush=True,
            )
    finally:
      relay.close()
      server.stop()
  print(_uptime())
  print("\n" + "\n".join(_table(results, args.sources, args.latency_ms, described)))
  if storage_ms:
    print(
      f"\nThe storage's CPU (server and relay, on this machine): {_median(storage_ms):.2f} ms "
      "per request"
    )


def _storage_cpu(server: Any) -> float:
  """CPU seconds of the GCS server process and of this process (the relay's thread)."""
  return _process_cpu_seconds(server._process.pid) + _process_cpu_seconds(os.getpid())  # pylint: disable=protected-access


def _uptime() -> str:
  return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
  main()
