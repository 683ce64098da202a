"""XLA's cost of RandAugment on a TPU or GPU device, compiled here (libtpu or the CUDA
plugin, compile-only): each op alone on one image, and the augmenter as the train step
runs it on a device's rows, as the plan counts it (loops multiplied out, the switch at
the mean of its ops).

    python benchmarks/randaug_cost.py [--topology=v3-8] [--crop=224] [--rows=128] \
        [--randaug 2 10] [--ops]

Prints a markdown table: FLOPs, HBM bytes and XLA's own time estimate (XLA:TPU's
`optimal_seconds`; none on a GPU) of each, and the time at the chip's bound.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from vit_jax.data import randaug  # noqa: E402
from vit_jax.plan import report, topology  # noqa: E402


def _row(name: str, lowered, chip, what: str) -> str:
  measured, compiled = report.measure(lowered, 1)
  estimate = (compiled.cost_analysis() or {}).get("optimal_seconds")
  bound = report.step_time(
    measured, chip, num_devices=1, step_flops=measured.xla_flops, model_flops=None
  ).bound_s
  xla = f"{estimate * 1e6:.1f}" if estimate else "-"
  return (
    f"| {name} | {what} | {measured.xla_flops:.3g} | {measured.xla_bytes_accessed:.3g} | "
    f"{xla} | {bound * 1e6:.1f} |"
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--topology", default="v3-8")
  parser.add_argument("--crop", type=int, default=224)
  parser.add_argument("--rows", type=int, default=128, help="images per device")
  parser.add_argument("--randaug", type=float, nargs=2, default=(2, 10))
  parser.add_argument("--ops", action="store_true", help="also each op alone on one image")
  args = parser.parse_args()
  slice_ = topology.parse(args.topology)
  topology.prepare_environment(slice_)
  device = slice_.devices()[0]
  chip = slice_.chip
  on = jax.sharding.SingleDeviceSharding(device)
  layers, magnitude = int(args.randaug[0]), float(args.randaug[1])
  print(f"{args.topology} ({chip.device_kind}), crop {args.crop}, RandAugment ({layers}, "
        f"{magnitude:g})\n")  # fmt: skip
  print("| what | on | FLOPs | HBM bytes | XLA's estimate (us) | bound (us) |")
  print("|---|---|---|---|---|---|")
  image = jax.ShapeDtypeStruct((args.crop, args.crop, 3), jnp.uint8, sharding=on)
  if args.ops:
    no = jax.ShapeDtypeStruct((), jnp.bool_, sharding=on)
    centre = jax.ShapeDtypeStruct((2,), jnp.int32, sharding=on)
    for name, op in zip(randaug.OPS, randaug.branches(magnitude)):
      print(_row(name, jax.jit(op).lower(image, no, centre), chip, "1 image"), flush=True)
  augment = randaug.make_augmenter((layers, magnitude), (0.5,) * 3, (0.5,) * 3)
  batch = {
    "image": jax.ShapeDtypeStruct((args.rows, args.crop, args.crop, 3), jnp.float32, sharding=on)
  }
  key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=on)
  lowered = jax.jit(augment).lower(batch, key)
  print(_row("the augmenter", lowered, chip, f"{args.rows} images"), flush=True)


if __name__ == "__main__":
  main()
