"""tfds datasets by name, read from a prepared `data_dir` (local or gs://); never downloads.

Images are read as their stored encoded bytes (decoding happens later, in parallel, in
the pipeline); only the `image` and `label` features are read, or, for image-text data
(`free_text`), an image feature and a text feature (a string, or a sequence of strings:
several captions per image, e.g. ``coco_captions``' ``captions/text``). The one exception to
"never prepares" is the built-in `digits` dataset, which builds itself offline in a
few seconds the first time it is used; and a dataset whose archives the user placed in
`manual_dir` is prepared from there by a single-process run.

TensorFlow reads TFRecord (tfds' default format) and builds datasets; a dataset prepared
as ArrayRecord, or with an ArrayRecord copy converted beside it, is read without it
(`records`), and without TensorFlow any other is one error line naming the `tf` extra and
tfds' command that converts it. A data_dir on a bucket: tfds reads the metadata there, and
the records are read from local copies of the files (`remote_cache`).
"""

from __future__ import annotations

import functools
import itertools
import operator
from typing import Any

import jax
import numpy as np
import tensorflow_datasets as tfds
from absl import logging
from tensorflow_datasets.core.utils import py_utils

from vit_jax.data import digits, free_text, vtab  # digits: registers its builder with tfds
from vit_jax.data import records as records_lib
from vit_jax.data import splits as splits_lib
from vit_jax.infra import errors, platforms, storage

_IMAGE, _LABEL = "image", "label"  # Feature keys every supported dataset has.
_READ_BATCH = 1024  # Records converted to numpy at a time.
# The text feature of an image-text dataset when config.text.text_feature is None: the
# first of these it has (flattened names: a sequence's feature is 'sequence/feature').
TEXT_FEATURES = ("captions/text", "caption", "captions", "text")


class TfdsDataset:
  """A prepared tfds dataset: its builder, class names and splits."""

  def __init__(
    self,
    name: str,
    data_dir: str | None = None,
    manual_dir: str | None = None,
    text: tuple[str, str | None] | None = None,
    label: str = _LABEL,
  ):
    """``text``: (image feature, text feature or None: `TEXT_FEATURES`) of image-text data,
    read in place of image and label; ``label``: the ClassLabel feature read as the label
    (imagenet2012_real's 'original_label', smallnorb's 'label_azimuth')."""
    self.name = name
    self.label = label
    # A class derived from other features (VTAB's CLEVR, KITTI, dSprites): no ClassLabel.
    self.derive = vtab.DERIVED_LABELS.get(label)
    self.image_scale = vtab.IMAGE_SCALES.get(name.split(":")[0])  # dSprites' 0/1 pixels
    if data_dir and storage.is_remote(data_dir):
      storage.configure()  # tfds reads the metadata through epath: fsspec's, as every gs:// path
    try:
      self.builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
      raise errors.ConfigError(
        f"config.dataset={name!r} is neither a tfds dataset nor a folder. Use a tfds "
        f'name (e.g. "cifar10", "imagenet2012", the built-in offline "digits"), or '
        f'"folder:/path/to/root" for <root>/<split>/<class>/*.jpg.'
      ) from None
    self._data_dir = data_dir
    self._manual_dir = manual_dir
    self._prepare_if_possible()
    # The format prepared (which sets the shuffle: `TfdsSplit`), and the one read.
    self.stored_format = self.builder.info.file_format or tfds.core.FileFormat.TFRECORD
    self.file_format = self._readable_format()
    self.text = self._text_features(*text) if text else None  # (image, text) serialized keys
    if self.text:
      self.num_classes, self.class_names = None, None
      return
    features = self.builder.info.features
    if self.derive is not None:
      self.num_classes, self.class_names = None, None
      return
    missing = [k for k in (_IMAGE, label) if k not in features]
    if missing:
      raise errors.ConfigError(
        f"tfds dataset {name!r} has no {missing} feature (it has {list(features)}); "
        f'the pipeline reads "{_IMAGE}" and "{label}". Use an image classification '
        f"dataset (or name its label feature), or export it as an image folder."
      )
    label = features[label]
    self.num_classes = getattr(label, "num_classes", None)
    self.class_names = list(label.names) if self.num_classes else None

  def _text_features(self, image: str, text: str | None) -> tuple[str, str]:
    """The serialized keys of the image and text features; one error naming the dataset's
    features and the config keys when either is missing."""
    serialized = py_utils.flatten_nest_dict(self.builder.info.features.get_serialized_info())
    strings = [k for k, v in serialized.items() if v.np_dtype == np.object_]
    found = text or next((k for k in TEXT_FEATURES if k in strings), None)
    features = self.builder.info.features
    if image not in features or not isinstance(features[image], tfds.features.Image):
      raise errors.ConfigError(
        f"tfds dataset {self.name!r} has no image feature {image!r}: set "
        f"config.text.image_feature to one of its features {list(features)}."
      )
    if found not in strings:
      raise errors.ConfigError(
        f"tfds dataset {self.name!r} has no text feature {found!r}: set "
        f"config.text.text_feature to one of its string features {strings}."
      )
    return image, found

  def _prepare_if_possible(self) -> None:
    """Builds `digits`, or a dataset from config.manual_dir; nothing else downloads."""
    if self.builder.is_prepared():
      return
    platforms.import_tensorflow()  # tfds builds with TensorFlow (without Keras: seconds less)
    if self.name == digits.Digits.name:
      logging.info("Building %s into %s (once, a second or two).", self.name, self._data_dir_text())
      tfds.disable_progress_bar()  # tqdm bars of a second's work, among the log lines
      try:
        self.builder.download_and_prepare()
      except FileExistsError:
        # Another process sharing this data_dir (a multi-process run) renamed its build
        # into place first; use that one.
        if not self.builder.is_prepared():
          raise
        self.builder = tfds.builder(self.name, data_dir=self._data_dir)
      finally:
        tfds.enable_progress_bar()
    elif self._manual_dir and jax.process_count() == 1:
      logging.info("Preparing %s from manual_dir %s", self.name, self._manual_dir)
      try:
        self.builder.download_and_prepare(
          download_config=tfds.download.DownloadConfig(manual_dir=self._manual_dir)
        )
      except Exception as e:  # Offline: a needed download fails somewhere inside tfds.
        raise errors.MissingError(
          f"Preparing tfds dataset {self.name!r} from manual_dir "
          f"{self._manual_dir!r} into {self._data_dir_text()} failed: {e!r}. Check "
          f"that the archives tfds expects are in manual_dir, or prepare it where a "
          f"network is available: `tfds build {self.name} --data_dir=<dir> "
          f"--manual_dir=<dir>`."
        ) from e

  def _readable_format(self) -> tfds.core.FileFormat:
    """The file format read: the prepared one; without TensorFlow, ArrayRecord: the
    prepared format or a copy converted beside it (tfds convert_format, in place), else
    one error line naming the extra and the conversion (docs/input_pipelines.md)."""
    array_record, stored = tfds.core.FileFormat.ARRAY_RECORD, self.stored_format
    if stored == array_record or not self.builder.is_prepared():
      return stored
    if platforms.installed("tensorflow"):
      return stored
    # A registered builder's info comes from its code, which does not list the formats
    # converted beside it; the files' own builder does.
    from_files = tfds.builder_from_directory(self.builder.data_dir)
    if array_record in from_files.info.available_file_formats():
      self.builder = from_files
      return array_record
    raise errors.ConfigError(
      f"tfds dataset {self.name!r} is stored as {stored.value}, which is read with "
      f'TensorFlow: pip install -e ".[tf]", or add an ArrayRecord copy once where '
      f"TensorFlow is installed (pip install apache-beam mlcroissant): `tfds convert_format "
      f"--dataset_version_dir={self.builder.data_dir} --out_file_format=array_record`."
    )

  def _data_dir_text(self) -> str:
    return (
      repr(self._data_dir)
      if self._data_dir
      else f"the tfds default data_dir ({tfds.core.constants.DATA_DIR!r} or $TFDS_DATA_DIR)"
    )

  def not_prepared_error(self) -> errors.MissingError:
    """The error for a dataset not prepared in the data_dir: the command that prepares it
    (into config.data_dir, or tfds' default), or where else it may already be."""
    data_dir = f" --data_dir={self._data_dir}" if self._data_dir else ""
    return errors.MissingError(
      f"tfds dataset {self.name!r} is not prepared in {self._data_dir_text()} "
      f"(looked for {self.builder.data_dir!r}), and this pipeline does not download. "
      f"Prepare it once: `tfds build {self.name}{data_dir}` (add `--manual_dir=<dir>` "
      f"for datasets such as imagenet2012 whose archives you download yourself, or set "
      f"config.manual_dir to prepare from there; the tfds command line needs `pip install "
      f"apache-beam`); or set config.data_dir to where a prepared copy is, a local folder "
      f"or a gs:// bucket."
    )

  def split_sizes(self) -> dict[str, int]:
    """{split name: number of examples}; empty when tfds has no metadata (mock data)."""
    return {name: info.num_examples for name, info in self.builder.info.splits.items()}

  def load(self, split) -> tuple[np.ndarray, ...]:
    """All examples of a split string or ReadInstruction, in stored order.

    Returns (encoded images object [n], labels int64 [n]), and for image-text data their
    captions (object [n] of tuples).
    """
    if self.text:
      return self._load_text(split)
    if self.derive is not None:
      raise errors.ConfigError(
        f"tfds dataset {self.name!r}: the label {self.label!r} is derived from the prepared "
        "records' features, and this dataset is read through tfds: prepare it with `tfds build`."
      )
    decoders = {_IMAGE: tfds.decode.SkipDecoding()}
    if set(self.builder.info.features) != {_IMAGE, self.label}:  # Skip the other features.
      decoders = tfds.decode.PartialDecoding({_IMAGE: True, self.label: True}, decoders)
    ds = self._as_dataset(split, decoders)
    ds = ds.map(lambda ex: (ex[_IMAGE], ex[self.label])).batch(_READ_BATCH).prefetch(1)
    values, labels = [np.zeros([0], object)], [np.zeros([0], np.int64)]
    for value, label in ds.as_numpy_iterator():
      values.append(value.astype(object))
      labels.append(label.astype(np.int64))
    return np.concatenate(values), np.concatenate(labels)

  def _as_dataset(self, split, decoders) -> Any:
    """The tf.data.Dataset of a split: tfds' reader (TensorFlow: a prepared dataset without it
    is ArrayRecord, read by `records`, `_check_readable`)."""
    platforms.import_tensorflow()
    try:
      # One file at a time: tfds' default interleaves the ranges of a multi-range read
      # in blocks of 16 records, mixing lanes' windows.
      return self.builder.as_dataset(
        split=split,
        decoders=decoders,
        shuffle_files=False,
        read_config=tfds.ReadConfig(interleave_cycle_length=1),
      )
    except AssertionError as e:  # tfds' "could not find data in <data_dir>".
      raise self.not_prepared_error() from e

  def _load_text(self, split) -> tuple[np.ndarray, ...]:
    """`load` of image-text data, an example at a time (captions differ in number)."""
    image, text = self.text
    ds = self._as_dataset(split, {image: tfds.decode.SkipDecoding()})
    ds = ds.map(lambda ex: (ex[image], py_utils.flatten_nest_dict(ex)[text]))
    values, texts = [], []
    for value, caption in ds.as_numpy_iterator():
      values.append(value)
      texts.append(_decoded(caption, f"an example of {self.name}"))
    out = np.empty(len(values), object)
    out[:] = values
    return out, np.zeros(len(values), np.int64), free_text.captions_array(texts)

  def split(self, spec: str) -> "TfdsSplit":
    return TfdsSplit(self, spec)


class TfdsSplit:
  """A configured split of a tfds dataset; values are encoded image bytes.

  A prepared TFRecord or ArrayRecord dataset is read directly (records.py): a range
  costs its own bytes, and ArrayRecord is random-access. Other formats go through
  tfds' reader. Without split sizes (tfds.testing.mock_data leaves them empty) the
  whole split is read once and kept in memory.
  """

  kind = "bytes"

  def __init__(self, dataset: TfdsDataset, spec: str):
    self.name = f"{dataset.name}:{spec}"
    self._dataset = dataset
    sizes = dataset.split_sizes()
    self._in_memory = None
    self._records: dict[str, records_lib.Records | None] = {}
    self.random_access = False
    if sizes:
      self._ranges = splits_lib.resolve(spec, sizes)
      self.num_examples = sum(len(r) for r in self._ranges)
      self._records = {
        r.split: records_lib.open_split(dataset.builder, r.split, dataset.file_format)
        for r in self._ranges
      }
      # Shuffled as the prepared format is stored: an ArrayRecord copy of a TFRecord
      # dataset (read without TensorFlow) gives the TFRecord dataset's batches.
      self.random_access = dataset.stored_format == tfds.core.FileFormat.ARRAY_RECORD
    else:
      # No sizes: mock data, or a dataset not prepared, which `load` reports (with the
      # command that prepares it) before anything is said about reading it.
      self._in_memory = dataset.load(spec)
      self.num_examples = len(self._in_memory[1])
      if not self.num_examples:
        raise errors.ConfigError(f"Split {spec!r} of {dataset.name!r} is empty.")
      logging.warning(
        "tfds has no split sizes for %s: read the whole split (%d examples) into memory.",
        self.name,
        self.num_examples,
      )

  def read(self, start: int, stop: int) -> tuple[np.ndarray, ...]:
    """Encoded images and labels (and captions) of examples [start, stop)."""
    return self.read_many([(start, stop)])[0]

  def read_many(self, ranges: list[tuple[int, int]]) -> list[tuple[np.ndarray, ...]]:
    """read(start, stop) of each range, with one parse (or one tfds read: each sets up
    a tf.data pipeline) for all of them."""
    if self._in_memory is not None:
      return [tuple(a[lo:hi] for a in self._in_memory) for lo, hi in ranges]
    parts = [r for lo, hi in ranges for r in splits_lib.select(self._ranges, lo, hi)]
    if all(self._records[r.split] is not None for r in parts):
      serialized = []
      for split, group in itertools.groupby(parts, key=lambda r: r.split):
        serialized += self._records[split].read([(r.start, r.stop) for r in group])
      text = self._dataset.text
      if text:
        rows = records_lib.parse_text(serialized, text)
      else:
        rows = records_lib.parse(serialized, self._dataset.derive or self._dataset.label)
    else:
      instructions = [
        tfds.core.ReadInstruction(r.split, from_=r.start, to=r.stop, unit="abs") for r in parts
      ]
      rows = self._dataset.load(functools.reduce(operator.add, instructions))
    values = rows[0]
    if self._dataset.image_scale:
      values[:] = [vtab.scaled_png(v, self._dataset.image_scale) for v in values]
    ends = np.cumsum([max(hi - lo, 0) for lo, hi in ranges])
    if len(values) != (ends[-1] if len(ends) else 0):
      raise RuntimeError(
        f"{self.name}: read {len(values)} examples for ranges {ranges}, "
        f"expected {ends[-1]}; the prepared dataset may be incomplete."
      )
    starts = ends - [max(hi - lo, 0) for lo, hi in ranges]
    return [tuple(r[a:b] for r in rows) for a, b in zip(starts, ends)]

  def int_lists(self, key: str) -> list[np.ndarray]:
    """Each example's int64 values of the feature ``key`` (ReaL's label sets), in split
    order; read from the prepared records (TFRecord or ArrayRecord)."""
    if self._in_memory is not None or any(r is None for r in self._records.values()):
      raise errors.ConfigError(
        f"{self.name}: the feature {key!r} is read from prepared TFRecord or ArrayRecord "
        "files, which this dataset has not: prepare it with `tfds build`."
      )
    serialized = []
    for r in self._ranges:
      serialized += self._records[r.split].read([(r.start, r.stop)])
    return records_lib.parse_int_lists(serialized, key)


def _decoded(captions, where: str) -> tuple[str, ...]:
  """A text feature's value (bytes, or bytes [n]) as one example's captions."""
  items = [captions] if isinstance(captions, bytes) else list(np.asarray(captions).ravel())
  texts = [c.decode("utf-8") if isinstance(c, bytes) else c for c in items]
  return free_text.as_captions(texts, where)
