"""Direct record reads of prepared tfds datasets: TFRecord by offset, ArrayRecord by index."""

import glob
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds

from tests import train_fixtures
from vit_jax.data import dataset, filesystems, order, pipeline, readers, records, tfds_source
from vit_jax.data import settings as data_settings
from vit_jax.infra import errors, platforms

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
  return dataset.Dataset(data_settings.Settings.from_config(config))


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

    def seek(self, offset, whence=os.SEEK_SET):
      self.offset = self.file.seek(offset, whence)
      return self.offset

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
  with pytest.raises(errors.InputFileError, match="short.tfrecord' is damaged at record 2 "):
    records.TfrecordShard(str(path), shard.num_records).read(0, 1)
  path.write_bytes(b"")
  with pytest.raises(errors.InputFileError, match="holds 0 records where .* says 120"):
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

  def corrupting(serialized, *label):
    values, labels = parse(serialized, *label)
    values = np.array([b"not an image" if v == broken else v for v in values], object)
    return values, labels

  data = _dataset(prepared[file_format], train_split="test", batch=360, shuffle_buffer=360)
  clean = next(pipeline.local_train_batches(data, 360, 0, 0, 1))["image"].reshape(360, -1)
  monkeypatch.setattr(records, "parse", corrupting)
  fix = r"Replace it where the data is stored \(a tfds dataset: prepare it again\), or set"
  with pytest.raises(ValueError, match=rf"image .example 3 of .*\. {fix} config.skip_corrupt"):
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
  # The copy's files, which a failed read names (tfds' file instructions of the format read).
  assert [os.path.dirname(path) for path, _, _ in b._records["train"].files] == [str(converted)] * 3
  assert all(".array_record-" in path for path, _, _ in b._records["train"].files)
  ranges = [(0, 40), (470, 520), (1430, 1440), (1700, 1792)]
  for (values_a, labels_a), (values_b, labels_b) in zip(a.read_many(ranges), b.read_many(ranges)):
    assert list(values_a) == list(values_b)
    np.testing.assert_array_equal(labels_a, labels_b)
  with pytest.raises(errors.ConfigError, match=r"tfds convert_format --dataset_version_dir="):
    tfds_source.TfdsDataset("digits", prepared["tfrecord"])


def _write_array_record(path, count: int) -> list[bytes]:
  """An ArrayRecord file of ``count`` distinct records, uncompressed (so a record's bytes
  can be found in the file); the records."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

  payloads = [f"record-{k:03d}-".encode() * 20 for k in range(count)]
  writer = array_record_module.ArrayRecordWriter(str(path), "group_size:1,uncompressed")
  for payload in payloads:
    writer.write(payload)
  writer.close()
  return payloads


def _flip(path, offset: int, count: int = 8) -> None:
  data = bytearray(path.read_bytes())
  data[offset : offset + count] = bytes(b ^ 0xFF for b in data[offset : offset + count])
  path.write_bytes(bytes(data))


def test_a_damaged_array_record_file_is_one_error_naming_it_and_the_record(tmp_path):
  """Riegeli's "chunk data hash mismatch" names no file: the error names the file, the
  record in it and the way out; the other files and records still read."""
  from array_record.python import array_record_data_source  # pylint: disable=g-import-not-at-top

  paths = [tmp_path / f"d-train.array_record-0000{k}-of-00002" for k in (0, 1)]
  _write_array_record(paths[0], 6)
  payloads = _write_array_record(paths[1], 6)

  def split() -> records.ArrayRecordSplit:
    # As tfds' data source makes it: the files' records given, so none is opened until read.
    source = array_record_data_source.ArrayRecordDataSource([f"{p}[0:6]" for p in paths])
    return records.ArrayRecordSplit(source, [(str(p), 0, 6) for p in paths])

  _flip(paths[1], paths[1].read_bytes().index(payloads[3]) + 20)  # inside record 3's bytes
  damaged = split()
  assert damaged.read([(0, 6), (6, 9), (10, 12)])[6:] == payloads[:3] + payloads[4:]
  with pytest.raises(errors.InputFileError) as raised:
    damaged.read([(11, 12), (2, 10)])  # the damaged record among others, of both files
  message = str(raised.value)
  assert "\n" not in message
  assert f"{str(paths[1])!r} is damaged at record 3 of the file (" in message
  assert "chunk data hash mismatch" in message
  assert f"delete {str(tmp_path)!r} and prepare the dataset again with tfds" in message
  paths[1].write_bytes(paths[1].read_bytes()[:70_000])  # cut short: no record of it reads
  with pytest.raises(errors.InputFileError, match=r"00001-of-00002' is damaged \("):
    split().read([(0, 1), (7, 8)])
  paths[1].unlink()
  with pytest.raises(errors.MissingError, match=r"00001-of-00002' is missing: put it back"):
    split().read([(7, 8)])


def test_an_array_record_read_that_fails_once_is_read_again():
  """A read of several records that fails (the storage's I/O) while each record reads
  alone gives the records."""

  class Flaky:
    def __init__(self):
      self.failures = 1

    def __getitems__(self, keys):
      if self.failures:
        self.failures -= 1
        raise OSError("connection reset")
      return [b"%d" % k for k in keys]

    def __getitem__(self, key):
      return b"%d" % key

  split = records.ArrayRecordSplit(Flaky(), [("a", 0, 5), ("b", 0, 5)])
  assert split.read([(3, 7)]) == [b"3", b"4", b"5", b"6"]


def _damaged_copy(prepared, file_format: str, tmp_path, damage) -> str:
  """A copy of digits prepared in ``file_format`` whose second train file ``damage``
  changed; its data_dir."""
  shutil.copytree(prepared[file_format], tmp_path, dirs_exist_ok=True)
  (path,) = glob.glob(str(tmp_path / "digits" / "*" / f"digits-train.{file_format}-00001-of-*"))
  damage(path)
  return str(tmp_path)


def _middle_flipped(path: str) -> None:
  data = bytearray(open(path, "rb").read())
  middle = len(data) // 2
  data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
  with open(path, "wb") as f:
    f.write(bytes(data))


@pytest.mark.parametrize(
  "file_format, damage, error, expected",
  [
    ("array_record", _middle_flipped, errors.InputFileError, r"is damaged at record \d+ of "),
    ("array_record", os.remove, errors.MissingError, r"is missing: put it back"),
    ("tfrecord", _middle_flipped, errors.InputFileError, r"is damaged at record \d+ of "),
    ("tfrecord", os.remove, errors.MissingError, r"is missing: put it back"),
  ],
)
def test_a_damaged_or_missing_file_stops_training_with_one_line_naming_it(
  prepared, tmp_path, file_format, damage, error, expected
):
  """Through the pipeline: the train stream stops with the error naming the file."""
  data = _dataset(_damaged_copy(prepared, file_format, tmp_path, damage), train_split="train")
  batches = pipeline.local_train_batches(data, 8, 0, 0, 1)
  with pytest.raises(error, match=rf"digits-train\.{file_format}-00001-of-00003' {expected}"):
    for _ in range(200):  # an epoch and more
      next(batches)


def test_a_record_that_is_no_example_is_one_error():
  with pytest.raises(errors.InputFileError, match=r"not a serialized tf.train.Example .* again"):
    records.parse([b"\xff\xff\xff"])
