r"""A config's training end to end against its own step on one fixed device batch.

    python benchmarks/input_overlap.py [--config=quickstart] [--steps=300] [--rounds=3]

Both loops run the same compiled train step as `vit_jax.run.train_and_evaluate` does (at
most `run.loop.MAX_STEPS_IN_FLIGHT` steps in flight): one feeds the batches of
`vit_jax.data.train_iterator` (tf.data, realignment, the prefetch thread), the other the
same device batch every step. Their ratio says how much the input pipeline takes from the
step on this machine (`--prefetch` tries another prefetch depth). Rounds alternate the
loops; each keeps its best round.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import sys
import time
from typing import Any, Callable, Iterator

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from vit_jax import data, run  # pylint: disable=g-import-not-at-top,wrong-import-position


def _loop(step: Callable[[Any, Any], tuple[Any, Any]], state: Any, batches: Iterator[Any], n: int):
  """``n`` steps as the training loop runs them; returns the state and the seconds."""
  in_flight: collections.deque = collections.deque()
  start = time.perf_counter()
  for _ in range(n):
    state, metrics = step(state, next(batches))
    in_flight.append(metrics)
    if len(in_flight) > run.loop.MAX_STEPS_IN_FLIGHT:
      jax.block_until_ready(in_flight.popleft())
  jax.block_until_ready((state, list(in_flight)))
  return state, time.perf_counter() - start


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="quickstart", help="a module of configs/")
  parser.add_argument("--steps", type=int, default=300, help="timed steps per loop and round")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--prefetch", type=int, default=None, help="default: the config's")
  parser.add_argument("--scan", default=None, choices=("true", "false"))
  args = parser.parse_args()
  config = importlib.import_module(f"configs.{args.config}").get_config()
  if args.prefetch is not None:
    config.prefetch = args.prefetch
  if args.scan is not None:
    config.model.scan = args.scan == "true"
  steps = run.build(config)
  state = steps.init_state()
  batches = data.train_iterator(steps.spec.data, steps.mesh)
  fixed = next(batches)
  step = steps.compile_train_step()
  state, _ = _loop(step, state, batches, 20)  # warm-up: tf.data's threads and autotuning
  best = {"end to end": float("inf"), "fixed batch": float("inf")}
  for _ in range(args.rounds):
    state, seconds = _loop(step, state, batches, args.steps)
    best["end to end"] = min(best["end to end"], seconds)
    state, seconds = _loop(step, state, iter(lambda: fixed, None), args.steps)
    best["fixed batch"] = min(best["fixed batch"], seconds)
  img_s = {k: args.steps * config.batch / v for k, v in best.items()}
  print(
    f"{args.config}: end to end {img_s['end to end']:.0f} img/s, one fixed batch "
    f"{img_s['fixed batch']:.0f} img/s, ratio {img_s['end to end'] / img_s['fixed batch']:.2f} "
    f"(batch {config.batch}, prefetch {config.prefetch}, load {os.getloadavg()[0]:.1f})"
  )


if __name__ == "__main__":
  main()
