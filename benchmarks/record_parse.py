r"""Parsing tfds' serialized examples: `records.parse` (protobuf classes tfds ships, no
TensorFlow) beside TensorFlow's `tf.io.parse_example` (what it replaced), on the records a
read hands it at once.

Each round parses ``--records`` serialized tf.train.Examples (an ``image`` of ``--size``
random bytes and a ``label``) both ways, alternating, and keeps each way's best of
``--repeats``; the table prints each round's milliseconds and the ratio.

    python benchmarks/record_parse.py [--records 1024] [--sizes 300 110000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import tensorflow as tf

from vit_jax.data import records

_FEATURES = {
  "image": tf.io.FixedLenFeature([], tf.string),
  "label": tf.io.FixedLenFeature([], tf.int64),
}


def _records(n: int, size: int) -> list[bytes]:
  """``n`` serialized examples with an image of ``size`` random bytes and a label."""
  out = []
  for i in range(n):
    feature = {
      "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[os.urandom(size)])),
      "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 10])),
    }
    out.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
  return out


def _tensorflow(serialized: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
  parsed = tf.io.parse_example(tf.constant(serialized, tf.string), _FEATURES)
  return parsed["image"].numpy().astype(object), parsed["label"].numpy().astype(np.int64)


def _best_ms(parse, serialized: list[bytes], repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    parse(serialized)
    times.append(time.perf_counter() - start)
  return 1e3 * min(times)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--records", type=int, default=1024)
  parser.add_argument("--sizes", type=int, nargs="+", default=[300, 110_000])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  print("| image bytes | round | tf.io.parse_example ms | records.parse ms | ratio (tf / ours) |")
  print("|---|---|---|---|---|")
  for size in args.sizes:
    serialized = _records(args.records, size)
    ours, theirs = records.parse(serialized), _tensorflow(serialized)
    assert list(ours[0]) == list(theirs[0]) and (ours[1] == theirs[1]).all()
    for r in range(args.rounds):
      t_tf = _best_ms(_tensorflow, serialized, args.repeats)
      t_ours = _best_ms(records.parse, serialized, args.repeats)
      print(f"| {size:,} | {r} | {t_tf:.2f} | {t_ours:.2f} | {t_tf / t_ours:.2f} |")


if __name__ == "__main__":
  main()
