"""Train and eval input pipelines on the same JPEG folder, side by side: the benchmark's
own tf.data pipeline (`tf_input.py`), the package's decoding stage in its worker processes
and in Grain's threads (through a run config,
`pipeline.local_train_batches` and `pipeline.EvalBatches`), and, for training, a torch
`DataLoader` as timm's `create_loader` runs it (torchvision's JPEG decode,
`RandomResizedCrop` at the same area and aspect ranges, flip, normalise, batches of
float32 tensors).

Each row runs in a fresh process (torch beside TensorFlow crashes), restricted to
`workers` cores by CPU affinity: the tf.data map, the stage's worker processes (one per
core) and Grain's threads use every core the process may use, the `DataLoader` gets
`workers` worker processes. After `warmup`
batches, `steps` batches are timed: images/s of wall time, and images per CPU-second of
the whole process tree (the process, its threads and its worker processes, from /proc),
so that other jobs on the machine count less. The eval rows read the train split (one
pass after another: the test split is 10 images); every row ends at host numpy batches
(a run's copy to the devices is the same for any pipeline).

Run by `input_pipeline.py --compare`; importable: `compare(root, workers)` runs the rows
on a folder `input_data.write_jpeg_folder` wrote, on a machine with more cores.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from typing import Callable, Iterator

import numpy as np

from benchmarks import input_data

TRAIN_ROWS = ("tf.data", "grain", "grain threads", "torch DataLoader")
EVAL_ROWS = ("tf.data eval", "grain eval", "grain eval threads")
ROWS = TRAIN_ROWS + EVAL_ROWS
_LABELS = {
  "tf.data": "tf.data (plain: inception crop, `decode_and_crop_jpeg`, flip)",
  "grain": "vit_jax stage (worker processes, the default)",
  "grain threads": "vit_jax stage (Grain's threads: `decode_processes=0`)",
  "torch DataLoader": "torch `DataLoader` (torchvision decode, `RandomResizedCrop`, flip)",
  "tf.data eval": "tf.data eval (plain: whole decode, bilinear resize)",
  "grain eval": "vit_jax eval batches (worker processes)",
  "grain eval threads": "vit_jax eval batches (threads: `decode_processes=0`)",
}
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tree_cpu_seconds(pid: int) -> float:
  """User + system CPU seconds of ``pid`` and its live descendants (Linux /proc)."""
  tick = os.sysconf("SC_CLK_TCK")
  stats = {}
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat") as f:
          fields = f.read().rsplit(")", 1)[1].split()
      except OSError:
        continue
      stats[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]))  # ppid, ticks
  tree, total = {pid}, 0
  for _ in range(4):  # Descendants a few levels deep.
    tree |= {p for p, (ppid, _) in stats.items() if ppid in tree}
  for p in tree:
    total += stats.get(p, (0, 0))[1]
  return total / tick


def _tf_train(root: str, workers: int, batch: int, crop: int) -> Iterator[int]:
  from benchmarks import tf_input

  paths, labels = input_data.folder_files(root, "train")
  ds = tf_input.train_batches(paths, labels, input_data.NUM_CLASSES, batch, crop=crop)
  for images, _ in ds.as_numpy_iterator():
    yield images.shape[0]


def _tf_eval(root: str, workers: int, batch: int, crop: int) -> Iterator[int]:
  from benchmarks import tf_input

  paths, labels = input_data.folder_files(root, "train")
  ds = tf_input.eval_batches(paths, labels, input_data.NUM_CLASSES, batch, crop=crop)
  while True:
    for images, _ in ds.as_numpy_iterator():
      yield images.shape[0]


def _grain_train(
  root: str, workers: int, batch: int, crop: int, processes: int | None = None
) -> Iterator[int]:
  """Host batches of the package's train pipeline (`pipeline.local_train_batches`), its
  images decoded by `processes` worker processes (None: one per core; 0: threads)."""
  from vit_jax import data
  from vit_jax.data import dataset, pipeline

  config = input_data.run_config(f"folder:{root}", crop, batch, decode_processes=processes)
  source = dataset.Dataset(data.Settings.from_config(config))
  for b in pipeline.local_train_batches(source, batch, 0, 0, 1):
    yield b["image"].shape[0]


def _grain_eval(
  root: str, workers: int, batch: int, crop: int, processes: int | None = None
) -> Iterator[int]:
  """Real (mask 1) images of the package's host eval batches (`pipeline.EvalBatches`, as the
  train row's `local_train_batches`) over the train split."""
  from vit_jax import data
  from vit_jax.data import dataset, pipeline

  config = input_data.run_config(f"folder:{root}", crop, batch, decode_processes=processes)
  source = dataset.Dataset(data.Settings.from_config(config))
  evaluation = pipeline.EvalBatches(source, "train", batch, 0, 1)
  while True:
    for b in evaluation:
      yield int(b["mask"].sum())


def _torch(root: str, workers: int, batch: int, crop: int) -> Iterator[int]:
  """A torch DataLoader as timm's `create_loader` runs one, with torchvision's decode."""
  import torch
  from torchvision import io as tv_io
  from torchvision.transforms import v2

  files, _ = input_data.folder_files(root, "train")
  transform = v2.Compose(
    [
      v2.RandomResizedCrop(crop, scale=(0.05, 1.0), antialias=True),
      v2.RandomHorizontalFlip(),
      v2.ToDtype(torch.float32, scale=True),
      v2.Normalize([0.5] * 3, [0.5] * 3),
    ]
  )

  class Files(torch.utils.data.Dataset):
    def __len__(self) -> int:
      return len(files)

    def __getitem__(self, i: int):
      image = tv_io.decode_jpeg(tv_io.read_file(files[i]), mode=tv_io.ImageReadMode.RGB)
      return transform(image), 0

  torch.set_num_threads(1)
  loader = torch.utils.data.DataLoader(
    Files(), batch_size=batch, shuffle=True, num_workers=workers, drop_last=True,
    persistent_workers=True, prefetch_factor=4,
  )  # fmt: skip
  while True:
    for images, _ in loader:
      yield images.shape[0]


_BATCHES: dict[str, Callable[[str, int, int, int], Iterator[int]]] = {
  "tf.data": _tf_train,
  "grain": _grain_train,
  "grain threads": functools.partial(_grain_train, processes=0),
  "torch DataLoader": _torch,
  "tf.data eval": _tf_eval,
  "grain eval": _grain_eval,
  "grain eval threads": functools.partial(_grain_eval, processes=0),
}


def measure_row(
  row: str, root: str, workers: int, batch: int = 128, steps: int = 40, warmup: int = 3,
  crop: int = 224,
) -> dict:  # fmt: skip
  """One row in this process, on `workers` cores: {'images', 'wall_s', 'cpu_s'}."""
  os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:workers])
  batches = _BATCHES[row](root, workers, batch, crop)
  for _ in range(warmup):
    next(batches)
  cpu, start, images = _tree_cpu_seconds(os.getpid()), time.perf_counter(), 0
  for _ in range(steps):
    images += next(batches)
  wall = time.perf_counter() - start
  return {"images": images, "wall_s": wall, "cpu_s": _tree_cpu_seconds(os.getpid()) - cpu}


def run_row(row: str, root: str, workers: int, batch: int, steps: int) -> dict:
  """`measure_row` in a fresh process; {'error': ...} where that row cannot run here."""
  args = json.dumps(dict(row=row, root=root, workers=workers, batch=batch, steps=steps))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  done = subprocess.run(
    [sys.executable, "-m", "benchmarks.input_rows", args],
    capture_output=True,
    text=True,
    cwd=_ROOT,
    env=env,
  )
  if done.returncode:
    return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
  return json.loads(done.stdout.strip().splitlines()[-1])


def _table(results: dict[str, list[dict]], rows: tuple[str, ...], workers: int) -> list[str]:
  """Medians (per-round values in brackets) and ratios to the first of `rows`."""
  lines = [
    f"| pipeline ({workers} cores) | images/s | images per CPU-second | x {rows[0]} (wall) "
    f"| x {rows[0]} (CPU) |",
    "|---|---|---|---|---|",
  ]
  medians, rounds = {}, {}
  for row in rows:
    ok = [r for r in results[row] if "error" not in r]
    if ok:
      rates = [r["images"] / r["wall_s"] for r in ok]
      per_cpu = [r["images"] / r["cpu_s"] for r in ok]
      medians[row] = (float(np.median(rates)), float(np.median(per_cpu)))
      rounds[row] = tuple(", ".join(f"{v:.0f}" for v in vs) for vs in (rates, per_cpu))
  base = medians.get(rows[0])
  for row in rows:
    if row not in medians:
      lines.append(f"| {_LABELS[row]} | not run: {results[row][0]['error']} | | | |")
      continue
    (rate, per_cpu), (rate_rounds, cpu_rounds) = medians[row], rounds[row]
    ratios = f"{rate / base[0]:.2f} | {per_cpu / base[1]:.2f}" if base else "- | -"
    lines.append(
      f"| {_LABELS[row]} | {rate:.0f} ({rate_rounds}) | {per_cpu:.0f} ({cpu_rounds}) | {ratios} |"
    )
  return lines


def compare(
  root: str, workers: int, batch: int = 128, steps: int = 40, rounds: int = 3
) -> list[str]:
  """The rows interleaved in each of `rounds` rounds; the tables' lines (also printed):
  the train rows against tf.data, the eval rows against tf.data eval."""
  results: dict[str, list[dict]] = {row: [] for row in ROWS}
  for round_ in range(rounds):
    for row in ROWS:
      load = os.getloadavg()[0]
      result = run_row(row, root, workers, batch, steps)
      results[row].append(result)
      print(f"round {round_} {row}: {result} (load {load:.1f})", flush=True)
  lines = _table(results, TRAIN_ROWS, workers) + [""] + _table(results, EVAL_ROWS, workers)
  print("\n".join(lines))
  return lines


if __name__ == "__main__":
  print(json.dumps(measure_row(**json.loads(sys.argv[1]))))
