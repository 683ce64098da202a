"""The data keys of a run config as typed, checked settings (`Settings`), and what a
run's objective asks of its data (`Needs`).

`config.dataset` is a tfds name ('cifar10', 'digits', ...), 'folder:/path/to/root' or
'arrays:/path/data.npz' (in-memory arrays saved by `vit_jax.data.arrays.save_arrays`);
with free-text captions (``config.text.tokenizer``, `caption_settings`, `free_text`) a tfds
name with a text feature ('coco_captions'), 'captions:/path/to/root' or 'wds:/path/to/shards'.
This module is the only place that reads the data keys of the config, so a missing or
wrong key fails here, once, with the key's name. What the trained objective asks of the
data (captions, the image model's normalisation) comes in as `Needs`: the objective's
answer (`vit_jax.run.objectives`), never its name. The data they name is opened by
`dataset.Dataset`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

from vit_jax.data import data_config
from vit_jax.data.budget_mix import BudgetMix
from vit_jax.data.caption_settings import CaptionSettings
from vit_jax.data.naflex_images import NaFlexInputs
from vit_jax.data.train_images import TrainImages
from vit_jax.infra import errors
from vit_jax.infra.image_constants import OFFICIAL_INPUT_MEAN, OFFICIAL_INPUT_STD

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
