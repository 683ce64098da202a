"""How a checkpoint's images are prepared for evaluation: one typed `DataConfig`, read from
timm's ``pretrained_cfg``, a transformers image processor config, the official recipe or a
run's config, and written back in those formats by the exports.

The geometry follows timm's eval transform (`timm.data.transforms_imagenet_eval`): the
image is resized so that the model's input is ``crop_pct`` of it (``floor(size /
crop_pct)``), then the input is cut from its centre. ``crop_mode`` says how the resize
treats the aspect ratio: 'center' scales the shortest edge (aspect kept, the sides lost),
'squash' scales each edge apart (aspect not kept, nothing lost at crop_pct 1) and 'border'
scales the longest edge and pads the rest with the mean colour. ``resizer`` says which
library resizes: 'pil' (antialiased, as timm and transformers do) or 'tf' (TensorFlow's
resize without antialiasing, big_vision's and the official recipe: only the whole image).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional

from vit_jax.infra import errors
from vit_jax.infra.image_constants import (
  IMAGENET_MEAN,
  IMAGENET_STD,
  OFFICIAL_INPUT_MEAN,
  OFFICIAL_INPUT_STD,
)

RGB = tuple[float, float, float]
# Interpolation names (timm's) -> PIL's resample codes (transformers' ``resample``).
PIL_RESAMPLE = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}
TF_METHODS = ("nearest", "bilinear", "bicubic", "lanczos3", "area")  # tf.image.resize's
CROP_MODES = ("center", "squash", "border")
CROP_OFFSETS = ("round", "floor")
RESIZERS = ("pil", "tf")
# timm's defaults where a pretrained_cfg leaves a key out (`timm.data.resolve_data_config`).
TIMM_CROP_PCT = 0.875
TIMM_INTERPOLATION = "bicubic"
TIMM_CROP_MODE = "center"
# A run's optional pp keys (beside pp.crop and the model's mean/std).
_RUN_KEYS = ("crop_pct", "crop_mode", "interpolation", "resizer", "crop_offset")


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The eval preprocessing of a model's inputs (defaults: the official recipe's)."""

  input_size: tuple[int, int]  # (height, width) of the model's input
  crop_pct: float = 1.0  # the input's share of the resized image, per edge
  interpolation: str = "bilinear"
  crop_mode: str = "squash"
  mean: RGB = OFFICIAL_INPUT_MEAN  # per RGB channel, on the 0..1 scale
  std: RGB = OFFICIAL_INPUT_STD
  resizer: str = "tf"
  # The centre crop's offset (h - H) / 2 when odd: 'round' half to even (torchvision's,
  # timm's) or 'floor' (transformers' image processors).
  crop_offset: str = "round"

  def __post_init__(self) -> None:
    size = tuple(self.input_size)
    object.__setattr__(self, "input_size", size)
    object.__setattr__(self, "mean", _rgb(self.mean, "mean"))
    object.__setattr__(self, "std", _rgb(self.std, "std"))
    problems = []
    if len(size) != 2 or not all(isinstance(v, int) and v > 0 for v in size):
      problems.append(f"input_size={size!r} (two positive integers, height and width)")
    if not (isinstance(self.crop_pct, (int, float)) and 0 < self.crop_pct <= 2):
      problems.append(f"crop_pct={self.crop_pct!r} (a fraction in (0, 2], 1.0: no crop)")
    if self.crop_mode not in CROP_MODES:
      problems.append(f"crop_mode={self.crop_mode!r} (one of {', '.join(CROP_MODES)})")
    if self.crop_offset not in CROP_OFFSETS:
      problems.append(f"crop_offset={self.crop_offset!r} (one of {', '.join(CROP_OFFSETS)})")
    if self.resizer not in RESIZERS:
      problems.append(f"resizer={self.resizer!r} (one of {', '.join(RESIZERS)})")
    methods = PIL_RESAMPLE if self.resizer == "pil" else TF_METHODS
    if self.interpolation not in methods:
      problems.append(
        f"interpolation={self.interpolation!r} (with resizer {self.resizer!r}: one of "
        f"{', '.join(methods)})"
      )
    if self.resizer == "tf" and not self.whole_image:
      problems.append(
        f"resizer='tf' with crop_pct={self.crop_pct} and crop_mode={self.crop_mode!r} (the "
        "TensorFlow resizer takes the whole image only: use resizer='pil' for a crop)"
      )
    if any(s <= 0 for s in self.std):
      problems.append(f"std={self.std!r} (positive numbers)")
    if problems:
      raise errors.ConfigError("Invalid data config: " + "; ".join(problems) + ".")

  @property
  def whole_image(self) -> bool:
    """Whether the input is the whole image resized to input_size (no crop, no pad)."""
    return self.crop_mode == "squash" and self.crop_pct == 1.0

  @property
  def scale_size(self) -> tuple[int, int]:
    """The size the resize aims at before the centre crop: floor(input / crop_pct)."""
    return tuple(math.floor(s / self.crop_pct) for s in self.input_size)

  def at_size(self, input_size: tuple[int, int]) -> DataConfig:
    """The same recipe for another input size (a model run at another resolution)."""
    return dataclasses.replace(self, input_size=tuple(input_size))

  def to_dict(self) -> dict[str, Any]:
    """JSON-ready fields (`from_dict` reads them back)."""
    fields = dataclasses.asdict(self)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}

  def to_timm(self) -> dict[str, Any]:
    """The data keys of timm's ``pretrained_cfg`` (what `resolve_data_config` reads).
    timm resizes with PIL: a 'tf' config is written with its interpolation, antialiased."""
    return {
      "input_size": [3, *self.input_size],
      "interpolation": self.interpolation if self.interpolation in PIL_RESAMPLE else "bilinear",
      "crop_pct": self.crop_pct,
      "crop_mode": self.crop_mode,
      "mean": list(self.mean),
      "std": list(self.std),
    }

  def to_hf_processor(self) -> dict[str, Any]:
    """A transformers ``preprocessor_config.json``: `ViTImageProcessor` (resize to the
    input size) for the whole image, `BitImageProcessor` (shortest edge, centre crop)
    for crop_mode 'center'; 'squash' or 'border' with a crop has no processor."""
    if not self.whole_image and self.crop_mode != "center":
      raise errors.ConfigError(
        f"crop_mode={self.crop_mode!r} with crop_pct={self.crop_pct} has no transformers "
        "image processor (they resize the whole image or crop the centre after a "
        "shortest-edge resize): export to timm, or use crop_mode 'center'."
      )
    height, width = self.input_size
    common = {
      "do_resize": True,
      "resample": PIL_RESAMPLE.get(self.interpolation, PIL_RESAMPLE["bilinear"]),
      "do_rescale": True,
      "rescale_factor": 1 / 255,
      "do_normalize": True,
      "image_mean": list(self.mean),
      "image_std": list(self.std),
    }
    if self.whole_image:
      size = {"height": height, "width": width}
      return {"image_processor_type": "ViTImageProcessor", "size": size, **common}
    if height != width:
      raise errors.ConfigError(
        f"A centre crop to a non-square input {self.input_size} has no transformers image "
        "processor (the shortest edge is resized to one number): export to timm."
      )
    return {
      "image_processor_type": "BitImageProcessor",
      "size": {"shortest_edge": self.scale_size[0]},
      "do_center_crop": True,
      "crop_size": {"height": height, "width": width},
      "do_convert_rgb": True,
      **common,
    }


def official(
  input_size: tuple[int, int], mean: RGB = OFFICIAL_INPUT_MEAN, std: RGB = OFFICIAL_INPUT_STD
) -> DataConfig:
  """The official recipe (big_vision's ``resize|value_range(-1, 1)``): the whole image,
  TensorFlow's bilinear resize; ``mean``/``std`` those of the weights."""
  return DataConfig(tuple(input_size), mean=mean, std=std)


def from_dict(fields: Mapping[str, Any], source: str) -> DataConfig:
  """`DataConfig.to_dict`'s output back; anything else is one error naming ``source``."""
  names = {f.name for f in dataclasses.fields(DataConfig)}
  if not isinstance(fields, Mapping) or not set(fields) <= names or "input_size" not in fields:
    raise errors.CheckpointError(
      f"{source}: the data config {fields!r} is not an object with input_size and some of "
      f"{', '.join(sorted(names))}: write it again with the model."
    )
  return DataConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def from_timm(pretrained_cfg: Mapping[str, Any], input_size: tuple[int, int]) -> DataConfig:
  """timm's ``pretrained_cfg`` with `resolve_data_config`'s defaults for the keys it leaves
  out, except the input size: the model's (``input_size``) where the config has none."""
  size = pretrained_cfg.get("input_size")
  size = tuple(size[1:]) if isinstance(size, (list, tuple)) and len(size) == 3 else input_size
  return DataConfig(
    tuple(int(s) for s in size),
    crop_pct=pretrained_cfg.get("crop_pct") or TIMM_CROP_PCT,
    interpolation=pretrained_cfg.get("interpolation") or TIMM_INTERPOLATION,
    crop_mode=pretrained_cfg.get("crop_mode") or TIMM_CROP_MODE,
    mean=pretrained_cfg.get("mean") or IMAGENET_MEAN,
    std=pretrained_cfg.get("std") or IMAGENET_STD,
    resizer="pil",
  )


def from_hf_processor(
  processor: Mapping[str, Any], input_size: tuple[int, int], source: str
) -> DataConfig:
  """A transformers image processor config: ``size`` {height, width} resizes the whole
  image (ViT, SigLIP); {shortest_edge} then ``crop_size`` is a centre crop (CLIP, BiT,
  DINOv2); without a crop it is read as one to a square of that edge (transformers would
  keep the aspect; the model takes one size). A processor that does not resize takes
  ``input_size`` as its resize target."""
  interpolation = {v: k for k, v in PIL_RESAMPLE.items()}.get(processor.get("resample", 2))
  if interpolation is None:
    raise errors.CheckpointError(
      f"{source}: resample {processor.get('resample')!r} is not a PIL filter "
      f"({', '.join(f'{v} {k}' for k, v in PIL_RESAMPLE.items())})."
    )
  if processor.get("do_normalize", True):
    mean = processor.get("image_mean", OFFICIAL_INPUT_MEAN)
    std = processor.get("image_std", OFFICIAL_INPUT_STD)
  else:
    mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
  size = _hw(processor.get("size"), source) if processor.get("do_resize", True) else None
  crop = _hw(processor.get("crop_size"), source) if processor.get("do_center_crop") else None
  common = dict(interpolation=interpolation, mean=mean, std=std, resizer="pil", crop_offset="floor")
  if isinstance(size, int):  # shortest edge, then (if asked) the centre crop
    crop = crop or (size, size)
    if crop[0] != crop[1]:
      raise errors.CheckpointError(f"{source}: a non-square crop_size {crop} is not read.")
    return DataConfig(crop, crop_pct=crop[0] / size, crop_mode="center", **common)
  if crop is not None:
    raise errors.CheckpointError(
      f"{source}: a centre crop after a resize to height and width is not read: "
      "use size {'shortest_edge': N}."
    )
  return DataConfig(size or tuple(input_size), **common)


def _hw(value: Any, source: str) -> Optional[int | tuple[int, int]]:
  """An HF size: {height, width} -> (h, w); {shortest_edge} or a number -> that edge."""
  if isinstance(value, Mapping) and {"height", "width"} <= set(value):
    return int(value["height"]), int(value["width"])
  if isinstance(value, Mapping) and "shortest_edge" in value:
    return int(value["shortest_edge"])
  if isinstance(value, int) and not isinstance(value, bool):
    return value
  if value is None:
    return None
  raise errors.CheckpointError(
    f"{source}: image size {value!r} is not {{height, width}}, {{shortest_edge}} or a number."
  )


def from_run_config(
  config: Mapping[str, Any], model: Optional[Mapping[str, Any]] = None
) -> DataConfig:
  """A run's eval preprocessing: ``pp.crop`` and the mean/std of ``model`` (None:
  ``config.model``; a two-tower run's image tower), with the official recipe unless ``pp``
  sets crop_pct, crop_mode, interpolation, resizer or crop_offset (then PIL's antialiased
  resize unless it says resizer='tf')."""
  pp = config.get("pp") or {}
  if model is None:
    model = config.get("model") or {}
  mean = tuple(model.get("input_mean", OFFICIAL_INPUT_MEAN))
  std = tuple(model.get("input_std", OFFICIAL_INPUT_STD))
  given = {k: pp[k] for k in _RUN_KEYS if pp.get(k) is not None}
  crop = int(pp["crop"])
  return with_run_keys(official((crop, crop), mean, std), given, "config.pp")


def with_run_keys(base: DataConfig, given: Mapping[str, Any], where: str) -> DataConfig:
  """``base`` with the run's optional pp keys ``given`` (crop_pct, crop_mode, interpolation,
  resizer, crop_offset): PIL's antialiased resize unless they say resizer='tf' where
  ``base`` is the official recipe (TensorFlow's resize takes the whole image only). One
  error line naming ``where`` for a key or value it does not take."""
  unknown = sorted(set(given) - set(_RUN_KEYS))
  if unknown:
    raise errors.ConfigError(f"{where} has unknown keys {unknown}: use only {_RUN_KEYS}.")
  if not given:
    return base
  start = {"resizer": "pil"} if base == official(base.input_size, base.mean, base.std) else {}
  try:
    return dataclasses.replace(base, **{**start, **given})
  except errors.ConfigError as e:
    raise errors.ConfigError(f"{where}: {e} Fix the keys named.") from None


def to_run_pp(config: DataConfig) -> dict[str, Any]:
  """The ``config.pp`` keys of a run whose evaluation prepares images as ``config`` does
  (`from_run_config` reads them back, with ``pp.crop`` and the model's mean/std): none for
  the official recipe, else every key it reads. A run fine-tuned from a checkpoint keeps
  the checkpoint's preprocessing through them (`vit_jax.api.fine_tune`)."""
  if config == official(config.input_size, config.mean, config.std):
    return {}
  return {key: getattr(config, key) for key in _RUN_KEYS}


def _rgb(value: Any, name: str) -> RGB:
  values = tuple(value) if isinstance(value, (list, tuple)) else (value,) * 3
  if len(values) != 3 or not all(
    isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
  ):
    raise errors.ConfigError(f"Invalid data config: {name}={value!r} (three numbers, RGB).")
  return tuple(float(v) for v in values)
