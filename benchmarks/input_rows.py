"""Three train input pipelines on the same JPEG folder, side by side: today's tf.data
stage, the Grain stage (`config.input_pipeline`), and a torch `DataLoader` as timm's
`create_loader` runs it (torchvision's JPEG decode, `RandomResizedCrop` at the same area
and aspect ranges, flip, normalise, batches of float32 tensors).

Each row runs in a fresh process (torch beside TensorFlow crashes), restricted to
`workers` cores by CPU affinity: the tf.data map and Grain's threads use every core the
process may use, the `DataLoader` gets `workers` worker processes. After `warmup`
batches, `steps` host batches are timed: images/s of wall time, and images per CPU-second
of the whole process tree (the process, its threads and its worker processes, from
/proc), so that other jobs on the machine count less.

Importable (`compare`, `measure_row`, `run_row`; the GPU check calls `compare(root,
workers=16)` on a folder `write_folder` wrote), and run by `input_pipeline.py --compare`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Iterator

import numpy as np

ROWS = ("tf.data", "grain", "torch DataLoader")
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


def _ours(root: str, pipeline: str, batch: int, crop: int) -> Iterator[int]:
  """Host batches of our train pipeline (`pipeline.local_train_batches`), as row counts."""
  from configs import common  # pylint: disable=g-import-not-at-top
  from vit_jax import data  # pylint: disable=g-import-not-at-top
  from vit_jax.data import dataset  # pylint: disable=g-import-not-at-top
  from vit_jax.data import pipeline as pipeline_lib

  config = common.get_config()
  config.update(dict(dataset=f"folder:{root}", train_split="train", test_split="test", batch=batch))
  config.update(dict(batch_eval=batch, input_pipeline=pipeline, pp=dict(crop=crop)))
  source = dataset.Dataset(data.Settings.from_config(config))
  for b in pipeline_lib.local_train_batches(source, batch, 0, 0, 1):
    yield b["image"].shape[0]


def _torch(root: str, workers: int, batch: int, crop: int) -> Iterator[int]:
  """A torch DataLoader as timm's `create_loader` runs one, with torchvision's decode."""
  import torch  # pylint: disable=g-import-not-at-top
  from torchvision import io as tv_io  # pylint: disable=g-import-not-at-top
  from torchvision.transforms import v2  # pylint: disable=g-import-not-at-top

  files = sorted(
    os.path.join(d, f) for d, _, names in os.walk(os.path.join(root, "train")) for f in names
  )
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


def measure_row(
  row: str, root: str, workers: int, batch: int = 128, steps: int = 40, warmup: int = 3,
  crop: int = 224,
) -> dict:  # fmt: skip
  """One row in this process, on `workers` cores: {'images', 'wall_s', 'cpu_s'}."""
  sys.path.insert(0, _ROOT)  # this checkout's vit_jax and configs/
  os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:workers])
  if row == "torch DataLoader":
    batches = _torch(root, workers, batch, crop)
  else:
    batches = _ours(root, "tf" if row == "tf.data" else "grain", batch, crop)
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
  done = subprocess.run(
    [sys.executable, os.path.abspath(__file__), args], capture_output=True, text=True, cwd=_ROOT
  )
  if done.returncode:
    return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
  return json.loads(done.stdout.strip().splitlines()[-1])


def compare(
  root: str, workers: int, batch: int = 128, steps: int = 40, rounds: int = 3
) -> list[str]:
  """The rows interleaved in each of `rounds` rounds; the table's lines (also printed)."""
  results: dict[str, list[dict]] = {row: [] for row in ROWS}
  for round_ in range(rounds):
    for row in ROWS:
      load = os.getloadavg()[0]
      result = run_row(row, root, workers, batch, steps)
      results[row].append(result)
      print(f"round {round_} {row}: {result} (load {load:.1f})", flush=True)
  lines = [
    f"| pipeline ({workers} cores) | images/s | images per CPU-second | x tf.data (wall) "
    "| x tf.data (CPU) |",
    "|---|---|---|---|---|",
  ]
  medians = {}
  for row, rs in results.items():
    ok = [r for r in rs if "error" not in r]
    if ok:
      medians[row] = (
        float(np.median([r["images"] / r["wall_s"] for r in ok])),
        float(np.median([r["images"] / r["cpu_s"] for r in ok])),
      )
  base = medians.get("tf.data")
  for row in ROWS:
    if row not in medians:
      lines.append(f"| {row} | not run: {results[row][0]['error']} | | | |")
      continue
    rate, per_cpu = medians[row]
    ratios = f"{rate / base[0]:.2f} | {per_cpu / base[1]:.2f}" if base else "- | -"
    lines.append(f"| {row} | {rate:.0f} | {per_cpu:.0f} | {ratios} |")
  print("\n".join(lines))
  return lines


if __name__ == "__main__":
  print(json.dumps(measure_row(**json.loads(sys.argv[1]))))
