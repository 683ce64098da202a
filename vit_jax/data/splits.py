"""Split strings and the interface every split source offers to the pipeline.

A split string uses tfds syntax for every kind of dataset, folders included:
`train`, `train[:98%]`, `train[1000:]`, `train[:90%]+validation`. It resolves to
absolute ranges of the named splits; the configured split is their concatenation,
and its examples are numbered 0..num_examples-1 in that order.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Protocol

import numpy as np
import tensorflow_datasets as tfds

from vit_jax.infra import errors


@dataclasses.dataclass(frozen=True)
class Range:
  """Examples [start, stop) of the named split."""

  split: str
  start: int
  stop: int

  def __len__(self) -> int:
    return self.stop - self.start


@dataclasses.dataclass(frozen=True)
class _SplitSize:
  """The two fields tfds reads when it resolves a split string."""

  num_examples: int
  shard_lengths: tuple[int, ...]


def resolve(spec: str, sizes: Mapping[str, int]) -> list[Range]:
  """Resolves a split string against the sizes of the available splits.

  Raises ValueError naming the string and the available splits when it does not fit.
  """
  infos = {name: _SplitSize(n, (n,)) for name, n in sizes.items()}
  try:
    instructions = tfds.core.ReadInstruction.from_spec(spec).to_absolute(infos)
  except (ValueError, AssertionError) as e:
    raise errors.ConfigError(
      f"Split {spec!r} does not match the available splits "
      f"{dict(sizes)} ({e}). Use a name from that list, optionally sliced as in "
      f'"train[:98%]" or "train[1000:]".'
    ) from None
  ranges = []
  for ins in instructions:
    start = 0 if ins.from_ is None else ins.from_
    stop = sizes[ins.splitname] if ins.to is None else ins.to
    ranges.append(Range(ins.splitname, start, stop))
  if sum(len(r) for r in ranges) == 0:
    raise errors.ConfigError(
      f"Split {spec!r} selects no examples (split sizes: {dict(sizes)}). Widen the slice."
    )
  return ranges


def names(spec: str) -> list[str]:
  """The split names a split string reads: 'train[:90%]+validation' -> [train, validation]."""
  return [part.split("[")[0].strip() for part in spec.split("+")]


def select(ranges: list[Range], start: int, stop: int) -> list[Range]:
  """Sub-ranges holding examples [start, stop) of the concatenation of `ranges`."""
  out, offset = [], 0
  for r in ranges:
    lo, hi = max(start - offset, 0), min(stop - offset, len(r))
    if lo < hi:
      out.append(Range(r.split, r.start + lo, r.start + hi))
    offset += len(r)
  return out


class SplitSource(Protocol):
  """One configured split, as the pipeline reads it.

  kind: 'path' (values are file paths, read by the pipeline) or 'bytes' (values are
    encoded images).
  random_access: True when one example costs the same to read wherever it is (files
    on disk, ArrayRecord), so the whole split is shuffled at once and training reads
    single examples; False for sequential storage (TFRecord), which is shuffled in
    windows of consecutive examples, each read as one range.
  """

  name: str
  kind: str
  random_access: bool
  num_examples: int

  def read(self, start: int, stop: int) -> tuple[np.ndarray, ...]:
    """Examples [start, stop) as (values object [n], labels int64 [n]), and for a source
    of free text their captions (object [n] of tuples of str, `free_text`)."""
    ...

  def read_many(self, ranges: list[tuple[int, int]]) -> list[tuple[np.ndarray, ...]]:
    """read(start, stop) of each [start, stop) range, in order. Training reads the
    windows a block of steps needs with one call: a source whose reads carry a setup
    cost (tfds) reads them together; one that reads files by path can loop over read."""
    ...


class RangedSplit:
  """A split of random-access storage (files listed, arrays in memory): its split string
  resolved to ranges (`resolve`), read range by range through `_rows`."""

  kind = "path"  # or 'bytes'
  random_access = True

  def __init__(self, name: str, ranges: list[Range]):
    self.name = name
    self._ranges = ranges
    self.num_examples = sum(len(r) for r in ranges)

  def _rows(self, split: str, start: int, stop: int) -> tuple[np.ndarray, ...]:
    """(values object [n], labels int64 [n]) of examples [start, stop) of ``split``; a
    source of free text adds their captions (`free_text`)."""
    raise NotImplementedError

  def read(self, start: int, stop: int) -> tuple[np.ndarray, ...]:
    """Values and labels (and captions) of examples [start, stop) of the configured split."""
    parts = [self._rows(r.split, r.start, r.stop) for r in select(self._ranges, start, stop)]
    if not parts:  # empty arrays of the right kinds
      return self._rows(self._ranges[0].split, 0, 0)
    return tuple(np.concatenate(arrays) for arrays in zip(*parts))

  def read_many(self, ranges: list[tuple[int, int]]) -> list[tuple[np.ndarray, ...]]:
    """read(start, stop) of each range: cheap one by one."""
    return [self.read(lo, hi) for lo, hi in ranges]
