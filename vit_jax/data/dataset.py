"""The configured dataset (`Dataset`: its splits, its classes) and its sizes
(`dataset_info`), from the data's `settings.Settings`."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from vit_jax.data import presets
from vit_jax.data.caption_settings import CaptionSettings
from vit_jax.data.settings import Settings, as_settings
from vit_jax.infra import errors, platforms

if TYPE_CHECKING:
  from vit_jax.data.splits import SplitSource


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What the training loop needs to know about the configured data.

  num_train / num_test: sizes of config.train_split / config.test_split (all
  processes together). class_names: None when the dataset does not name its classes.
  """

  num_classes: int
  num_train: int
  num_test: int
  class_names: list[str] | None


def check_readable(dataset: str) -> None:
  """Refuses a planning preset (`presets.PLANNING_ONLY`): its data is not public."""
  if dataset in presets.PLANNING_ONLY:
    raise errors.ConfigError(
      f"config.dataset={dataset!r} is a planning preset: the data is not public, so no "
      "run can read it. Plan with it (python -m vit_jax.plan --config=configs/pretrain.py:"
      f"<model>,{dataset} --topology=v3-256), or train on imagenet21k or your own data."
    )


class Dataset:
  """The configured dataset: opens splits and knows the number of classes."""

  def __init__(self, settings: Settings):
    # Imported here: only a run that opens its data pays for them (tfds, Pillow).
    # pylint: disable=g-import-not-at-top
    from vit_jax.data import arrays as arrays_lib
    from vit_jax.data import digits, tfds_source
    from vit_jax.data import folder as folder_lib

    self.settings = settings
    check_readable(settings.dataset)
    self.tokenizer = None  # `text_tokenizer.Tokenizer` of free-text captions
    text = settings.text
    if text is not None and text.tokenizer is not None:
      self._open_free_text(settings, text)
      return
    if settings.dataset.startswith(arrays_lib.PREFIX):
      self._source = arrays_lib.ArrayDataset(settings.dataset[len(arrays_lib.PREFIX) :])
    elif settings.dataset.startswith(folder_lib.PREFIX):
      self._source = folder_lib.ImageFolder(
        settings.dataset[len(folder_lib.PREFIX) :], settings.train_split
      )
    elif settings.dataset == digits.NAME and not platforms.installed("tensorflow"):
      # The examples tfds would build, in its order, from scikit-learn's arrays.
      self._source = digits.DigitsArrays()
    else:
      check_data_dir(settings.data_dir, "config.data_dir")
      self._source = tfds_source.TfdsDataset(
        settings.dataset, settings.data_dir, settings.manual_dir, label=settings.label_key
      )
    if settings.label_key != "label" and not isinstance(self._source, tfds_source.TfdsDataset):
      raise errors.ConfigError(
        f"label_key={settings.label_key!r} names a tfds feature, and {settings.dataset!r} "
        "is not a tfds dataset: remove label_key (its labels are its classes)."
      )
    self.class_names = self._source.class_names
    found = len(self.class_names) if self.class_names else None
    if settings.num_classes is not None and found and settings.num_classes != found:
      raise errors.ConfigError(
        f"config.num_classes={settings.num_classes} but {settings.dataset!r} has "
        f"{found} classes. Set config.num_classes={found} (or None to take it from "
        f"the data)."
      )
    self.num_classes = settings.num_classes or found
    if not self.num_classes:
      raise errors.ConfigError(
        f"{settings.dataset!r} does not say how many classes it has; set config.num_classes."
      )
    self.captions = None  # `captions.Captions` where the batches carry 'text'
    if text is not None:
      from vit_jax.data import captions  # pylint: disable=g-import-not-at-top

      if not self.class_names:
        raise errors.ConfigError(
          f"{settings.dataset!r} does not name its classes, which its captions are made of: "
          "use a dataset with class names (a tfds ClassLabel, a folder of classes)."
        )
      self.captions = captions.Captions(self.class_names, text.templates, text.text_len)

  def _open_free_text(self, settings: Settings, text: CaptionSettings) -> None:
    """A source of images with their own captions (`free_text`), and its tokenizer."""
    # pylint: disable-next=g-import-not-at-top
    from vit_jax.data import caption_folder, tar_shards, tfds_source

    self.tokenizer = text.load_tokenizer(None)
    name = settings.dataset
    if name.startswith(caption_folder.PREFIX):
      self._source = caption_folder.CaptionFolder(name[len(caption_folder.PREFIX) :])
    elif name.startswith(tar_shards.PREFIX):
      self._source = tar_shards.TarShards(name[len(tar_shards.PREFIX) :])
    else:
      check_data_dir(settings.data_dir, "config.data_dir")
      self._source = tfds_source.TfdsDataset(
        name,
        settings.data_dir,
        settings.manual_dir,
        text=(text.image_feature, text.text_feature),
      )
    self.class_names, self.num_classes, self.captions = None, 1, None  # no classes

  def tokenize(self, texts: np.ndarray) -> np.ndarray:
    """A batch's captions (bytes [B]) as int32 [B, text_len] ids."""
    length = self.settings.text.text_len
    return self.tokenizer.encode([t.decode("utf-8") for t in texts], length)

  def split(self, spec: str) -> SplitSource:
    return self._source.split(spec)


def check_data_dir(data_dir: Optional[str], name: str) -> None:
  """A tfds data_dir (``name``: the key or flag that set it) that exists must be a folder:
  tfds would fail inside a file with an error about its sub-folders."""
  if data_dir and "://" not in data_dir and os.path.exists(data_dir):
    if not os.path.isdir(data_dir):
      raise errors.ConfigError(
        f"{name}={data_dir!r} is a file, not a folder: name the folder of prepared tfds "
        "datasets (or a new one to build into)."
      )


def dataset_info(settings: Any) -> DatasetInfo:
  """Number of classes, sizes of the train and test splits, and class names (``settings``:
  `Settings` or a run config)."""
  dataset = Dataset(as_settings(settings))
  return DatasetInfo(
    num_classes=dataset.num_classes,
    num_train=dataset.split(dataset.settings.train_split).num_examples,
    num_test=dataset.split(dataset.settings.test_split).num_examples,
    class_names=dataset.class_names,
  )
