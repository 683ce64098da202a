"""Batching, readers and the train stream: exact resume, batch-size errors, prefetch."""

import itertools
import os
import threading
import time

import jax
import ml_collections
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from PIL import Image

from tests import train_fixtures
from vit_jax import data
from vit_jax.data import batching, folder, pipeline, tfds_source
from vit_jax.data.dataset import Dataset
from vit_jax.infra import errors


def _mesh():
  return jax.sharding.Mesh(np.array(jax.devices()).reshape(-1, 1), ("data", "model"))


@pytest.fixture(scope="module")
def digits_config(tmp_path_factory):
  # shuffle_buffer < split size: the tfds path shuffles in 3 windows of <= 500.
  return train_fixtures.common_config(
    dataset="digits",
    data_dir=str(tmp_path_factory.mktemp("tfds")),
    train_split="train",
    test_split="test",
    pp=dict(crop=8, min_area=0.05, flip=True),
    batch=128,
    batch_eval=128,
    shuffle_buffer=500,
    seed=3,
  )


def _take(iterator, count):
  return [{k: np.asarray(v) for k, v in next(iterator).items()} for _ in range(count)]


def _with_randaug(config: ml_collections.ConfigDict, randaug) -> ml_collections.ConfigDict:
  config = config.copy_and_resolve_references()
  config.pp.randaug = randaug
  return config


# RandAugment on: the pipeline hands the crops' uint8 values (the step augments them).
@pytest.mark.parametrize("randaug", [None, (2, 3)])
def test_start_step_equals_running_that_many_steps(digits_config, randaug):
  digits_config = _with_randaug(digits_config, randaug)
  # 1437 examples / 128 = 11.2 steps per epoch: step 10..13 crosses into epoch 1.
  settings = data.Settings.from_config(digits_config)
  from_zero = _take(data.train_iterator(settings, _mesh()), 14)
  for k in (1, 10, 12):
    resumed = _take(data.train_iterator(settings, _mesh(), start_step=k), 2)
    for a, b in zip(from_zero[k : k + 2], resumed):
      np.testing.assert_array_equal(a["image"], b["image"])
      np.testing.assert_array_equal(a["label"], b["label"])
  assert not np.array_equal(from_zero[0]["image"], from_zero[1]["image"])
  other = digits_config.copy_and_resolve_references()
  other.seed = 4
  assert not np.array_equal(
    _take(data.train_iterator(data.Settings.from_config(other), _mesh()), 1)[0]["image"],
    from_zero[0]["image"],
  )


def test_the_train_iterator_takes_settings_not_a_config(digits_config):
  with pytest.raises(TypeError, match="data.Settings.from_config"):
    data.train_iterator(digits_config, _mesh())


def test_a_config_asking_for_the_removed_tf_data_stage_is_one_error(digits_config):
  config = digits_config.copy_and_resolve_references()
  for recorded in ("auto", "grain"):  # what the config.json of older runs holds: read as is
    config.input_pipeline = recorded
    assert data.Settings.from_config(config).dataset == "digits"
  config.input_pipeline = "tf"
  with pytest.raises(errors.ConfigError, match=r"input_pipeline='tf'.*Remove the setting"):
    data.Settings.from_config(config)


def test_randaug_hands_the_crops_uint8_values_in_the_same_order_and_split(digits_config):
  # With RandAugment on, the train step augments and normalises (data/randaug.py): the
  # pipeline hands the same crops rounded to their uint8 values.
  digits_config = _with_randaug(digits_config, None)
  augmented_config = _with_randaug(digits_config, (2, 3))
  plain = _take(data.train_iterator(data.Settings.from_config(digits_config), _mesh()), 1)[0]
  pixels = _take(data.train_iterator(data.Settings.from_config(augmented_config), _mesh()), 1)[0]
  np.testing.assert_array_equal(plain["label"], pixels["label"])
  assert (pixels["image"] == np.round(pixels["image"])).all() and pixels["image"].max() > 1
  np.testing.assert_allclose(pixels["image"] / 127.5 - 1, plain["image"], atol=0.5 / 127.5 + 1e-6)
  # Two processes' rows together are the one process's batch.
  dataset = Dataset(data.Settings.from_config(augmented_config))
  halves = [pipeline.local_train_batches(dataset, 64, 0, p, 2) for p in range(2)]
  rows = np.concatenate([next(half)["image"] for half in halves])
  np.testing.assert_array_equal(rows, pixels["image"])


def test_train_batches_are_global_arrays_without_mask(digits_config):
  batch = next(data.train_iterator(data.Settings.from_config(digits_config), _mesh()))
  assert set(batch) == {"image", "label"}
  assert isinstance(batch["image"], jax.Array)
  assert batch["image"].sharding == NamedSharding(_mesh(), PartitionSpec("data"))
  assert batch["image"].shape == (128, 8, 8, 3) and batch["label"].shape == (128, 10)


def test_eval_on_digits_counts_each_example_once(digits_config):
  evaluation = data.eval_iterator(digits_config, _mesh())
  masks = [np.asarray(b["mask"]) for b in evaluation]
  assert len(masks) == len(evaluation) == 3  # 360 = 2 * 128 + 104.
  assert sum(m.sum() for m in masks) == 360 and masks[-1].sum() == 104
  train_masks = [
    np.asarray(b["mask"]) for b in data.eval_iterator(digits_config, _mesh(), split="train[:300]")
  ]
  assert sum(m.sum() for m in train_masks) == 300


def test_batch_not_divisible_is_a_clear_error(digits_config, monkeypatch):
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  with pytest.raises(
    ValueError,
    match=r"config.batch=5 .*2 process.*multiple of 2.*"
    r"batch=6 or 4",
  ):
    batching.local_batch_size(5, _mesh())
  assert batching.local_batch_size(6, _mesh()) == 3
  with pytest.raises(ValueError, match="axis named 'data'"):
    batching.local_batch_size(4, jax.sharding.Mesh(np.array(jax.devices()), ("batch",)))


def test_make_global_batch_and_prefetch():
  local = {"x": np.arange(6, dtype=np.float32).reshape(3, 2)}
  out = batching.make_global_batch(local, _mesh())
  np.testing.assert_array_equal(np.asarray(out["x"]), local["x"])

  def failing():
    yield local
    raise OSError("disk gone")

  stream = batching.prefetch_to_device(failing(), _mesh(), size=2)
  np.testing.assert_array_equal(np.asarray(next(stream)["x"]), local["x"])
  with pytest.raises(OSError, match="disk gone"):
    next(stream)
  assert len(list(batching.prefetch_to_device(iter([local] * 5), _mesh(), 2))) == 5
  assert len(list(batching.prefetch_to_device(iter([local] * 5), _mesh(), 0))) == 5


def test_missing_config_key_is_named():
  config = ml_collections.ConfigDict(
    dict(dataset="digits", train_split="train", test_split="test", batch=8)
  )
  with pytest.raises(ValueError, match="config.pp is required"):
    data.dataset_info(config)


def test_realign_restores_positions_after_dropped_examples():
  """The stage drops failed images; batches are cut back on positions, holes marked."""
  from vit_jax.data.pipeline import _realign

  rng = np.random.default_rng(0)
  for _ in range(100):
    n, size, first = int(rng.integers(1, 40)), int(rng.integers(1, 9)), int(rng.integers(5))
    kept = np.sort(rng.choice(np.arange(first, first + n), int(rng.integers(n + 1)), replace=False))
    stop = first + -(-n // size) * size
    incoming = [kept[i : i + size] for i in range(0, len(kept), size)]
    batches = [
      (
        p,
        np.ones((len(p), 2, 3), np.float32) * p[:, None, None],
        np.ones((len(p), 4), np.float32) * p[:, None],
      )
      for p in incoming
    ]
    blanks = (((2, 3), np.float32), ((4,), np.float32))
    out = list(_realign(iter(batches), first, size, blanks, stop=stop))
    assert [q for q, *_ in out] == list(range(first, stop, size))
    seen = []
    for q, images, labels, present in out:
      assert images.shape == (size, 2, 3) and labels.shape == (size, 4)
      rows = np.flatnonzero(present)
      np.testing.assert_array_equal(images[rows, 0, 0], q + rows)
      np.testing.assert_array_equal(labels[rows, 0], q + rows)
      assert not images[~present].any()
      seen += list(q + rows)
    assert seen == list(kept)


def test_windowed_tfds_eval_equals_one_window(digits_config, monkeypatch):
  from vit_jax.data import pipeline

  whole = [np.asarray(b["image"]) for b in data.eval_iterator(digits_config, _mesh())]
  monkeypatch.setattr(pipeline, "_EVAL_WINDOW", 100)  # 360 examples in 4 reads.
  windowed = [np.asarray(b["image"]) for b in data.eval_iterator(digits_config, _mesh())]
  np.testing.assert_array_equal(np.concatenate(whole), np.concatenate(windowed))


class _ArraySource:
  """An in-memory SplitSource that records its reads and fails on demand."""

  name, kind, random_access = "arrays", "bytes", False

  def __init__(self, n, fail_after=None):
    self.num_examples = n
    self.values = np.array([b"v%d" % i for i in range(n)], object)
    self.calls = []  # ('read', lo, hi) or ('read_many', ranges).
    self.fail_after = fail_after  # Raise on the call after this many.

  def _record(self, call):
    if self.fail_after is not None and len(self.calls) >= self.fail_after:
      raise OSError("disk gone")
    self.calls.append(call)

  def read(self, start, stop):
    self._record(("read", start, stop))
    return self.values[start:stop], np.arange(start, stop, dtype=np.int64)

  def read_many(self, ranges):
    self._record(("read_many", ranges))
    return [(self.values[lo:hi], np.arange(lo, hi, dtype=np.int64)) for lo, hi in ranges]


def test_lane_reader_serves_each_lane_in_its_order_through_read_many():
  from vit_jax.data import order, readers

  n, lanes, first, local, window, seed = 40, 4, 1, 2, 3, 7
  source = _ArraySource(n)
  reader = readers.LaneReader(source, first, local, lanes, window, seed, start_step=5)
  stream = reader()
  chunks = [next(stream) for _ in range(3)]  # 3 blocks of 512 steps: many epochs.
  positions, uids, values, labels, texts = (np.concatenate(c) for c in zip(*chunks))
  assert set(texts) == {b""}  # a source without captions
  steps = len(positions) // local
  np.testing.assert_array_equal(positions, 5 * local + np.arange(steps * local))
  for j in range(local):
    lo, hi = order.process_shard(n, first + j, lanes)
    pieces = order.train_pieces(hi - lo, window, seed, first + j, 5)
    expected = np.concatenate(
      [lo + p.window[0] + p.offsets for p in itertools.islice(pieces, steps)]
    )[:steps]
    np.testing.assert_array_equal(labels[j::local], expected)
    np.testing.assert_array_equal(values[j::local], source.values[expected])
    epochs = (5 + np.arange(steps)) // (hi - lo)
    np.testing.assert_array_equal(uids[j::local], epochs * n + expected)
  assert {call[0] for call in source.calls} == {"read_many"}
  value, label, index, uid = reader.locate(int(positions[777]))
  assert (value, label, index, uid) == (values[777], labels[777], labels[777], uids[777])


@pytest.mark.parametrize("kind", ["shard", "lane"])
def test_a_read_failure_raises_from_the_stream_after_the_chunks_before_it(kind):
  from vit_jax.data import order, readers

  source = _ArraySource(3000, fail_after=1)  # Lane blocks of 1024 need new windows.
  if kind == "shard":
    reader = readers.ShardReader(source, 10, lambda p: order.eval_pieces(20, 4, p))
  else:
    reader = readers.LaneReader(source, 0, 1, 1, 3, 0, start_step=0)
  chunks = []
  with pytest.raises(OSError):
    for chunk in reader():
      chunks.append(chunk)
  assert len(chunks) == 1
  if kind == "shard":
    np.testing.assert_array_equal(chunks[0][3], np.arange(10, 14))


@pytest.mark.parametrize("kind", ["tfds", "folder"])
def test_closing_the_train_iterator_does_not_wait_for_a_read(
  kind, digits_config, tmp_path, monkeypatch
):
  config = digits_config.copy_and_resolve_references()
  source_class = tfds_source.TfdsSplit
  if kind == "folder":
    for k in range(16):
      os.makedirs(tmp_path / "train" / f"class_{k % 2}", exist_ok=True)
      Image.new("RGB", (8, 8), (k,) * 3).save(tmp_path / "train" / f"class_{k % 2}" / f"{k}.png")
    config.dataset, config.batch = f"folder:{tmp_path}", 8
    source_class = folder.FolderSplit
  # Every read after the first block's hangs until released, as a slow read would.
  release, calls = threading.Event(), []
  read_many = source_class.read_many

  def slow_read_many(self, ranges):
    calls.append(ranges)
    if len(calls) > 1:
      release.wait(60)
    return read_many(self, ranges)

  monkeypatch.setattr(source_class, "read_many", slow_read_many)
  steps_per_block = 1024 // config.batch
  iterator = data.train_iterator(data.Settings.from_config(config), _mesh())
  try:
    _take(iterator, steps_per_block)  # All the first block has: the thread now waits.
    time.sleep(0.5)
    start = time.monotonic()
    iterator.close()
    assert time.monotonic() - start < 2.0
    assert len(calls) == 2  # The second read was under way when it closed.
  finally:
    release.set()
