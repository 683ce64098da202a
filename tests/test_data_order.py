"""The visiting order: per-process shards, seeded epochs, starting anywhere."""

import itertools

import numpy as np
import pytest

from vit_jax.data import order


def _stream(n, window, seed, process=0, start=0, count=50):
  """Shard-local example indices of the first `count` positions from `start`."""
  out = []
  for piece in order.train_pieces(n, window, seed, process, start):
    assert piece.position == start + len(out)
    out += list(piece.window[0] + piece.offsets)
    if len(out) >= count:
      return out[:count]


@pytest.mark.parametrize("n,window", [(10, 3), (10, 10), (7, 100), (1, 4)])
def test_each_epoch_is_a_permutation_and_epochs_differ(n, window):
  stream = _stream(n, window, seed=1, count=4 * n)
  epochs = [stream[e * n : (e + 1) * n] for e in range(4)]
  for epoch in epochs:
    assert sorted(epoch) == list(range(n))
  if n > 3:
    assert len({tuple(e) for e in epochs}) > 1


@pytest.mark.parametrize("start", [0, 1, 2, 3, 5, 9, 10, 11, 23, 31])
def test_starting_at_a_position_equals_skipping_to_it(start):
  full = _stream(10, 3, seed=4, count=60)
  assert _stream(10, 3, seed=4, start=start, count=60 - start) == full[start:]


def test_seed_and_process_change_the_order():
  base = _stream(50, 10, seed=0)
  assert _stream(50, 10, seed=0) == base
  assert _stream(50, 10, seed=1) != base
  assert _stream(50, 10, seed=0, process=1) != base
  assert _stream(50, 10, seed=-3) == _stream(50, 10, seed=-3)


def test_windowed_shuffle_keeps_windows_together():
  stream = _stream(12, 4, seed=2, count=12)
  chunks = [stream[i : i + 4] for i in range(0, 12, 4)]
  assert sorted(min(c) // 4 for c in chunks) == [0, 1, 2]
  assert all(max(c) // 4 == min(c) // 4 for c in chunks)


@pytest.mark.parametrize("n,count", [(10, 3), (2, 4), (1000, 7)])
def test_process_shards_cover_the_split_once(n, count):
  shards = [order.process_shard(n, p, count) for p in range(count)]
  covered = list(itertools.chain.from_iterable(range(lo, hi) for lo, hi in shards))
  assert covered == list(range(n))
  sizes = [hi - lo for lo, hi in shards]
  assert max(sizes) - min(sizes) <= 1


def test_eval_pieces_visit_in_order_from_start():
  pieces = list(order.eval_pieces(10, 4, start=2))
  assert [p.window for p in pieces] == [(2, 6), (6, 10)]
  assert [p.position for p in pieces] == [2, 6]
  assert list(np.concatenate([p.window[0] + p.offsets for p in pieces])) == list(range(2, 10))


def test_empty_shard_is_an_error():
  with pytest.raises(ValueError, match="0 examples"):
    next(order.train_pieces(0, 4, 0, 0))
