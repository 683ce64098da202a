"""The order in which a process visits examples: pure numpy, no I/O.

A shard is a contiguous block of the split (process_shard: sizes differ by at most
one): in training one "lane" per row of the global batch (keyed by the row, so the
batches do not depend on the process count; see pipeline.py), in evaluation one per
process. A training stream is an endless sequence of positions 0, 1, 2, ...;
position q is in epoch q // n (n = shard size). Every epoch visits the shard once in
a seeded order (the `process` argument of train_pieces is the lane):

  * the shard is cut into windows of `window` consecutive examples (the last may be
    shorter); the windows are visited in a random order seeded by (seed, process,
    epoch), and the examples inside each window in a random order seeded by (seed,
    process, epoch, window). For random-access sources window = n: a full permutation.

A stream can start at any position: only the permutations of the first epoch and
window are computed, nothing is read or decoded for the skipped positions. Seeds go
through numpy's RandomState, whose streams are frozen across numpy versions.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np


def process_shard(n: int, index: int, count: int) -> tuple[int, int]:
  """[start, stop) of the examples that process `index` of `count` reads."""
  return n * index // count, n * (index + 1) // count


@dataclasses.dataclass(frozen=True)
class Piece:
  """Consecutive stream positions served from one window of a process's shard.

  window: [start, stop) of the window in shard-local example indices.
  offsets: int64 [k], indices into the window, in visiting order.
  position: stream position of offsets[0].
  """

  epoch: int
  window: tuple[int, int]
  offsets: np.ndarray
  position: int


def _rng(seed: int, *key: int) -> np.random.RandomState:
  """A RandomState keyed by a 64-bit seed and small non-negative ints."""
  words = [seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, *key]
  return np.random.RandomState(np.array(words, dtype=np.uint32))


def _windows(n: int, window: int) -> list[tuple[int, int]]:
  return [(lo, min(lo + window, n)) for lo in range(0, n, window)]


def train_pieces(n: int, window: int, seed: int, process: int, start: int = 0) -> Iterator[Piece]:
  """The endless shuffled stream of a shard of n examples, from position `start`."""
  if n <= 0:
    raise ValueError(f"A process shard has {n} examples; it needs at least one.")
  windows = _windows(n, max(1, min(window, n)))
  epoch, skip = divmod(start, n)
  while True:
    position = epoch * n
    for w in _rng(seed, process, epoch, 0, 0).permutation(len(windows)):
      lo, hi = windows[w]
      if skip >= hi - lo:  # The whole window is before `start`: skip it unread.
        skip -= hi - lo
        position += hi - lo
        continue
      offsets = _rng(seed, process, epoch, 1, int(w)).permutation(hi - lo)[skip:]
      yield Piece(epoch, (lo, hi), offsets.astype(np.int64), position + skip)
      position += hi - lo
      skip = 0
    epoch += 1


def eval_pieces(n: int, window: int, start: int = 0) -> Iterator[Piece]:
  """One pass over examples start..n-1 of a shard in stored order, `window` at a time."""
  for lo in range(start, n, max(1, window)):
    hi = min(lo + window, n)
    yield Piece(0, (lo, hi), np.arange(hi - lo, dtype=np.int64), lo)
