"""Readers: the visiting order of order.py -> chunks of examples for the decoding stage.

A reader is the generator function the pipeline hands to its stage (`decode_stage`
iterates it). Called, it streams (positions, uids, values, labels, texts) chunks, each
[k], in stream-position order; uid = epoch * num_examples + index in
the split (it seeds the train augmentation). A source with free text (`free_text`) reads
a third array, each example's captions; the reader picks one per example and epoch
(`free_text.choose`, keyed by the uid, so resumed and multi-process runs pick alike); the
texts of other sources are empty. The next read runs in a thread while a chunk
is consumed; a failed read raises from the stream. A train reader's stream also ends as
soon as its `stop` event is set (the train iterator was closed), without waiting for a
read in progress.

ShardReader serves one contiguous shard of the split (evaluation); LaneReader serves a
block of rows of every global train batch (the lanes of pipeline.py's docstring).
"""

from __future__ import annotations

import abc
import concurrent.futures
import threading
from typing import Any, Callable, Iterator, Protocol, TypeVar

import numpy as np

from vit_jax.data import free_text, order
from vit_jax.data.splits import SplitSource

CHUNK = 1024  # Examples handed to the decoding stage at a time.
_POLL_SECONDS = 0.05  # How often a stream waiting for a read checks its stop event.

# positions, uids, values, labels, texts (bytes: one caption per example, or b'')
Chunk = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
Arrays = tuple[np.ndarray, ...]  # a source's read: values, labels[, captions]
Example = tuple[Any, int, int, int]  # value, label, index in the split, uid
Segment = tuple[order.Piece, int, int]  # piece.offsets[a:b], in visiting order
WindowKey = tuple[int, tuple[int, int]]  # (local lane, window in the lane)
Plan = list[list[Segment]]  # Per local lane: the segments it serves in a block of steps.
Block = tuple[Plan, set[WindowKey], list[WindowKey]]

_Item = TypeVar("_Item")
_Loaded = TypeVar("_Loaded")


class Reader(Protocol):
  """What the pipeline needs of a reader."""

  source: SplitSource

  def __call__(self) -> Iterator[Chunk]:
    """The stream from the reader's start; a failed read raises."""
    ...

  def locate(self, position: int) -> Example:
    """(value, label, index in the split, uid) of the example at a stream position."""
    ...


def _read_ahead(
  items: Iterator[_Item], load: Callable[[_Item], _Loaded], stop: threading.Event | None = None
) -> Iterator[tuple[_Item, _Loaded]]:
  """(item, load(item)) for each item; the next item loads in a thread meanwhile.

  Ends as soon as `stop` is set, without waiting for a load in progress: it finishes in
  its thread, which the interpreter joins at exit (so no read is left running then).
  """
  pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="vit_jax-read-ahead")
  try:
    current = next(items, None)
    pending = pool.submit(load, current) if current is not None else None
    while current is not None:
      while True:
        if stop is not None and stop.is_set():
          return
        try:
          loaded = pending.result(timeout=_POLL_SECONDS)
          break
        except concurrent.futures.TimeoutError:
          pass
      following = next(items, None)
      pending = pool.submit(load, following) if following is not None else None
      yield current, loaded
      current = following
  finally:
    pool.shutdown(wait=False, cancel_futures=True)


class _PieceReader(abc.ABC):
  """What both readers share: chunks of read rows, and locating a position by its piece."""

  def __init__(self, source: SplitSource, seed: int | None = None):
    self.source = source
    self.seed = seed  # picks a caption per epoch; None: each example's first (evaluation)

  def _chunk(self, positions: np.ndarray, uids: np.ndarray, rows: Arrays) -> Chunk:
    """A chunk of read rows (values, labels[, captions]), one caption picked per row."""
    values, labels = rows[0], rows[1]
    if len(rows) > 2:
      texts = free_text.choose(rows[2], uids, self.seed)
    else:
      texts = np.full(len(values), b"", object)
    return positions, uids, values, labels, texts

  @abc.abstractmethod
  def __call__(self) -> Iterator[Chunk]:
    """The stream from the reader's start (`Reader`)."""

  @abc.abstractmethod
  def _piece_at(self, position: int) -> tuple[int, order.Piece]:
    """(split index of the shard's first example, the shard's piece from `position`)."""

  def locate(self, position: int) -> Example:
    shard_start, piece = self._piece_at(position)
    index = shard_start + piece.window[0] + int(piece.offsets[0])
    values, labels = self.source.read(index, index + 1)[:2]
    return values[0], int(labels[0]), index, piece.epoch * self.source.num_examples + index


class ShardReader(_PieceReader):
  """Examples of the shard starting at split index `shard_start`, in the order of
  `pieces_from(p)`: the shard's order.Piece-s from stream position p on."""

  def __init__(
    self, source: SplitSource, shard_start: int, pieces_from: Callable[[int], Iterator[order.Piece]]
  ):
    super().__init__(source)
    self.shard_start = shard_start
    self.pieces_from = pieces_from

  def _read(self, piece: order.Piece) -> Arrays:
    lo, hi = piece.window
    return self.source.read(self.shard_start + lo, self.shard_start + hi)

  def __call__(self) -> Iterator[Chunk]:
    n = self.source.num_examples
    for piece, rows in _read_ahead(self.pieces_from(0), self._read):
      for c in range(0, len(piece.offsets), CHUNK):
        idx = piece.offsets[c : c + CHUNK]
        positions = piece.position + c + np.arange(len(idx), dtype=np.int64)
        uids = piece.epoch * n + self.shard_start + piece.window[0] + idx
        yield self._chunk(positions, uids, tuple(a[idx] for a in rows))

  def _piece_at(self, position: int) -> tuple[int, order.Piece]:
    return self.shard_start, next(self.pieces_from(position))


class _LaneCursor:
  """Walks one lane's endless stream of order.Piece-s, a few positions at a time."""

  def __init__(self, pieces: Iterator[order.Piece]):
    self._pieces = pieces
    self._piece = next(pieces)
    self._i = 0

  def take(self, count: int) -> list[Segment]:
    """The next `count` positions as (piece, a, b): piece.offsets[a:b] in order."""
    out = []
    while count:
      if self._i == len(self._piece.offsets):
        self._piece, self._i = next(self._pieces), 0
      k = min(count, len(self._piece.offsets) - self._i)
      out.append((self._piece, self._i, self._i + k))
      self._i += k
      count -= k
    return out


class LaneReader(_PieceReader):
  """Rows [first_lane, first_lane + k) of every global train batch of `num_lanes` rows.

  Row j of step s is position s * k + j of this process's stream, served by lane
  first_lane + j at lane position s. Lane r holds examples
  order.process_shard(n, r, num_lanes) and visits them in windows of `window`
  (order.train_pieces keyed by r), so the global batches are the same for any process
  count and this process reads only its lanes. The windows a block of steps needs are
  read with one source.read_many (from a random-access source, whose lanes are one
  window each, only the block's examples), the next block's in a thread meanwhile. Setting
  `stop` ends the stream promptly (see the module docstring).
  """

  def __init__(
    self,
    source: SplitSource,
    first_lane: int,
    num_local: int,
    num_lanes: int,
    window: int,
    seed: int,
    start_step: int,
    stop: threading.Event | None = None,
  ):
    super().__init__(source, seed)
    self.num_local, self.start_step, self.stop = num_local, start_step, stop
    self.lanes = range(first_lane, first_lane + num_local)
    self.bounds = [order.process_shard(source.num_examples, r, num_lanes) for r in self.lanes]
    self.window = window
    self.block_steps = max(1, CHUNK // num_local)

  def _pieces(self, j: int, lane_position: int) -> Iterator[order.Piece]:
    lo, hi = self.bounds[j]
    return order.train_pieces(hi - lo, self.window, self.seed, self.lanes[j], lane_position)

  def _blocks(self) -> Iterator[Block]:
    """Per block of steps: its plan, the windows it needs, and those of them the
    previous block did not need (the ones to read)."""
    cursors = [_LaneCursor(self._pieces(j, self.start_step)) for j in range(self.num_local)]
    previous: set[WindowKey] = set()
    while True:
      plan = [c.take(self.block_steps) for c in cursors]
      needed = {(j, piece.window) for j, segments in enumerate(plan) for piece, _, _ in segments}
      yield plan, needed, sorted(needed - previous)
      previous = needed

  def _load(self, block: Block) -> Any:
    """The windows a block reads, {key: (values, labels[, captions])}; from a
    random-access source just the block's examples, each array [lane, step]."""
    plan, _, keys = block
    if self.source.random_access:
      index, _ = self._indices(plan)
      loaded = self.source.read_many([(i, i + 1) for i in index.ravel().tolist()])
      return tuple(np.concatenate(a).reshape(index.shape) for a in zip(*loaded))
    ranges = [(self.bounds[j][0] + lo, self.bounds[j][0] + hi) for j, (lo, hi) in keys]
    return dict(zip(keys, self.source.read_many(ranges)))

  def _indices(self, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(split index, epoch) of each example of a block, both int64 [lane, step]."""
    index = np.zeros([self.num_local, self.block_steps], np.int64)
    epochs = np.zeros([self.num_local, self.block_steps], np.int64)
    for j, segments in enumerate(plan):
      t = 0
      for piece, a, b in segments:
        index[j, t : t + b - a] = self.bounds[j][0] + piece.window[0] + piece.offsets[a:b]
        epochs[j, t : t + b - a] = piece.epoch
        t += b - a
    return index, epochs

  def _gather(self, plan: Plan, cache: dict) -> Arrays:
    """(values, labels[, captions]) of a block's examples, each [lane, step], from the
    cached windows."""
    shape = [self.num_local, self.block_steps]
    out: Arrays = ()
    for j, segments in enumerate(plan):
      t = 0
      for piece, a, b in segments:
        window = cache[(j, piece.window)]
        out = out or tuple(np.zeros(shape, w.dtype) for w in window)
        for gathered, rows in zip(out, window):
          gathered[j, t : t + b - a] = rows[piece.offsets[a:b]]
        t += b - a
    return out

  def __call__(self) -> Iterator[Chunk]:
    """Per block, (positions, uids, values, labels) in position order."""
    cache, step = {}, self.start_step
    for (plan, needed, _), loaded in _read_ahead(self._blocks(), self._load, self.stop):
      if self.source.random_access:
        rows = loaded
      else:
        cache = {key: v for key, v in cache.items() if key in needed}
        cache.update(loaded)
        rows = self._gather(plan, cache)
      index, epochs = self._indices(plan)
      uids = epochs * self.source.num_examples + index
      positions = step * self.num_local + np.arange(index.size, dtype=np.int64)
      yield self._chunk(positions, uids.T.ravel(), tuple(a.T.ravel() for a in rows))
      step += self.block_steps

  def _piece_at(self, position: int) -> tuple[int, order.Piece]:
    step, j = divmod(position, self.num_local)
    return self.bounds[j][0], next(self._pieces(j, step))
