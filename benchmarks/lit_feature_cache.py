r"""A LiT run's train step with the locked image tower's features cached, against the step
that runs the tower on the images (`configs/lit.py:digits`: the quickstart's ViT locked,
SigLIP's 2-layer text tower, batch 128).

    python benchmarks/lit_feature_cache.py [--rounds=5] [--steps=100] [--batch=128]

The image tower's weights come from a one-step quickstart run written to a temporary
folder (only time is measured, and a locked tower costs the same whatever its values).
Both steps are compiled first and take the same real batch of digits every step; rounds
alternate which goes first, and each prints milliseconds per step and the load average
(the other jobs on the machine), so a noisy round shows. The summary: each step's median
round, and the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from configs import lit, quickstart
from vit_jax import run
from vit_jax.data import batching, pipeline
from vit_jax.data.dataset import Dataset


def _pretrained(workdir: str) -> str:
  config = quickstart.get_config()
  config.total_steps, config.lr.warmup_steps, config.eval_every = 2, 1, 2
  run.train_and_evaluate(config, workdir)
  return os.path.join(workdir, "checkpoints")


def _step(source: str, cached: bool, batch_size: int):
  """(jitted step, its state, one global batch) of the LiT digits run."""
  config = lit.get_config("digits")
  config.pretrained, config.batch = source, batch_size
  config.pp.min_area, config.pp.flip = 1.0, False  # what the cache needs
  config.contrastive.cache_image_features = cached
  steps = run.build(config)
  state = steps.init_state()
  dataset = Dataset(steps.spec.data)
  host = next(pipeline.local_train_batches(dataset, batch_size, 0, 0, 1, with_index=True))
  transform = steps.objective.feature_cache(state.params, steps.spec.num_train)
  host = transform(host) if transform else {k: v for k, v in host.items() if k != "index"}
  batch = batching.make_global_batch(host, steps.mesh)
  state, metrics = steps.train_step(state, batch)  # compiles
  jax.block_until_ready(metrics)
  return steps.train_step, state, batch


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--batch", type=int, default=128)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as workdir:
    source = _pretrained(os.path.join(workdir, "quickstart"))
    names = ("images", "cached")
    runs = {name: list(_step(source, name == "cached", args.batch)) for name in names}
  ms = {name: [] for name in runs}
  print(f"{jax.devices()[0].platform}, batch {args.batch}, {args.steps} steps per round")
  for r in range(args.rounds):
    order = list(runs) if r % 2 == 0 else list(runs)[::-1]
    for name in order:
      step, state, batch = runs[name]
      start = time.perf_counter()
      for _ in range(args.steps):
        state, metrics = step(state, batch)
      jax.block_until_ready(metrics)
      ms[name].append(1e3 * (time.perf_counter() - start) / args.steps)
      runs[name][1] = state
    a, b, load = ms["images"][-1], ms["cached"][-1], os.getloadavg()[0]
    print(f"round {r}: images {a:.2f} ms, cached {b:.2f} ms ({a / b:.2f}x), load {load:.1f}")
  a, b = statistics.median(ms["images"]), statistics.median(ms["cached"])
  paired = statistics.median(x / y for x, y in zip(ms["images"], ms["cached"]))
  print(f"median: images {a:.2f} ms/step, cached {b:.2f} ms/step; paired rounds {paired:.2f}x")


if __name__ == "__main__":
  main()
