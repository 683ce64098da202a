"""The train and eval input pipelines: ordered example indices -> global batches.

Per process:
  order.py positions -> readers.py: (position, uid, encoded image or path, label, caption)
  chunks, read ahead in a thread -> the decoding stage (`decode_stage`: worker processes, or
  Grain's threads): read file, decode + preprocess in parallel (deterministic order), drop
  examples whose image fails -> numpy batches realigned on positions, so a failed image is
  found by position and reported by name (or, with config.skip_corrupt_images, replaced)
  -> batching.prefetch_to_device.

Train batches do not depend on the process count: row r of every global batch of B rows
comes from "lane" r, the r-th of B contiguous blocks of the split, which visits its
examples in its own seeded order (order.train_pieces keyed by r). A process supplies a
contiguous block of rows, so it reads only the lanes of those rows: its own contiguous
1/process_count of the split. Evaluation shards the split contiguously per process.

Train batches: {'image': f32[B, crop, crop, 3], 'label': f32[B, K]}, no mask (every
row is a real example); with config.pp.randaug the images are the crops' uint8 values
(0..255), which the train step augments and normalises (data/randaug.py); with
config.pp.seq_len each 'image' is NaFlex's packed patches, f32 [B, seq_len, P * P * 3 + 3]
(`naflex_images.pack`: pixels, row, column, mask), which the ViT unpacks; a contrastive
run's add 'text': int32 [B, L]: captions made from the labels (`captions`), or the data's
own captions (`free_text`: one per example and epoch), tokenized here.
Eval batches add 'mask': f32[B], 1 for real examples and 0 for
padding, so a pass visits every example exactly once whatever the batch size.

A failed image is an error naming the file (or tfds example) with the decoder's
message. With config.skip_corrupt_images=True it is logged and counted instead: in
training the row is filled with another example of the same batch, which keeps every
later batch, and exact resume, unchanged; in evaluation the row gets mask 0.
"""

from __future__ import annotations

import collections
import itertools
import threading
from typing import Any, Callable, Iterator

import jax
import numpy as np
from absl import logging

from vit_jax.data import batching, decode_stage, order, readers
from vit_jax.data.budget_mix import SCHEDULE_BLOCK, BudgetMix
from vit_jax.data.dataset import Dataset
from vit_jax.data.settings import Settings, as_settings
from vit_jax.infra import errors
from vit_jax.infra.aliases import HostBatch

_EVAL_WINDOW = 10_000  # Examples an eval pass reads at a time.


def _realign(
  batches: Iterator[tuple[np.ndarray, ...]],
  first: int,
  size: int,
  blanks: tuple[tuple[tuple[int, ...], Any], ...],
  stop: int | None = None,
) -> Iterator[tuple[Any, ...]]:
  """Batches with possibly missing positions -> batches of positions [q, q + size).

  Incoming batches are (positions, *rows); ``blanks`` gives each row array's (shape of
  one row, dtype). Yields (q, *rows [size, ...], present bool [size]); absent rows are
  zeros. An incoming batch that is exactly the next expected one passes through
  uncopied; otherwise each row is copied once into its place. After the input ends,
  batches continue (all absent) until position `stop`.
  """
  pending: collections.deque = collections.deque()  # (positions, *rows)
  last = first - 1  # Highest position received so far.
  q = first

  def cut() -> tuple[np.ndarray, ...]:
    out = tuple(np.zeros([size, *shape], dtype) for shape, dtype in blanks)
    present = np.zeros([size], bool)
    while pending and pending[0][0][0] < q + size:
      pos, *rows = pending.popleft()
      k = int(np.searchsorted(pos, q + size))  # Rows of this batch: pos[:k].
      where = pos[:k] - q
      for target, row in zip(out, rows):
        target[where] = row[:k]
      present[where] = True
      if k < len(pos):
        pending.appendleft((pos[k:], *(row[k:] for row in rows)))
    return (*out, present)

  for pos, *rows in batches:
    if not pending and len(pos) == size and pos[0] == q and pos[-1] == q + size - 1:
      yield (q, *rows, np.ones([size], bool))
      q, last = q + size, pos[-1]
      continue
    if len(pos):
      pending.append((pos, *rows))
      last = pos[-1]
    while last >= q + size:  # Everything before q + size has arrived.
      yield (q, *cut())
      q += size
  while pending or (stop is not None and q < stop):
    yield (q, *cut())
    q += size


def _blanks(settings: Settings, num_classes: int) -> tuple[tuple[tuple[int, ...], Any], ...]:
  """The (row shape, dtype) of the images, labels, texts and uids `_realign` cuts."""
  image = (settings.image_shape, np.float32)
  return image, ((num_classes,), np.float32), ((), object), ((), np.int64)


class _Failures:
  """Reports images that could not be read or decoded: raise, or log and count."""

  def __init__(self, reader: readers.Reader, stage: decode_stage.Stage, skip: bool):
    self.reader, self.stage, self.skip = reader, stage, skip
    self.count = 0

  def report(self, position: int) -> None:
    value, _, index, uid = self.reader.locate(position)
    source = self.reader.source
    if source.kind == "path":
      name = value.decode() if isinstance(value, bytes) else str(value)
      fix = "Remove or replace the file"
    else:  # stored in the data (tfds records, tar shards, arrays)
      name = f"example {index} of {source.name}"
      fix = "Replace it where the data is stored (a tfds dataset: prepare it again)"
    reason = self.stage.reason(value, uid)
    if not self.skip:
      raise errors.ConfigError(
        f"Cannot read image {name!r}: {reason}. {fix}, or set "
        f"config.skip_corrupt_images=True to skip such images (logged and counted)."
      )
    self.count += 1
    logging.warning(
      "Skipped unreadable image %r (%s); %d skipped so far.", name, reason, self.count
    )


def local_train_batches(
  dataset: Dataset,
  local_batch: int,
  start_step: int,
  process: int,
  process_count: int,
  stop: threading.Event | None = None,
  with_index: bool = False,
) -> Iterator[HostBatch]:
  """Endless host-local train batches of one process, from `start_step` on.

  They are rows [process * local_batch, (process + 1) * local_batch) of the global
  batches of local_batch * process_count rows, which do not depend on process_count
  (see the module docstring). Random-access sources shuffle each lane whole; others in
  windows of shuffle_buffer // global batch (at least 1) examples per lane. Setting
  `stop` ends the batches promptly, even while a read is in progress. ``with_index``
  adds 'index': int64 [b], each row's example index in the split (a cache's key).
  """
  settings = dataset.settings
  source = dataset.split(settings.train_split)
  num_lanes = local_batch * process_count
  if source.num_examples < num_lanes:
    raise errors.ConfigError(
      f"Split {source.name} has {source.num_examples} examples, fewer than the global "
      f"batch of {num_lanes}; use a larger split or a smaller config.batch."
    )
  window = (
    source.num_examples if source.random_access else max(1, settings.shuffle_buffer // num_lanes)
  )
  reader = readers.LaneReader(
    source, process * local_batch, local_batch, num_lanes, window, settings.seed, start_step, stop
  )
  preprocessing = decode_stage.Stage(settings, source.kind, dataset.num_classes, train=True)
  failures = _Failures(reader, preprocessing, settings.skip_corrupt_images)
  blanks = _blanks(settings, dataset.num_classes)

  def batches() -> Iterator[HostBatch]:
    stream = preprocessing.batches(reader, local_batch)
    for q, images, labels, texts, uids, present in _realign(
      stream(), start_step * local_batch, local_batch, blanks
    ):
      if stop is not None and stop.is_set():
        return  # The stream was cut short: its last rows are missing, not failed.
      if not present.all():
        for row in np.flatnonzero(~present):
          failures.report(q + int(row))
        if not present.any():
          raise errors.ConfigError(
            f"No image of a whole batch of {source.name} could be read "
            f"(positions {q}..{q + local_batch - 1}); check the data."
          )
        # Fill each failed row with the nearest readable row of the same batch.
        ok = np.flatnonzero(present)
        for row in np.flatnonzero(~present):
          src = ok[np.argmin(np.abs(ok - row))]
          images[row], labels[row], texts[row] = images[src], labels[src], texts[src]
          uids[row] = uids[src]
      batch = {"image": images, "label": labels}
      if with_index:
        batch["index"] = uids % source.num_examples
      if dataset.tokenizer is not None:
        batch["text"] = dataset.tokenize(texts)
      elif dataset.captions is not None:
        batch["text"] = dataset.captions.train_ids(
          labels, step=q // local_batch, first_row=process * local_batch, seed=settings.seed
        )
      yield batch
    if stop is None or not stop.is_set():  # an endless stream ended: a bug, not the data
      raise RuntimeError(f"The input stream of {source.name} ended.")

  return batches()


class EvalBatches:
  """One pass over a split in host-local batches with 'mask'; iterable many times."""

  def __init__(
    self, dataset: Dataset, split: str, local_batch: int, process: int, process_count: int
  ):
    settings = dataset.settings
    self.source = dataset.split(split)
    n = self.source.num_examples
    lo, hi = order.process_shard(n, process, process_count)
    largest = -(-n // process_count)  # Every process yields the same number of batches.
    self.num_batches = -(-largest // local_batch)
    self._local_batch, self._size = local_batch, hi - lo
    self._reader = readers.ShardReader(
      self.source, lo, lambda position: order.eval_pieces(hi - lo, _EVAL_WINDOW, position)
    )
    preprocessing = decode_stage.Stage(settings, self.source.kind, dataset.num_classes, train=False)
    self._failures = _Failures(self._reader, preprocessing, settings.skip_corrupt_images)
    # Built once: each call re-runs the reader from position 0 (a fresh pass).
    self._stream = preprocessing.batches(self._reader, local_batch)
    self._blanks = _blanks(settings, dataset.num_classes)
    self._dataset, self._first = dataset, lo

  def __len__(self) -> int:
    return self.num_batches

  def __iter__(self) -> Iterator[HostBatch]:
    stop = self.num_batches * self._local_batch
    for q, images, labels, texts, _, present in _realign(
      self._stream(), 0, self._local_batch, self._blanks, stop=stop
    ):
      real = q + np.arange(self._local_batch) < self._size
      for row in np.flatnonzero(real & ~present):
        self._failures.report(q + int(row))
      batch = {"image": images, "label": labels, "mask": (real & present).astype(np.float32)}
      if self._dataset.tokenizer is not None:
        batch["text"] = self._dataset.tokenize(np.where(present, texts, b""))
      elif self._dataset.captions is not None:
        indices = self._first + q + np.arange(len(labels))
        batch["text"] = self._dataset.captions.eval_ids(labels, indices)
      yield batch


def train_iterator(
  settings: Settings,
  mesh: jax.sharding.Mesh,
  *,
  start_step: int = 0,
  transform: Callable[[HostBatch], HostBatch] | None = None,
) -> Iterator[dict[str, jax.Array]]:
  """Endless global train batches, sharded over the 'data' mesh axis.

  ``settings``: `Settings` (a run's ``spec.data``, or `Settings.from_config(config)`).
  Yields {'image': f32[B, crop, crop, 3] in [-1, 1], 'label': f32[B, K] one-hot}
  with B = settings.batch; with ``settings.randaug`` the images are the crops' uint8
  values (0..255) for the train step's RandAugment (``settings.train_images``).
  The stream from `start_step` equals the stream from 0 after
  `start_step` batches, without replaying it; neither depends on the process count.
  ``transform``: applied to each host-local batch, which then holds 'index' (int64 [b],
  each row's example index in the split), before it goes to the devices (e.g. a LiT run's
  cache of image features, `run.feature_cache`).
  """
  if not isinstance(settings, Settings):
    raise TypeError(
      f"train_iterator takes data.Settings, not {type(settings).__name__}: pass a run's "
      "spec.data, or data.Settings.from_config(config)."
    )
  if start_step < 0:
    raise ValueError(f"start_step={start_step} must be >= 0 (the step to resume at).")
  stop = threading.Event()  # Set by closing the iterator; ends the reads at once.
  mix = settings.budget_mix()
  if mix is None:
    local_batch = batching.local_batch_size(settings.batch, mesh, "batch")
    block, blocks = batching.process_row_block(settings.batch, mesh)
    batches = local_train_batches(
      Dataset(settings), local_batch, start_step, block, blocks, stop, with_index=bool(transform)
    )
  else:
    batches = _mixed_budget_batches(settings, mix, mesh, start_step, stop, bool(transform))
  if transform is not None:
    batches = _transformed(batches, transform)
  return batching.prefetch_to_device(batches, mesh, settings.prefetch, stop)


def _mixed_budget_batches(
  settings: Settings,
  mix: BudgetMix,
  mesh: jax.sharding.Mesh,
  start_step: int,
  stop: threading.Event,
  with_index: bool,
) -> Iterator[HostBatch]:
  """Host-local train batches of several NaFlex budgets (`budget_mix`): each budget's own
  lanes (`Settings.at_budget`), resumed at its count of the batches before ``start_step``,
  taken in the schedule's order."""
  resume = mix.batches_before(settings.seed, start_step)
  streams = {}
  for budget in mix.budgets:
    at = settings.at_budget(budget)
    local_batch = batching.local_batch_size(at.batch, mesh, f"batch (at {budget} patches)")
    block, blocks = batching.process_row_block(at.batch, mesh)
    streams[budget] = local_train_batches(
      Dataset(at), local_batch, resume[budget], block, blocks, stop, with_index
    )
  try:
    for first in itertools.count(start_step, SCHEDULE_BLOCK):
      for index in mix.budget_indices(settings.seed, first, SCHEDULE_BLOCK):
        yield next(streams[mix.budgets[index]])
  finally:
    for stream in streams.values():
      stream.close()


def _transformed(batches: Iterator[HostBatch], transform) -> Iterator[HostBatch]:
  """``transform`` of each batch; closing it closes ``batches`` (the stage's pipeline)."""
  try:
    for batch in batches:
      yield transform(batch)
  finally:
    batches.close()


class EvalIterator:
  """One pass of global eval batches per iteration; len() is the number of batches."""

  def __init__(self, batches: EvalBatches, mesh: jax.sharding.Mesh, prefetch: int):
    self._batches, self._mesh, self._prefetch = batches, mesh, prefetch

  def __len__(self) -> int:
    return len(self._batches)

  def __iter__(self) -> Iterator[dict[str, jax.Array]]:
    return batching.prefetch_to_device(iter(self._batches), self._mesh, self._prefetch)


def eval_iterator(
  config: Any, mesh: jax.sharding.Mesh, *, split: str | None = None
) -> EvalIterator:
  """Global eval batches over `split or config.test_split`, every example once.

  Yields {'image': f32[B, crop, crop, 3], 'label': f32[B, K], 'mask': f32[B]} with
  B = config.batch_eval; the last batch is padded (mask 0). Iterate again for
  another pass.
  """
  settings = as_settings(config)
  local_batch = batching.local_batch_size(settings.batch_eval, mesh, "batch_eval")
  block, blocks = batching.process_row_block(settings.batch_eval, mesh)
  batches = EvalBatches(Dataset(settings), split or settings.test_split, local_batch, block, blocks)
  return EvalIterator(batches, mesh, settings.prefetch)
