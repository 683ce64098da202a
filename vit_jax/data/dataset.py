"""From the run config to a dataset: the settings the pipeline reads, and split sizes.

`config.dataset` is a tfds name ('cifar10', 'digits', ...), 'folder:/path/to/root' or
'arrays:/path/data.npz' (in-memory arrays saved by `vit_jax.data.arrays.save_arrays`);
with free-text captions (``config.text.tokenizer``, `caption_settings`, `free_text`) a tfds
name with a text feature ('coco_captions'), 'captions:/path/to/root' or 'wds:/path/to/shards'.
This module is the only place that reads the data keys of the config, so a missing or
wrong key fails here, once, with the key's name. What the trained objective asks of the
data (captions, the image model's normalisation) comes in as `Needs`: the objective's
answer (`vit_jax.run.objectives`), never its name.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any, Mapping, Optional

import numpy as np

from vit_jax.data import data_config, presets
from vit_jax.data.budget_mix import BudgetMix
from vit_jax.data.caption_settings import CaptionSettings
from vit_jax.data.naflex_images import NaFlexInputs
from vit_jax.data.train_images import TrainImages
from vit_jax.infra import errors, platforms
from vit_jax.infra.image_constants import OFFICIAL_INPUT_MEAN, OFFICIAL_INPUT_STD

if TYPE_CHECKING:
  from vit_jax.data.splits import SplitSource

# Keys that may hold None: no local tfds dir, no manual-download dir, classes from the data.
_OPTIONAL = ("data_dir", "manual_dir", "num_classes")
# config.input_pipeline named a decoding stage when tf.data was one; Grain's is the only one
# now, so the config.json of older runs ('auto', 'grain') still reads, and 'tf' is refused.
_RETIRED_INPUT_PIPELINES = ("auto", "grain")


def _check_input_pipeline(config: Any) -> None:
  """One error line for a config that still asks for the tf.data stage."""
  name = config.get("input_pipeline")
  if name is not None and name not in _RETIRED_INPUT_PIPELINES:
    raise errors.ConfigError(
      f"config.input_pipeline={name!r}: the tf.data stage was removed; every source is read "
      "by the decoding stage (docs/input_pipelines.md). Remove the setting."
    )


@dataclasses.dataclass(frozen=True)
class Needs:
  """What a run's objective asks of its data (`vit_jax.run.objectives`): captions in the
  batches ('text'; None: none) and the model config whose ``input_mean``/``input_std``
  normalise the images (None: ``config.model``; a two-tower model's image tower)."""

  text: Optional[CaptionSettings] = None
  image_model: Optional[Mapping[str, Any]] = None


@dataclasses.dataclass(frozen=True)
class Settings:
  """The data keys of a run config, validated (their defaults: `vit_jax.run.defaults`)."""

  dataset: str
  data_dir: str | None
  manual_dir: str | None
  train_split: str
  test_split: str
  num_classes: int | None
  crop: int
  min_area: float
  flip: bool
  randaug: tuple[int, float] | None  # (layers, magnitude) of the train images' RandAugment
  batch: int
  batch_eval: int
  shuffle_buffer: int  # examples per shuffle window of a tfds dataset
  prefetch: int
  seed: int
  skip_corrupt_images: bool
  # The normalisation the model's weights expect (config.model.input_mean/input_std).
  input_mean: tuple[float, ...] = OFFICIAL_INPUT_MEAN
  input_std: tuple[float, ...] = OFFICIAL_INPUT_STD
  # The batches' captions ('text'), from the labels or the data's own (None: no 'text').
  text: Optional[CaptionSettings] = None
  # The eval preprocessing where it is not the official recipe (a crop, another resize).
  eval_data: Optional[data_config.DataConfig] = None
  decode_processes: Optional[int] = None  # config.decode_processes
  # The tfds ClassLabel feature read as the label (an evaluation instance's `label_key`).
  label_key: str = "label"
  # NaFlex images (config.pp.seq_len): each example its own aspect ratio in seq_len patches,
  # packed (`naflex_images.pack`) in place of a crop x crop image; None: square crops.
  naflex: Optional[NaFlexInputs] = None
  # NaFlex budgets drawn for each train step (config.pp.train_seq_lens, `budget_mix`);
  # (): every step at naflex.seq_len.
  train_seq_lens: tuple[int, ...] = ()

  def budget_mix(self) -> Optional[BudgetMix]:
    """The train steps' budgets and batches (None: one budget, `naflex.seq_len`)."""
    if not self.train_seq_lens or self.naflex is None:
      return None
    return BudgetMix.make(self.train_seq_lens, self.batch, self.naflex.seq_len)

  def at_budget(self, budget: int) -> "Settings":
    """The settings of the train batches at ``budget`` patches: that budget's batch and
    images, and its lanes' seed (`BudgetMix.lane_seed`)."""
    mix = self.budget_mix()
    assert mix is not None and self.naflex is not None, "at_budget needs train_seq_lens"
    return dataclasses.replace(
      self,
      batch=mix.batch(budget),
      naflex=dataclasses.replace(self.naflex, seq_len=budget),
      seed=mix.lane_seed(self.seed, budget),
      train_seq_lens=(),
    )

  @property
  def image_shape(self) -> tuple[int, ...]:
    """One example's 'image' array: [crop, crop, 3], or NaFlex's packed [seq_len, K + 3]."""
    return (self.crop, self.crop, 3) if self.naflex is None else self.naflex.row_shape

  @property
  def train_images(self) -> TrainImages:
    """What the train batches' images hold (normalised, or uint8 values for the step's
    RandAugment): the pipeline encodes by it and the step decodes by it."""
    return TrainImages(self.input_mean, self.input_std, self.randaug)

  def eval_data_config(self) -> data_config.DataConfig:
    """The eval images' preprocessing, at ``crop`` (which a command may have changed)."""
    if self.eval_data is None:
      return data_config.official((self.crop, self.crop), self.input_mean, self.input_std)
    return self.eval_data.at_size((self.crop, self.crop))

  @classmethod
  def for_evaluation(
    cls, eval_data: data_config.DataConfig, *, crop: int, batch: int
  ) -> "Settings":
    """Settings that only evaluate a model outside a run (a command on any weights): no
    dataset named yet, no augmentation, no shuffling, no image skipped; every split is
    prepared as ``eval_data`` says (a checkpoint's data config: its mean, std, crop and
    resize) at ``crop``."""
    return cls(
      dataset="",
      data_dir=None,
      manual_dir=None,
      train_split="train",
      test_split="test",
      num_classes=None,
      crop=crop,
      min_area=1.0,
      flip=False,
      randaug=None,
      batch=batch,
      batch_eval=batch,
      shuffle_buffer=1,
      prefetch=2,
      seed=0,
      skip_corrupt_images=False,
      input_mean=eval_data.mean,
      input_std=eval_data.std,
      eval_data=eval_data,
    )

  @classmethod
  def from_config(cls, config: Any, needs: Needs = Needs()) -> "Settings":
    """Reads an ml_collections.ConfigDict; a missing key, or None where a value is
    needed, fails with the key's name. ``needs``: the objective's (`Needs`)."""

    def get(key: str, node: Any = config, prefix: str = "") -> Any:
      if key not in node or (node[key] is None and key not in _OPTIONAL):
        raise errors.ConfigError(
          f"config.{prefix}{key} is required by the input pipeline; set it "
          f"(defaults: vit_jax/run/defaults.py; per-dataset values: "
          f"vit_jax/data/presets.py)."
        )
      return node[key]

    pp = get("pp")
    model = needs.image_model if needs.image_model is not None else config.get("model") or {}
    settings = cls(
      dataset=str(get("dataset")),
      data_dir=get("data_dir"),
      manual_dir=get("manual_dir"),
      train_split=str(get("train_split")),
      test_split=str(get("test_split")),
      num_classes=get("num_classes"),
      crop=int(get("crop", pp, "pp.")),
      min_area=float(get("min_area", pp, "pp.")),
      flip=bool(get("flip", pp, "pp.")),
      # Absent from config files that set config.pp whole and from the config.json of runs
      # made before RandAugment existed: they train(ed) without it.
      randaug=_randaug(pp.get("randaug")),
      batch=int(get("batch")),
      batch_eval=int(get("batch_eval")),
      shuffle_buffer=int(get("shuffle_buffer")),
      prefetch=int(get("prefetch")),
      seed=int(get("seed")),
      skip_corrupt_images=bool(get("skip_corrupt_images")),
      input_mean=tuple(model.get("input_mean", OFFICIAL_INPUT_MEAN)),
      input_std=tuple(model.get("input_std", OFFICIAL_INPUT_STD)),
      text=needs.text,
      # Absent from the config.json of runs made before worker processes decoded.
      decode_processes=config.get("decode_processes"),
      # Absent from configs written before it: the 'label' feature.
      label_key=str(config.get("label_key") or "label"),
    )
    _check_input_pipeline(config)
    if settings.decode_processes is not None and settings.decode_processes < 0:
      raise errors.ConfigError(
        f"config.decode_processes={settings.decode_processes} must be >= 0 (0: decode in "
        "this process's threads; None: one process per core)."
      )
    for key in ("crop", "batch", "batch_eval", "shuffle_buffer"):
      if getattr(settings, key) <= 0:
        raise errors.ConfigError(
          f"config.{'pp.' if key == 'crop' else ''}{key}={getattr(settings, key)} must be positive."
        )
    if not 0.0 < settings.min_area <= 1.0:
      raise errors.ConfigError(
        f"config.pp.min_area={settings.min_area} must be in (0, 1] "
        f"(the smallest crop area as a fraction of the image; 0.05 is "
        f"the usual value)."
      )
    # Read once the crop is known to be valid: the eval preprocessing is sized by it.
    eval_data = data_config.from_run_config(config, model)
    settings = dataclasses.replace(settings, eval_data=eval_data)
    settings = settings.with_seq_len(pp.get("seq_len"), _patch_size(model))
    return settings.with_train_seq_lens(pp.get("train_seq_lens"))

  def with_train_seq_lens(self, budgets: Any) -> "Settings":
    """These settings training at ``budgets`` (config.pp.train_seq_lens; None: at
    config.pp.seq_len alone), checked (`BudgetMix.make`)."""
    if budgets is None:
      return dataclasses.replace(self, train_seq_lens=())
    if self.naflex is None:
      raise errors.ConfigError(
        f"config.pp.train_seq_lens={budgets!r} mixes NaFlex budgets: set config.pp.seq_len "
        "too (the evaluation's budget, and with config.batch the tokens per train step)."
      )
    settings = dataclasses.replace(self, train_seq_lens=tuple(budgets))
    settings.budget_mix()  # its checks
    return settings

  def with_seq_len(
    self, seq_len: Any, patch: tuple[int, ...], argument: str = "config.pp.seq_len"
  ) -> "Settings":
    """These settings with NaFlex images of ``seq_len`` patches of the model's ``patch``
    size (None: square crops); a bad value is one error naming ``argument``: a whole
    number >= 1, square patches, no RandAugment (which augments square crops)."""
    if seq_len is None:
      return dataclasses.replace(self, naflex=None)
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
      raise errors.ConfigError(
        f"{argument}={seq_len!r} must be a whole number of patches >= 1 (e.g. 256), or None "
        "for square crops."
      )
    if len(patch) != 2 or patch[0] != patch[1]:
      raise errors.ConfigError(
        f"{argument}={seq_len} takes a ViT of square patches, not patches of {patch or None}."
      )
    if self.randaug is not None:
      raise errors.ConfigError(
        f"{argument}={seq_len} with config.pp.randaug={self.randaug}: RandAugment augments "
        "square crops; set config.pp.randaug=None."
      )
    return dataclasses.replace(self, naflex=NaFlexInputs(patch=int(patch[0]), seq_len=seq_len))


def _patch_size(model: Any) -> tuple[int, ...]:
  """The patch size of a model config or its settings (() where it names none)."""
  patches = model.get("patches") or {}
  size = patches.size if hasattr(patches, "size") else patches.get("size", ())
  return tuple(size)


def _randaug(value: Any) -> tuple[int, float] | None:
  """config.pp.randaug: None, or (layers, magnitude) with layers an int >= 0 and
  magnitude a finite number >= 0 (a list, as config.json stores it, is read alike).
  ``(None,)`` is None too: ml_collections parses ``--config.pp.randaug=None`` of the
  tuple-typed field as that one-element tuple."""
  if value is None or (isinstance(value, (tuple, list)) and list(value) == [None]):
    return None
  is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)
  if isinstance(value, (tuple, list)) and len(value) == 2:
    layers, magnitude = value
    if is_int(layers) and layers >= 0 and (is_int(magnitude) or isinstance(magnitude, float)):
      if 0 <= magnitude < float("inf"):
        return layers, float(magnitude)
  raise errors.ConfigError(
    f"config.pp.randaug={value!r} must be None (off) or (layers, magnitude): the number "
    f"of RandAugment ops per image (an int >= 0) and their strength (a number >= 0 on "
    f"big_vision's scale, 10 the usual value), e.g. --config.pp.randaug='(2, 10)'."
  )


def as_settings(settings_or_config: Any) -> Settings:
  """`Settings` as they are, or read from a run config (`Settings.from_config`)."""
  if isinstance(settings_or_config, Settings):
    return settings_or_config
  return Settings.from_config(settings_or_config)


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
