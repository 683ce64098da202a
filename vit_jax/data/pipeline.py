"""The train and eval input pipelines: ordered example indices -> global batches.

Per process:
  order.py positions -> (position, uid, encoded image or path, label) chunks, read
  ahead in a thread -> tf.data: read file, decode + preprocess in parallel
  (deterministic order), drop examples whose image fails -> numpy batches realigned on
  positions, so a failed image is found by position and reported by name (or, with
  config.skip_corrupt_images, replaced) -> batching.prefetch_to_device.

Train batches do not depend on the process count: row r of every global batch of B rows
comes from "lane" r, the r-th of B contiguous blocks of the split, which visits its
examples in its own seeded order (order.train_pieces keyed by r). A process supplies a
contiguous block of rows, so it reads only the lanes of those rows: its own contiguous
1/process_count of the split. Evaluation shards the split contiguously per process.

Train batches: {'image': f32[B, crop, crop, 3], 'label': f32[B, K]}, no mask (every
row is a real example). Eval batches add 'mask': f32[B], 1 for real examples and 0 for
padding, so a pass visits every example exactly once whatever the batch size.

A failed image is an error naming the file (or tfds example) with the decoder's
message. With config.skip_corrupt_images=True it is logged and counted instead: in
training the row is filled with another example of the same batch, which keeps every
later batch, and exact resume, unchanged; in evaluation the row gets mask 0.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
from typing import Any, Callable, Iterator

import jax
import numpy as np
import tensorflow as tf

from vit_jax.data import batching
from vit_jax.data import order
from vit_jax.data import preprocess
from vit_jax.data.dataset import Dataset, Settings
from vit_jax.data.splits import SplitSource

_CHUNK = 1024  # Examples handed from Python to tf.data at a time.
_EVAL_WINDOW = 10_000  # Examples an eval pass reads from a tfds split at a time.

Batch = dict[str, np.ndarray]


class _Reader:
  """Turns order.Piece-s of one shard into chunks of examples (evaluation); remembers a
  failure for later.

  tf.data ends a generator's stream quietly when it raises under ignore_errors(), so
  the exception is kept here and re-raised by the consumer.
  """

  def __init__(self, source: SplitSource, shard_start: int, start: int,
               pieces_from: Callable[[int], Iterator[order.Piece]]):
    """pieces_from(p): the shard's visiting order from stream position p on."""
    self.source = source
    self.shard_start = shard_start
    self.start = start
    self.pieces_from = pieces_from
    self.error: BaseException | None = None

  def _windows(self) -> Iterator[tuple[order.Piece, np.ndarray, np.ndarray]]:
    """(piece, values, labels) of its window; the next window loads meanwhile."""
    def read(piece: order.Piece):
      lo, hi = piece.window
      return self.source.read(self.shard_start + lo, self.shard_start + hi)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      pieces = self.pieces_from(self.start)
      current = next(pieces, None)
      pending = pool.submit(read, current) if current else None
      while current is not None:
        values, labels = pending.result()
        following = next(pieces, None)
        pending = pool.submit(read, following) if following else None
        yield current, values, labels
        current = following

  def __call__(self) -> Iterator[tuple[np.ndarray, ...]]:
    """(positions, uids, values, labels) chunks, each [k]; uid = epoch * N + index."""
    try:
      n = self.source.num_examples
      for piece, values, labels in self._windows():
        for c in range(0, len(piece.offsets), _CHUNK):
          idx = piece.offsets[c:c + _CHUNK]
          positions = piece.position + c + np.arange(len(idx), dtype=np.int64)
          uids = piece.epoch * n + self.shard_start + piece.window[0] + idx
          yield positions, uids, values[idx], labels[idx]
    except Exception as e:  # Kept for the consumer; see the class docstring.
      self.error = e

  def locate(self, position: int) -> tuple[Any, int, int, int]:
    """(value, label, index in the split, uid) of the example at a stream position."""
    piece = next(self.pieces_from(position))
    index = self.shard_start + piece.window[0] + int(piece.offsets[0])
    values, labels = self.source.read(index, index + 1)
    uid = piece.epoch * self.source.num_examples + index
    return values[0], int(labels[0]), index, uid


def _read_ranges(source: SplitSource, ranges: list[tuple[int, int]]
                 ) -> list[tuple[np.ndarray, np.ndarray]]:
  """(values, labels) of each [start, stop) range; one read when the source can."""
  read_many = getattr(source, 'read_many', None)
  if read_many is not None:
    return read_many(ranges)
  return [source.read(lo, hi) for lo, hi in ranges]


class _LaneCursor:
  """Walks one lane's endless stream of order.Piece-s, a few positions at a time."""

  def __init__(self, pieces: Iterator[order.Piece]):
    self._pieces = pieces
    self._piece = next(pieces)
    self._i = 0

  def take(self, count: int) -> list[tuple[order.Piece, int, int]]:
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


class _LaneReader:
  """Rows [first_lane, first_lane + k) of every global train batch of `num_lanes` rows.

  Row j of step s is position s * k + j of this process's stream, served by lane
  first_lane + j at lane position s. Lane r holds examples
  order.process_shard(n, r, num_lanes) and visits them in windows of `window`
  (order.train_pieces keyed by r), so the global batches are the same for any process
  count and this process reads only its lanes. The windows a block of steps needs are
  read together, the next block's in a thread meanwhile. Same interface as _Reader.
  """

  def __init__(self, source: SplitSource, first_lane: int, num_local: int,
               num_lanes: int, window: int, seed: int, start_step: int):
    self.source = source
    self.num_local, self.start_step = num_local, start_step
    self.lanes = range(first_lane, first_lane + num_local)
    self.bounds = [order.process_shard(source.num_examples, r, num_lanes)
                   for r in self.lanes]
    self.window, self.seed = window, seed
    self.block_steps = max(1, _CHUNK // num_local)
    self.error: BaseException | None = None

  def _pieces(self, j: int, lane_position: int) -> Iterator[order.Piece]:
    lo, hi = self.bounds[j]
    return order.train_pieces(hi - lo, self.window, self.seed, self.lanes[j],
                              lane_position)

  def _plans(self) -> Iterator[list[list[tuple[order.Piece, int, int]]]]:
    """Per block of steps, per lane: the (piece, a, b) segments it serves."""
    cursors = [_LaneCursor(self._pieces(j, self.start_step))
               for j in range(self.num_local)]
    while True:
      yield [c.take(self.block_steps) for c in cursors]

  @staticmethod
  def _windows(plan) -> set[tuple[int, tuple[int, int]]]:
    return {(j, piece.window) for j, segments in enumerate(plan)
            for piece, _, _ in segments}

  def _load(self, keys: list[tuple[int, tuple[int, int]]]) -> dict:
    ranges = [(self.bounds[j][0] + lo, self.bounds[j][0] + hi) for j, (lo, hi) in keys]
    return dict(zip(keys, _read_ranges(self.source, ranges)))

  def _chunk(self, plan, cache: dict, step: int) -> tuple[np.ndarray, ...]:
    """(positions, uids, values, labels) of one block, in position order."""
    n, k, steps = self.source.num_examples, self.num_local, self.block_steps
    index = np.zeros([k, steps], np.int64)  # Example index in the split, per lane/step.
    uids = np.zeros([k, steps], np.int64)
    values = np.empty([k, steps], object)
    labels = np.zeros([k, steps], np.int64)
    for j, segments in enumerate(plan):
      t = 0
      for piece, a, b in segments:
        offsets = piece.offsets[a:b]
        window_values, window_labels = cache[(j, piece.window)]
        index[j, t:t + b - a] = self.bounds[j][0] + piece.window[0] + offsets
        uids[j, t:t + b - a] = piece.epoch * n + index[j, t:t + b - a]
        values[j, t:t + b - a] = window_values[offsets]
        labels[j, t:t + b - a] = window_labels[offsets]
        t += b - a
    positions = step * k + np.arange(steps * k, dtype=np.int64)
    return positions, uids.T.ravel(), values.T.ravel(), labels.T.ravel()

  def __call__(self) -> Iterator[tuple[np.ndarray, ...]]:
    try:
      with concurrent.futures.ThreadPoolExecutor(1) as pool:
        plans = self._plans()
        plan, cache = next(plans), {}
        pending = pool.submit(self._load, sorted(self._windows(plan)))
        step = self.start_step
        while True:
          cache.update(pending.result())
          following = next(plans)
          needed = self._windows(following)
          pending = pool.submit(self._load, sorted(needed - set(cache)))
          yield self._chunk(plan, cache, step)
          cache = {key: v for key, v in cache.items() if key in needed}
          plan, step = following, step + self.block_steps
    except Exception as e:  # Kept for the consumer; see _Reader.
      self.error = e

  def locate(self, position: int) -> tuple[Any, int, int, int]:
    """(value, label, index in the split, uid) of the example at a stream position."""
    step, j = divmod(position, self.num_local)
    piece = next(self._pieces(j, step))
    index = self.bounds[j][0] + piece.window[0] + int(piece.offsets[0])
    values, labels = self.source.read(index, index + 1)
    return values[0], int(labels[0]), index, piece.epoch * self.source.num_examples + index


def _dataset(reader: _Reader | _LaneReader, example_fn, local_batch: int) -> tf.data.Dataset:
  """tf.data: chunks -> examples -> preprocessed (failed ones dropped) -> batches."""
  spec = (tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64),
          tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int64))
  ds = tf.data.Dataset.from_generator(reader, output_signature=spec).unbatch()
  ds = ds.map(example_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  ds = ds.ignore_errors()  # Missing positions are found and reported by _realign.
  return ds.batch(local_batch).prefetch(tf.data.AUTOTUNE)


def _example_fn(settings: Settings, kind: str, num_classes: int, train: bool):
  """(position, uid, value, label) -> (position, image [crop, crop, 3], label [K])."""
  seed = tf.constant(settings.seed, tf.int64)

  def fn(position, uid, value, label):
    data = tf.io.read_file(value) if kind == 'path' else value
    if train:
      image = preprocess.train_image(
          data, tf.stack([seed, uid]), crop=settings.crop,
          min_area=settings.min_area, flip=settings.flip)
    else:
      image = preprocess.eval_image(data, crop=settings.crop)
    return position, image, preprocess.one_hot(label, num_classes)

  return fn


def _realign(batches: Iterator[tuple[np.ndarray, ...]], first: int, size: int,
             image_shape: tuple[int, ...], num_classes: int, stop: int | None = None
             ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
  """Batches with possibly missing positions -> batches of positions [q, q + size).

  Yields (q, images [size, ...], labels [size, K], present bool [size]); absent rows
  are zeros. An incoming batch that is exactly the next expected one passes through
  uncopied; otherwise each row is copied once into its place. After the input ends,
  batches continue (all absent) until position `stop`.
  """
  pending: collections.deque = collections.deque()  # (positions, images, labels)
  last = first - 1  # Highest position received so far.
  q = first

  def cut() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    images = np.zeros([size, *image_shape], np.float32)
    labels = np.zeros([size, num_classes], np.float32)
    present = np.zeros([size], bool)
    while pending and pending[0][0][0] < q + size:
      pos, img, lab = pending.popleft()
      k = int(np.searchsorted(pos, q + size))  # Rows of this batch: pos[:k].
      rows = pos[:k] - q
      images[rows], labels[rows], present[rows] = img[:k], lab[:k], True
      if k < len(pos):
        pending.appendleft((pos[k:], img[k:], lab[k:]))
    return images, labels, present

  for pos, img, lab in batches:
    if (not pending and len(pos) == size and pos[0] == q
        and pos[-1] == q + size - 1):
      yield q, img, lab, np.ones([size], bool)
      q, last = q + size, pos[-1]
      continue
    if len(pos):
      pending.append((pos, img, lab))
      last = pos[-1]
    while last >= q + size:  # Everything before q + size has arrived.
      yield q, *cut()
      q += size
  while pending or (stop is not None and q < stop):
    yield q, *cut()
    q += size


class _Failures:
  """Reports images that could not be read or decoded: raise, or log and count."""

  def __init__(self, reader: _Reader | _LaneReader, example_fn, skip: bool):
    self.reader, self.example_fn, self.skip = reader, example_fn, skip
    self.count = 0

  def report(self, position: int) -> None:
    value, label, index, uid = self.reader.locate(position)
    source = self.reader.source
    if source.kind == 'path':
      name = value.decode() if isinstance(value, bytes) else str(value)
    else:
      name = f'example {index} of {source.name}'
    try:  # Run the same function again, eagerly, to recover the decoder's message.
      self.example_fn(tf.constant(position, tf.int64), tf.constant(uid, tf.int64),
                      tf.constant(value), tf.constant(label, tf.int64))
      reason = 'it failed inside the input pipeline'
    except (tf.errors.OpError, ValueError) as e:
      reason = getattr(e, 'message', str(e)).strip().splitlines()[0]
    if not self.skip:
      raise ValueError(
          f'Cannot read image {name!r}: {reason}. Remove or replace the file, or set '
          f'config.skip_corrupt_images=True to skip such images (logged and counted).')
    self.count += 1
    logging.warning('Skipped unreadable image %r (%s); %d skipped so far.', name,
                    reason, self.count)


def _stream_failed(reader: _Reader | _LaneReader) -> BaseException:
  return reader.error or RuntimeError(f'The input stream of {reader.source.name} ended.')


def local_train_batches(dataset: Dataset, local_batch: int, start_step: int,
                        process: int, process_count: int) -> Iterator[Batch]:
  """Endless host-local train batches of one process, from `start_step` on.

  They are rows [process * local_batch, (process + 1) * local_batch) of the global
  batches of local_batch * process_count rows, which do not depend on process_count
  (see the module docstring). Random-access sources shuffle each lane whole; others in
  windows of shuffle_buffer // global batch (at least 1) examples per lane.
  """
  settings = dataset.settings
  source = dataset.split(settings.train_split)
  num_lanes = local_batch * process_count
  if source.num_examples < num_lanes:
    raise ValueError(
        f'Split {source.name} has {source.num_examples} examples, fewer than the global '
        f'batch of {num_lanes}; use a larger split or a smaller config.batch.')
  window = (source.num_examples if source.random_access
            else max(1, settings.shuffle_buffer // num_lanes))
  reader = _LaneReader(source, process * local_batch, local_batch, num_lanes, window,
                       settings.seed, start_step)
  example_fn = _example_fn(settings, source.kind, dataset.num_classes, train=True)
  failures = _Failures(reader, example_fn, settings.skip_corrupt_images)
  shape = (settings.crop, settings.crop, 3)

  def batches() -> Iterator[Batch]:
    ds = _dataset(reader, example_fn, local_batch)
    for q, images, labels, present in _realign(
        ds.as_numpy_iterator(), start_step * local_batch, local_batch, shape,
        dataset.num_classes):
      if reader.error is not None:
        raise reader.error
      if not present.all():
        for row in np.flatnonzero(~present):
          failures.report(q + int(row))
        if not present.any():
          raise ValueError(f'No image of a whole batch of {source.name} could be read '
                           f'(positions {q}..{q + local_batch - 1}); check the data.')
        # Fill each failed row with the nearest readable row of the same batch.
        ok = np.flatnonzero(present)
        for row in np.flatnonzero(~present):
          src = ok[np.argmin(np.abs(ok - row))]
          images[row], labels[row] = images[src], labels[src]
      yield {'image': images, 'label': labels}
    raise _stream_failed(reader)

  return batches()


class EvalBatches:
  """One pass over a split in host-local batches with 'mask'; iterable many times."""

  def __init__(self, dataset: Dataset, split: str, local_batch: int, process: int,
               process_count: int):
    settings = dataset.settings
    self.source = dataset.split(split)
    n = self.source.num_examples
    lo, hi = order.process_shard(n, process, process_count)
    largest = -(-n // process_count)  # Every process yields the same number of batches.
    self.num_batches = -(-largest // local_batch)
    self._local_batch, self._size = local_batch, hi - lo
    window = hi - lo if self.source.random_access else _EVAL_WINDOW
    self._reader = _Reader(self.source, lo, 0, lambda position: (
        order.eval_pieces(hi - lo, window, position)))
    self._example_fn = _example_fn(settings, self.source.kind, dataset.num_classes,
                                   train=False)
    self._failures = _Failures(self._reader, self._example_fn,
                               settings.skip_corrupt_images)
    # Built once: each iteration re-runs the reader from position 0 (a fresh pass).
    self._ds = _dataset(self._reader, self._example_fn, local_batch)
    self._shape = (settings.crop, settings.crop, 3)
    self._num_classes = dataset.num_classes

  def __len__(self) -> int:
    return self.num_batches

  def __iter__(self) -> Iterator[Batch]:
    self._reader.error = None
    stop = self.num_batches * self._local_batch
    for q, images, labels, present in _realign(
        self._ds.as_numpy_iterator(), 0, self._local_batch, self._shape, self._num_classes,
        stop=stop):
      if self._reader.error is not None:
        raise self._reader.error
      real = q + np.arange(self._local_batch) < self._size
      for row in np.flatnonzero(real & ~present):
        self._failures.report(q + int(row))
      yield {'image': images, 'label': labels,
             'mask': (real & present).astype(np.float32)}
    if self._reader.error is not None:
      raise self._reader.error


def train_iterator(config: Any, mesh: jax.sharding.Mesh, *,
                   start_step: int = 0) -> Iterator[dict[str, jax.Array]]:
  """Endless global train batches, sharded over the 'data' mesh axis.

  Yields {'image': f32[B, crop, crop, 3] in [-1, 1], 'label': f32[B, K] one-hot}
  with B = config.batch. The stream from `start_step` equals the stream from 0 after
  `start_step` batches, without replaying it; neither depends on the process count.
  """
  settings = Settings.from_config(config)
  if start_step < 0:
    raise ValueError(f'start_step={start_step} must be >= 0 (the step to resume at).')
  local_batch = batching.local_batch_size(settings.batch, mesh, 'batch')
  block, blocks = batching.process_row_block(settings.batch, mesh)
  batches = local_train_batches(Dataset(settings), local_batch, start_step, block, blocks)
  return batching.prefetch_to_device(batches, mesh, settings.prefetch)


class EvalIterator:
  """One pass of global eval batches per iteration; len() is the number of batches."""

  def __init__(self, batches: EvalBatches, mesh: jax.sharding.Mesh, prefetch: int):
    self._batches, self._mesh, self._prefetch = batches, mesh, prefetch

  def __len__(self) -> int:
    return len(self._batches)

  def __iter__(self) -> Iterator[dict[str, jax.Array]]:
    return batching.prefetch_to_device(iter(self._batches), self._mesh, self._prefetch)


def eval_iterator(config: Any, mesh: jax.sharding.Mesh, *,
                  split: str | None = None) -> EvalIterator:
  """Global eval batches over `split or config.test_split`, every example once.

  Yields {'image': f32[B, crop, crop, 3], 'label': f32[B, K], 'mask': f32[B]} with
  B = config.batch_eval; the last batch is padded (mask 0). Iterate again for
  another pass.
  """
  settings = Settings.from_config(config)
  local_batch = batching.local_batch_size(settings.batch_eval, mesh, 'batch_eval')
  block, blocks = batching.process_row_block(settings.batch_eval, mesh)
  batches = EvalBatches(Dataset(settings), split or settings.test_split, local_batch,
                        block, blocks)
  return EvalIterator(batches, mesh, settings.prefetch)
