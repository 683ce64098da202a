r"""The paper's Fig. 12 (Appendix D.5) from compile-only TPUv3 cores: inference speed and
the largest batch per core against the input size.

    python benchmarks/fig12.py --out=/tmp/fig12.jsonl [--models=ViT-B_32,ViT-B_16] \
        [--sizes=224,384,512] [--figure=docs/figures/fig12_inference.png]

For each model and input size (rounded up to a multiple of the model's input stride),
`vit_jax.plan.inference.inference_point` compiles the forward pass (bf16 compute, f32
parameters, a 1000-class head) for one TPUv3 TensorCore: two probe batches, a linear
extrapolation of their memory to the core's budget (90% of its 16 GiB, as the plan) and
a confirming compile. One JSON line per point is appended to ``--out`` (points already
there are not compiled again, so an interrupted run resumes); the table and the figure
are made from the file. The default grid is the paper's: every model below (the BiT
ResNets where this checkout has them) at 224 to 640.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

from vit_jax import models
from vit_jax.api import plots
from vit_jax.infra import hardware
from vit_jax.plan import inference, topology

MODELS = (
  "ViT-B_32",
  "ViT-B_16",
  "ViT-L_32",
  "ViT-L_16",
  "ViT-H_14",
  "BiT-R50x1",
  "BiT-R50x2",
  "BiT-R101x1",
  "BiT-R152x1",
  "BiT-R152x2",
)
SIZES = (224, 320, 384, 448, 512, 640)
CHIP = hardware.CHIPS["v3"]


def stride_of(model_config) -> int:
  """Pixels per token along a side (a ResNet's whole downsampling: 32)."""
  built = models.create_model(model_config, num_classes=inference.NUM_CLASSES)
  stride = getattr(built, "input_stride", (32, 32))
  return int(stride[0])


def compile_point(name: str, size: int, device) -> dict:
  config = models.get_model_config(name)
  stride = stride_of(config)
  image_size = -(-size // stride) * stride
  start = time.perf_counter()
  point = inference.inference_point(config, image_size, CHIP, device)
  row = dataclasses.asdict(point)
  row.update(model=name, size=size, wall_seconds=time.perf_counter() - start)
  return row


def table(rows: list[dict]) -> str:
  lines = [
    "| model | input | largest batch / core | img/s / core (bound) | compiles (batch: GiB) |",
    "|---|---|---|---|---|",
  ]
  for r in sorted(rows, key=lambda r: (MODELS.index(r["model"]), r["image_size"])):
    compiles = ", ".join(
      f"{c['batch']}: {c['bytes_needed'] / 2**30:.2f}{'' if c['fits'] else ' (over)'}"
      for c in r["compiles"]
    )
    speed = f"{r['images_per_s']:.0f}" if r["images_per_s"] else "-"
    lines.append(
      f"| {r['model']} | {r['image_size']} | {r['largest_batch']} | {speed} | {compiles} |"
    )
  return "\n".join(lines)


def draw(rows: list[dict], path: str) -> None:
  by_model: dict[str, list[dict]] = {}
  for r in sorted(rows, key=lambda r: r["image_size"]):
    by_model.setdefault(r["model"], []).append(r)
  fig = plots.plot_inference_cost(
    {
      name: (
        [r["image_size"] for r in points],
        [r["images_per_s"] or 0.0 for r in points],
        [r["largest_batch"] for r in points],
      )
      for name, points in by_model.items()
    }
  )
  fig.savefig(path, dpi=80, bbox_inches="tight")
  print("wrote", path)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", required=True, help="JSON lines file, appended to")
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
  parser.add_argument("--figure", default="", help="PNG to draw (none when empty)")
  args = parser.parse_args()
  done: list[dict] = []
  if os.path.exists(args.out):
    with open(args.out) as f:
      done = [json.loads(line) for line in f if line.strip()]
  seen = {(r["model"], r["size"]) for r in done}
  names = [n for n in args.models.split(",") if n in models.MODEL_NAMES]
  sizes = [int(s) for s in args.sizes.split(",")]
  slice_ = topology.parse("v3-2")  # one chip: its first TensorCore is the core
  topology.prepare_environment(slice_)
  device = slice_.devices()[0]
  for name in names:
    for size in sizes:
      if (name, size) in seen:
        continue
      row = compile_point(name, size, device)
      done.append(row)
      with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")
      print(f"{name} {size}: batch {row['largest_batch']}, {row['wall_seconds']:.0f} s", flush=True)
  print(table(done))
  if args.figure:
    draw(done, args.figure)


if __name__ == "__main__":
  main()
