"""Serialized examples of a prepared tfds split, read by position without a skip.

tfds reads a range of a TFRecord shard by reading every record before it, so the many
short ranges of the train pipeline's shuffle windows would read the data many times
over. Here a range costs its own bytes only:

  * TFRecord (what `tfds build` writes by default): the first read of a shard finds
    where its records start by hopping over their 12-byte headers (12 bytes read per
    record, once per run); a range of records is then one read of exactly its bytes.
  * ArrayRecord (`tfds build --file_format=array_record`): tfds' data source reads
    records by index, so a split is random-access (shuffled whole, no windows).

A data_dir on a bucket is read from local copies of the files (`remote_cache`: each copied
on the first read of one of its records, with concurrent ranged GETs, and kept): the
ArrayRecord reader opens local paths only, and a TFRecord shard's headers would be a
request each.

Both yield tfds' serialized tf.train.Example bytes; `parse` extracts image and label with
the protobuf classes tfds ships (`tensorflow_datasets.proto`), not TensorFlow, so an
ArrayRecord dataset is read where TensorFlow is not installed: 1.7 us a record of a small
image (tf.io.parse_example 0.9 us, both beside a decode of about a millisecond), half
TensorFlow's time on 110 KB images (`benchmarks/record_parse.py`). Other formats
(riegeli, parquet) are left to tfds (open_split returns None).
"""

from __future__ import annotations

import os
import struct
import threading
from typing import Any, Callable, Iterable, Protocol, Sequence

import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.proto import tf_example_pb2

from vit_jax.data import filesystems, remote_cache
from vit_jax.infra import errors, storage

_HEADER = 12  # TFRecord framing: uint64 length, uint32 crc of the length ...
_FOOTER = 4  # ... the record, uint32 crc of the record.
_IMAGE, _LABEL = "image", "label"  # The encoded image (tfds Image), the tfds ClassLabel.


class Records(Protocol):
  """The serialized examples of one named split, by index in the split."""

  def read(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """The records of each [start, stop) range, concatenated in order."""
    ...


def _damaged(
  path: str, record: int | None, what: str, copy: str | None = None
) -> errors.InputFileError:
  """The error for a damaged file of a prepared dataset: the file, the record (its index in
  the file) where known, what is wrong and the way out. ``copy``: the local copy read of
  a file on a bucket (which is the bucket's, byte for byte: a new one is copied anew)."""
  where = f" at record {record} of the file" if record is not None else ""
  read = f"; read from its local copy {copy!r}" if copy else ""
  return errors.InputFileError(
    f"The prepared dataset's file {path!r} is damaged{where} ({what}{read}): put an intact "
    f"copy of it in its place, or delete {os.path.dirname(path)!r} and prepare the dataset "
    "again with tfds."
  )


def _missing(path: str) -> errors.MissingError:
  """The error for a file of a prepared dataset that is gone."""
  return errors.MissingError(
    f"The prepared dataset's file {path!r} is missing: put it back, or delete "
    f"{os.path.dirname(path)!r} and prepare the dataset again with tfds."
  )


class _Copies:
  """Local copies of a split's files on a bucket (`remote_cache`), each made on the first
  read of one of its records; a file missing there is one error naming it."""

  def __init__(self, urls: Sequence[str]):
    try:
      self.copies = remote_cache.copies(urls)
    except FileNotFoundError as e:
      raise _missing(e.filename) from None
    self._made = [False] * len(urls)
    self._lock = threading.Lock()

  def path(self, k: int) -> str:
    return self.copies[k].path

  def fetch(self, files: Iterable[int]) -> None:
    """Makes the copies of files ``files`` (indices) not made yet, all at once."""
    with self._lock:
      wanted = [k for k in sorted(set(files)) if not self._made[k]]
      if not wanted:
        return
      try:
        remote_cache.fetch([self.copies[k] for k in wanted])
      except FileNotFoundError as e:
        raise _missing(e.filename) from None
      for k in wanted:
        self._made[k] = True


class TfrecordShard:
  """One TFRecord file; the start of each record is found on first use. ``copy``: the
  local copy read in place of a file on a bucket (made before the first read)."""

  def __init__(self, path: str, num_records: int, copy: str | None = None):
    self.path, self.num_records, self.copy = path, num_records, copy
    self._starts: np.ndarray | None = None  # int64 [num_records + 1]; last = file end

  def starts(self) -> np.ndarray:
    if self._starts is None:
      starts, position = [0], 0
      try:
        with filesystems.open_binary(self.copy or self.path, exact=True) as f:
          size = f.seek(0, os.SEEK_END)
          for k in range(self.num_records):
            f.seek(position)
            header = f.read(_HEADER)
            if len(header) < _HEADER:
              break
            position += _HEADER + struct.unpack("<Q", header[:8])[0] + _FOOTER
            if position > size:  # a damaged length (or a file cut short in the record)
              what = f"its length ends past the file's {size} bytes"
              raise _damaged(self.path, k, what, self.copy)
            starts.append(position)
      except FileNotFoundError:
        raise _missing(self.path) from None
      if len(starts) != self.num_records + 1:
        raise _damaged(
          self.path,
          None,
          f"it holds {len(starts) - 1} records where the dataset's metadata says "
          f"{self.num_records}: it is incomplete",
          self.copy,
        )
      self._starts = np.array(starts, np.int64)
    return self._starts

  def read(self, start: int, stop: int) -> list[bytes]:
    """Records [start, stop) of the file: one read of their bytes."""
    starts = self.starts()
    base, end = int(starts[start]), int(starts[stop])
    try:
      with filesystems.open_binary(self.copy or self.path, exact=True) as f:
        f.seek(base)
        data = f.read(end - base)
    except FileNotFoundError:  # deleted since its records were found
      raise _missing(self.path) from None
    if len(data) < end - base:  # cut short since its records were found
      record = int(np.searchsorted(starts, base + len(data), side="right")) - 1
      raise _damaged(self.path, record, f"the file ends at byte {base + len(data)}", self.copy)
    view = memoryview(data)
    return [
      bytes(view[a + _HEADER - base : b - _FOOTER - base])
      for a, b in zip(starts[start:stop].tolist(), starts[start + 1 : stop + 1].tolist())
    ]


class TfrecordSplit:
  """A named split stored as TFRecord shards; ``copies``: their local copies, where the
  shards are on a bucket."""

  def __init__(self, shards: list[TfrecordShard], copies: _Copies | None = None):
    self.shards, self._copies = shards, copies
    self._offsets = np.cumsum([0] + [s.num_records for s in shards])  # [num_shards + 1]

  def read(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    if self._copies is not None:  # the shards the ranges run through, copied at once
      touched = [
        k
        for lo, hi in ranges
        if hi > lo
        for k in range(
          int(np.searchsorted(self._offsets, lo, side="right")) - 1,
          int(np.searchsorted(self._offsets, hi - 1, side="right")),
        )
      ]
      self._copies.fetch(touched)
    out: list[bytes] = []
    for lo, hi in ranges:
      first = int(np.searchsorted(self._offsets, lo, side="right")) - 1
      for k in range(max(first, 0), len(self.shards)):
        a, b = max(lo - self._offsets[k], 0), min(hi - self._offsets[k], self.shards[k].num_records)
        if a >= b:
          break
        out += self.shards[k].read(int(a), int(b))
    return out


class _CopiedSource:
  """An ArrayRecord data source over the local copies of files on a bucket (`_Copies`),
  each copied on the first read of one of its records. ``files``: (url, first record,
  records) of each, as `ArrayRecordSplit`'s."""

  def __init__(self, copies: _Copies, files: Sequence[tuple[str, int, int]]):
    from array_record.python import array_record_data_source  # pylint: disable=g-import-not-at-top

    self._copies = copies
    self._ends = np.cumsum([take for _, _, take in files], dtype=np.int64)
    # Files as "path[first:stop]", the reader's way of naming part of a file.
    self._source = array_record_data_source.ArrayRecordDataSource(
      [f"{copies.path(k)}[{skip}:{skip + take}]" for k, (_, skip, take) in enumerate(files)]
    )

  def _fetch(self, keys: Sequence[int]) -> None:
    self._copies.fetch(np.searchsorted(self._ends, keys, side="right").tolist())

  def __getitems__(self, keys: Sequence[int]) -> Sequence[bytes]:
    self._fetch(keys)
    return self._source.__getitems__(keys)

  def __getitem__(self, key: int) -> bytes:
    self._fetch([key])
    return self._source[key]


class ArrayRecordSplit:
  """A named split stored as ArrayRecord: tfds' data source, read by index. ``files``:
  (path, first record, records) of each file the split's indices run through, in order
  (tfds' file instructions), which name the file of a read that fails. ``copies``: the
  files' local copies, read in their place (a data_dir on a bucket: ``source`` is a
  `_CopiedSource`)."""

  def __init__(
    self, source: Any, files: Sequence[tuple[str, int, int]], copies: _Copies | None = None
  ):
    self.source, self.files, self._copies = source, list(files), copies
    self._ends = np.cumsum([take for _, _, take in self.files], dtype=np.int64)

  def read(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    indices = [i for lo, hi in ranges for i in range(lo, hi)]
    if not indices:
      return []
    try:
      return list(self.source.__getitems__(indices))
    except (RuntimeError, OSError):  # Riegeli's: a damaged, cut or missing file; I/O
      return self._read_by_file(indices)

  def _read_by_file(self, indices: list[int]) -> list[bytes]:
    """The records at ``indices``, file by file, then record by record in a file whose
    read fails: its first record that fails is the error (a read that fails once only,
    an I/O error the storage recovers from, is read again and kept)."""
    file_of = np.searchsorted(self._ends, indices, side="right")
    out: list[bytes] = [b""] * len(indices)
    for k in np.unique(file_of).tolist():
      where = np.flatnonzero(file_of == k).tolist()
      try:
        records = list(self.source.__getitems__([indices[w] for w in where]))
      except (RuntimeError, OSError):
        where.sort(key=lambda w: indices[w])  # the first damaged record is named
        records = [self._one(indices[w], k) for w in where]
      for w, record in zip(where, records):
        out[w] = record
    return out

  def _one(self, index: int, k: int) -> bytes:
    """The record at split index ``index``, in file ``k``; one error naming the file and
    the record when it cannot be read."""
    try:
      return self.source[index]
    except (RuntimeError, OSError) as e:
      path, skip, take = self.files[k]
      copy = self._copies.path(k) if self._copies is not None else None
      if not filesystems.exists(copy or path):
        raise _missing(path) from None
      # A file whose index is unreadable (cut short, emptied) fails at every record.
      whole = _array_record_count(copy or path) < skip + take
      record = None if whole else skip + index - int(self._ends[k] - take)
      raise _damaged(path, record, " ".join(str(e).split())[:300], copy) from None


def _array_record_count(path: str) -> int:
  """The records ArrayRecord file ``path`` says it holds; 0 where its index is unreadable."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

  try:
    reader = array_record_module.ArrayRecordReader(path)
    try:
      return reader.num_records()
    finally:
      reader.close()
  except (RuntimeError, OSError):
    return 0


def open_split(
  builder: tfds.core.DatasetBuilder, split: str, file_format: tfds.core.FileFormat
) -> Records | None:
  """Direct reads of a named split of a prepared dataset in ``file_format`` (the prepared
  one, or ArrayRecord converted beside it); None for other formats."""
  if file_format == tfds.core.FileFormat.ARRAY_RECORD:
    raw = tfds.decode.DeserializeMethod.RAW_BYTES
    source = builder.as_data_source(split=split, deserialize_method=raw, file_format=file_format)
    instructions = source.dataset_info.splits[split].file_instructions  # of the format read
    files = [(os.fspath(f.filename), f.skip, f.take) for f in instructions]
    if files and storage.is_remote(files[0][0]):  # the reader opens local files only
      copies = _Copies([path for path, _, _ in files])
      return ArrayRecordSplit(_CopiedSource(copies, files), files, copies)
    return ArrayRecordSplit(source, files)
  if file_format == tfds.core.FileFormat.TFRECORD:
    instructions = builder.info.splits[split].file_instructions
    paths = [os.fspath(f.filename) for f in instructions]
    copies = _Copies(paths) if paths and storage.is_remote(paths[0]) else None
    return TfrecordSplit(
      [
        TfrecordShard(path, f.examples_in_shard, copies.path(k) if copies else None)
        for k, (path, f) in enumerate(zip(paths, instructions))
      ],
      copies,
    )
  return None


def _features(record: bytes) -> Any:
  """A serialized tf.train.Example's feature map ({key: Feature}); one error line for bytes
  that are not one (a TFRecord file's damaged bytes: its records carry no checksum read
  here)."""
  try:
    return tf_example_pb2.Example.FromString(record).features.feature
  except Exception as e:  # protobuf's DecodeError
    raise errors.InputFileError(
      f"A record of the prepared dataset is not a serialized tf.train.Example ({e}): its "
      "files are damaged; prepare the dataset again with tfds."
    ) from None


def _one(feature: Any, key: str, kind: str) -> Any:
  """The single value of a scalar feature (kind: 'bytes_list' or 'int64_list')."""
  values = getattr(feature[key], kind).value if key in feature else ()
  if len(values) != 1:
    raise ValueError(f"a record whose {key!r} holds {len(values)} values, not one")
  return values[0]


def parse(
  records: list[bytes], label: str | Callable[[Any], int] = _LABEL
) -> tuple[np.ndarray, np.ndarray]:
  """Serialized examples -> (encoded images object [n], labels int64 [n]) (``label``: the
  ClassLabel feature read, e.g. imagenet2012_real's 'original_label', or a function of an
  example's features: a class derived from them, `vtab.DERIVED_LABELS`)."""
  values, labels = np.empty(len(records), object), np.zeros(len(records), np.int64)
  for i, record in enumerate(records):
    feature = _features(record)
    values[i] = _one(feature, _IMAGE, "bytes_list")
    labels[i] = label(feature) if callable(label) else _one(feature, label, "int64_list")
  return values, labels


def parse_int_lists(records: list[bytes], key: str) -> list[np.ndarray]:
  """Serialized examples -> each one's int64 values of ``key`` (a Sequence of ClassLabel:
  ReaL's label sets; an empty array where the example has none)."""
  out = []
  for record in records:
    feature = _features(record)
    values = feature[key].int64_list.value if key in feature else ()
    out.append(np.asarray(values, np.int64))
  return out


def parse_text(records: list[bytes], text: tuple[str, str]) -> tuple[np.ndarray, ...]:
  """Serialized image-text examples (``text``: the image and text features' keys) ->
  (encoded images object [n], zero labels int64 [n], each example's captions: object [n]
  of tuples of str, `free_text`)."""
  from vit_jax.data import free_text  # pylint: disable=g-import-not-at-top

  image, caption = text
  values, captions = np.empty(len(records), object), []
  for i, record in enumerate(records):
    feature = _features(record)
    values[i] = _one(feature, image, "bytes_list")
    texts = feature[caption].bytes_list.value if caption in feature else ()
    where = f"a record's {caption!r}"
    captions.append(free_text.as_captions([t.decode("utf-8") for t in texts], where))
  return values, np.zeros(len(values), np.int64), free_text.captions_array(captions)
