"""Direct record reads of prepared tfds datasets: TFRecord by offset, ArrayRecord by index."""

import glob
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds

from tests import train_fixtures
from vit_jax import errors, platforms
from vit_jax.data import dataset, filesystems, order, pipeline, readers, records, tfds_source

_SHARDS = 3  # digits' 1,437 train examples in 3 files: ranges cross files.


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  """{file format: data_dir} of digits prepared in both formats, 3 shards per split."""
  dirs = {}
  for file_format in ("tfrecord", "array_record"):
    dirs[file_format] = str(tmp_path_factory.mktemp(file_format))
    tfds.builder("digits", data_dir=dirs[file_format]).download_and_prepare(
      file_format=file_format, download_config=tfds.download.DownloadConfig(num_shards=_SHARDS)
    )
  return dirs


def _dataset(data_dir, **overrides) -> dataset.Dataset:
  config = train_fixtures.common_config(
    dataset="digits",
    data_dir=data_dir,
    train_split="train[5:]+test",
    test_split="test",
    pp=dict(crop=8),
    batch=8,
    batch_eval=16,
    shuffle_buffer=96,  # Lane windows of 12, as the defaults give at batch 4096.
  )
  config.update(overrides)
  return dataset.Dataset(dataset.Settings.from_config(config))


@pytest.mark.parametrize("file_format", ["tfrecord", "array_record"])
def test_direct_reads_equal_tfds_reads(prepared, file_format):
  data = _dataset(prepared[file_format])
  source = data.split("train[5:]+test")
  assert source.random_access == (file_format == "array_record")
  reference = _dataset(prepared["tfrecord"])._source  # tfds' reader (not for ArrayRecord)
  stored_values, stored_labels = reference.load("train[5:]+test")
  ranges = [(0, 3), (470, 490), (1420, 1450), (7, 8), (1790, 1792), (3, 3)]
  for (lo, hi), (values, labels) in zip(ranges, source.read_many(ranges)):
    assert list(values) == list(stored_values[lo:hi])
    np.testing.assert_array_equal(labels, stored_labels[lo:hi])


def test_tfrecord_windows_are_single_reads_of_their_own_bytes(prepared, monkeypatch):
  """Every read is one whole window (no skip); an epoch reads each stored byte once,
  plus the 12-byte record headers read once to find the records."""
  calls = []  # (path, offset, size) of every read.

  class Recorded:
    def __init__(self, path, exact=False):
      assert exact  # unbuffered: the file reads what is asked, no read-ahead
      self.file, self.path, self.offset = open(path, "rb", buffering=0), path, 0

    def seek(self, offset):
      self.offset = offset
      self.file.seek(offset)

    def read(self, size):
      calls.append((self.path, self.offset, size))
      return self.file.read(size)

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      self.file.close()

  monkeypatch.setattr(filesystems, "open_binary", Recorded)
  monkeypatch.setattr(readers, "CHUNK", 16)  # Blocks of 2 steps: little read ahead.
  source = _dataset(prepared["tfrecord"], train_split="train").split("train")
  shards = [shard for split in source._records.values() for shard in split.shards]
  n, lanes, window, epochs = source.num_examples, 8, 12, 3
  reader = readers.LaneReader(source, 0, lanes, lanes, window, 0, 0)
  steps = epochs * -(-n // lanes)  # 3 epochs of every lane (lanes of 179 and 180).
  for positions, *_ in reader():
    if positions[-1] >= steps * lanes - 1:
      break
  headers = [c for c in calls if c[2] == records._HEADER]
  data_reads = [c for c in calls if c[2] != records._HEADER]
  assert len(headers) == n  # The offsets of each record, found once for all epochs.
  stored = sum(int(s.starts()[-1]) for s in shards)
  read = sum(size for *_, size in data_reads)
  assert epochs - 0.02 <= read / stored <= epochs + 0.1  # No byte read twice an epoch.
  for path, offset, size in data_reads:  # Each read is (part of) one window: records.
    starts = next(s for s in shards if s.path == path).starts()
    assert offset in starts and offset + size in starts
    assert np.searchsorted(starts, offset + size) - np.searchsorted(starts, offset) <= window
  assert len(data_reads) <= (epochs + 1) * (n // window + 2 * lanes + _SHARDS)


def test_truncated_tfrecord_is_a_clear_error(prepared, tmp_path):
  path = tmp_path / "short.tfrecord"
  shard = next(iter(_dataset(prepared["tfrecord"]).split("test")._records.values())).shards[0]
  with open(shard.path, "rb") as f:
    path.write_bytes(f.read(500))
  with pytest.raises(RuntimeError, match="short.tfrecord holds .* records where .* says"):
    records.TfrecordShard(str(path), shard.num_records).read(0, 1)


def _images(batches, steps):
  return np.concatenate([next(batches)["image"] for _ in range(steps)])


def test_array_record_lanes_shuffle_whole_and_keep_the_guarantees(prepared):
  data = _dataset(prepared["array_record"])
  n = data.split(data.settings.train_split).num_examples
  lanes = data.settings.batch
  # Exact resume.
  straight = _images(pipeline.local_train_batches(data, lanes, 0, 0, 1), 6)
  resumed = _images(pipeline.local_train_batches(data, lanes, 4, 0, 1), 2)
  np.testing.assert_array_equal(straight[4 * lanes :], resumed)
  # Batches independent of the process count: 2 processes give the same rows.
  halves = [_images(pipeline.local_train_batches(data, lanes // 2, 0, p, 2), 6) for p in (0, 1)]
  rows = np.concatenate([h.reshape(6, lanes // 2, -1) for h in halves], axis=1)
  np.testing.assert_array_equal(rows.reshape(straight.shape), straight)
  # Each lane is one window: a whole-lane permutation, read example by example.
  source = data.split(data.settings.train_split)
  reader = readers.LaneReader(source, 0, lanes, lanes, n, data.settings.seed, 0)
  stream = reader()
  uids = np.concatenate([next(stream)[1] for _ in range(2)])  # 2 x 128 steps > a lane
  for j in range(lanes):
    lo, hi = order.process_shard(n, j, lanes)
    lane = (uids[j::lanes] % n)[: hi - lo]
    assert sorted(lane) == list(range(lo, hi))
    assert not np.array_equal(lane, np.arange(lo, hi))  # Shuffled beyond windows.


def test_array_record_eval_equals_tfrecord_eval(prepared):
  passes = {}
  for file_format, data_dir in prepared.items():
    data = _dataset(data_dir)
    batches = [
      pipeline.EvalBatches(data, "test", 16, p, 2) for p in (0, 1)
    ]  # 2 processes, 180 examples each
    passes[file_format] = [(b["image"], b["mask"]) for evaluation in batches for b in evaluation]
  assert sum(m.sum() for _, m in passes["array_record"]) == 360
  for (a, mask_a), (b, mask_b) in zip(passes["tfrecord"], passes["array_record"]):
    np.testing.assert_array_equal(mask_a, mask_b)
    np.testing.assert_array_equal(a, b)


def test_other_file_formats_are_left_to_tfds(prepared, monkeypatch):
  data = _dataset(prepared["tfrecord"])
  direct = data.split("train[5:]+test")
  monkeypatch.setattr(records, "open_split", lambda builder, split, file_format: None)
  source = tfds_source.TfdsSplit(data._source, "train[5:]+test")
  assert source._records == {"train": None, "test": None}
  ranges = [(10, 30), (1430, 1440)]
  for (a, la), (b, lb) in zip(source.read_many(ranges), direct.read_many(ranges)):
    assert list(a) == list(b)
    np.testing.assert_array_equal(la, lb)


@pytest.mark.parametrize("file_format", ["tfrecord", "array_record"])
def test_corrupt_record_image_is_named_or_skipped(prepared, file_format, monkeypatch):
  """A prepared example whose image does not decode: an error naming the example, or,
  with skip_corrupt_images=True, a batch of readable examples."""
  reference = _dataset(prepared["tfrecord"])._source  # tfds' reader
  stored, _ = reference.load("test")
  broken = stored[3]
  parse = records.parse

  def corrupting(serialized):
    values, labels = parse(serialized)
    values = np.array([b"not an image" if v == broken else v for v in values], object)
    return values, labels

  data = _dataset(prepared[file_format], train_split="test", batch=360, shuffle_buffer=360)
  clean = next(pipeline.local_train_batches(data, 360, 0, 0, 1))["image"].reshape(360, -1)
  monkeypatch.setattr(records, "parse", corrupting)
  with pytest.raises(ValueError, match=r"image .example 3 of .*skip_corrupt_images"):
    next(pipeline.local_train_batches(data, 360, 0, 0, 1))
  data = _dataset(
    prepared[file_format],
    train_split="test",
    batch=360,
    shuffle_buffer=360,
    skip_corrupt_images=True,
  )
  images = next(pipeline.local_train_batches(data, 360, 0, 0, 1))["image"]
  # The broken row alone changed: it holds a copy of another row of the batch.
  changed = np.flatnonzero((images.reshape(360, -1) != clean).any(-1))
  assert len(changed) == 1 and any(
    (images[changed[0]] == images[r]).all() for r in range(360) if r != changed[0]
  )


def test_an_array_record_copy_beside_tfrecord_is_read_without_tensorflow(
  prepared, tmp_path, monkeypatch
):
  """A TFRecord dataset with an ArrayRecord copy converted beside it (what `tfds
  convert_format` without --out_dir leaves: the shards, and the format in the info's
  alternative formats) is read from the copy without TensorFlow, shuffled in the TFRecord
  dataset's windows: its batches. Without the copy: one error naming the conversion."""
  folder = "digits/1.0.0"
  converted = shutil.copytree(os.path.join(prepared["tfrecord"], folder), tmp_path / folder)
  for shard in glob.glob(os.path.join(prepared["array_record"], folder, "*.array_record-*")):
    shutil.copy(shard, converted)
  info = json.loads((converted / "dataset_info.json").read_text())
  info["alternativeFileFormats"] = ["array_record"]
  (converted / "dataset_info.json").write_text(json.dumps(info))
  with_tf = tfds_source.TfdsDataset("digits", str(tmp_path))
  installed = platforms.installed
  monkeypatch.setattr(platforms, "installed", lambda m: m != "tensorflow" and installed(m))
  without_tf = tfds_source.TfdsDataset("digits", str(tmp_path))  # (a Dataset: DigitsArrays)
  assert (with_tf.file_format.value, without_tf.file_format.value) == ("tfrecord", "array_record")
  a, b = (tfds_source.TfdsSplit(d, "train[5:]+test") for d in (with_tf, without_tf))
  assert a.random_access is b.random_access is False  # the same windows: the same batches
  assert isinstance(b._records["train"], records.ArrayRecordSplit)
  ranges = [(0, 40), (470, 520), (1430, 1440), (1700, 1792)]
  for (values_a, labels_a), (values_b, labels_b) in zip(a.read_many(ranges), b.read_many(ranges)):
    assert list(values_a) == list(values_b)
    np.testing.assert_array_equal(labels_a, labels_b)
  with pytest.raises(errors.ConfigError, match=r"tfds convert_format --dataset_version_dir="):
    tfds_source.TfdsDataset("digits", prepared["tfrecord"])
