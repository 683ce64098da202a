"""Every checkpoint format behind one registry: a typed record per format (`Format`) says
what the format answers (is a path this format, its tree and config, its preprocessing,
its tokenizer, its writer where it can be written), and `of` finds a path's record once,
trying each record's ``detect`` at most once; `locate` adds the folders an export writes
(read as their archive), the one lookup of every reader. `sources.load` and `sources.read_params`
read through the record `of` finds; `writers` writes through `for_export`'s.

The records, in the order they are tried (`FORMATS`): transformers' two-tower folders
(SigLIP, SigLIP 2, CLIP; `hf.two_tower`), transformers' ViT folders (`hf.vit`), timm
folders and `.safetensors` files (`timm/folder.py`, written by the family's timm mapping),
a folder (a run of this package or its Orbax steps; `run_checkpoint`), big_vision's
`.npz` (SigLIP, SigLIP 2, LiT, its ViTs; `big_vision`), LiT's `.npz` (`lit_npz`) and any
other file (the official `.npz`; `npz`). A new format is its module
and one record here.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional

import ml_collections

from vit_jax import models
from vit_jax.data.data_config import DataConfig
from vit_jax.infra import errors
from vit_jax.infra.aliases import Params
from vit_jax.infra.paths import CONFIG_FILE as RUN_CONFIG_FILE
from vit_jax.infra.paths import as_path
from vit_jax.models import families
from vit_jax.weights import (
  big_vision,
  exports,
  lit_npz,
  npz,
  orbax_steps,
  run_checkpoint,
)
from vit_jax.weights.hf import expressible as hf_expressible
from vit_jax.weights.hf import folder as hf_folder
from vit_jax.weights.hf import two_tower, vit
from vit_jax.weights.timm import families as timm_families
from vit_jax.weights.timm import folder as timm_folder

UNSIZED_INPUT = (224, 224)  # the data config's input size where a source says none
LABELS_FILE = "labels.txt"  # an export's class names, one a line (`writers` writes it)


@dataclasses.dataclass(frozen=True)
class Read:
  """A checkpoint as its format read it (what `sources.load` makes a `LoadedModel` of)."""

  config: models.Settings  # the model's typed settings (a reader's own, or its config read once)
  params: Params  # per-layer
  class_names: Optional[list[str]] = None  # None when the checkpoint does not name them
  image_size: Optional[tuple[int, int]] = None  # what its position embeddings were trained for
  run_config: Optional[ml_collections.ConfigDict] = None  # a training run's saved config
  data_config: Optional[DataConfig] = None  # the preprocessing stored with the arrays


# A writer: (a `sources.LoadedModel`, image_size=, class_names=, data_config=) -> what
# writes it into a folder; it raises first when the model cannot be written so.
Writer = Callable[..., Callable[[str], None]]


def _stated(path: str, read: Read) -> Optional[DataConfig]:  # pylint: disable=unused-argument
  """The preprocessing the read found stored with the arrays (None: the official recipe)."""
  return read.data_config


def _no_tokenizer(path: str, read: Read) -> None:  # pylint: disable=unused-argument
  return None


@dataclasses.dataclass(frozen=True)
class Format:
  """What one checkpoint format answers."""

  name: str
  detect: Callable[[str], bool]  # is the (local or bucket) path this format
  read: Callable[[str, Optional[str]], Read]  # (path, model_name: an `.npz`'s architecture)
  data_config: Callable[[str, Read], Optional[DataConfig]] = _stated  # its preprocessing
  tokenizer: Callable[[str, Read], Any] = _no_tokenizer  # an image-text model's, else None
  # The tree as stored, for fine-tuning, and the config where it has one; None: `read`'s
  # tree and config, checked against each other (`sources.read_params`).
  read_tree: Optional[Callable[[str], tuple[Params, Optional[models.Settings]]]] = None
  export: Optional[exports.Export] = None  # its export format where it can be written
  family: Optional[str] = None  # the one family it writes (None: any its writer takes)
  write: Optional[Writer] = None


def _directory(path: str) -> str:
  """The folder of a folder checkpoint or of a `.safetensors` file (what ``detect`` took)."""
  return hf_folder.directory(path) or path


# -------------------------------------------------------------- transformers and timm


def _stated_in_folder(
  read_data_config: Callable[[str, models.Settings, tuple[int, int]], DataConfig],
) -> Callable[[str, Read], DataConfig]:
  """The preprocessing a checkpoint's folder states (an image processor, timm's
  ``pretrained_cfg``), read by the format's ``read_data_config(directory, config, size)``."""
  return lambda path, read: read_data_config(
    _directory(path), read.config, read.image_size or UNSIZED_INPUT
  )


def _is_timm(path: str) -> bool:
  """A `.safetensors` file (not a transformers ViT's: tried before), or a folder with
  timm's `config.json` or our export's `timm_model.json`."""
  if os.path.isfile(path):
    return path.endswith(hf_folder.SAFETENSORS)
  return os.path.isdir(path) and timm_folder.is_timm_dir(path)


def _timm_writer(
  model: Any,
  *,
  image_size: tuple[int, int],
  class_names: Optional[list[str]],  # pylint: disable=unused-argument  (labels.txt: writers)
  data_config: DataConfig,
) -> Callable[[str], None]:
  """``model`` written by its timm family's record (timm's Eva for RoPE, SwiGLU, q+v biases)."""
  timm_writer = timm_families.writer_for(model.config)
  spec = timm_writer.model_spec(model.config, num_classes=model.num_classes, image_size=image_size)
  tensors = timm_writer.to_timm(model.params, model.config)
  return lambda directory: timm_folder.write_dir(directory, tensors, spec, data_config)


HF_TWO_TOWER = Format(
  name="transformers two-tower folder (SiglipModel, Siglip2Model, CLIPModel)",
  detect=two_tower.detect,
  read=lambda path, _: Read(*two_tower.read(path)),
  data_config=_stated_in_folder(two_tower.read_data_config),
  tokenizer=lambda path, _: two_tower.read_tokenizer(path),
  export=exports.HF,
  family=families.TWO_TOWER.name,
  write=two_tower.writer,
)
HF_VIT = Format(
  name="transformers ViT folder (ViTForImageClassification, ViTModel)",
  detect=vit.detect,
  read=lambda path, _: Read(*vit.read(path)),
  data_config=_stated_in_folder(vit.read_data_config),
  export=exports.HF,
  write=vit.writer,
)
TIMM = Format(
  name="timm folder or .safetensors",
  detect=_is_timm,
  read=lambda path, _: Read(*timm_folder.read(path)),
  data_config=_stated_in_folder(timm_folder.read_data_config),
  export=exports.TIMM,
  write=_timm_writer,
)

# ------------------------------------------------------------ runs and `.npz` files


def _read_run(path: str, model_name: Optional[str]) -> Read:  # pylint: disable=unused-argument
  config, params, names, crop, run_config = run_checkpoint.read(path)
  data_config = run_checkpoint.eval_data_config(run_config)
  return Read(config, params, names, (crop, crop), run_config, data_config)


def _npz_tree(path: str) -> tuple[Params, None]:
  """An `.npz` tree as stored (either encoder layout), with no config."""
  return npz.load_npz(path), None


def _read_npz(path: str, model_name: Optional[str]) -> Read:
  config, params, size, data_config = npz.read(path, model_name)
  return Read(config, params, None, size, data_config=data_config)


def _read_lit(path: str, model_name: Optional[str]) -> Read:
  """A LiT `.npz`; with ``model_name`` the official layout of that name (as any `.npz`)."""
  if model_name:
    return _read_npz(path, model_name)
  config, params, size = lit_npz.read_file(path)
  return Read(config, params, None, size)


def _read_big_vision(path: str, model_name: Optional[str]) -> Read:
  """A big_vision `.npz`; with ``model_name`` refused (its names are not the official ones)."""
  if model_name:
    raise errors.CheckpointError(
      f"{path!r} is a big_vision checkpoint, whose architecture is read from its arrays: "
      f"leave out the model name {model_name!r}."
    )
  config, params, size = big_vision.read(path)
  return Read(config, params, None, size)


RUN = Format(
  name="run folder (this package's Orbax steps)",
  detect=run_checkpoint.detect,
  read=_read_run,
  tokenizer=lambda path, read: run_checkpoint.run_tokenizer(read.run_config, read.class_names),
  read_tree=lambda path: (orbax_steps.read_params(path), None),  # no config.json needed
)
LIT_NPZ = Format(
  name="LiT .npz",
  detect=lit_npz.detect,
  read=_read_lit,
  tokenizer=lambda path, read: lit_npz.read_tokenizer(path),
  read_tree=_npz_tree,
)
BIG_VISION = Format(
  name="big_vision .npz (SigLIP, SigLIP 2, LiT, ViT)",
  detect=big_vision.detect,
  read=_read_big_vision,
  tokenizer=lambda path, read: big_vision.read_tokenizer(path, read.config),
  read_tree=big_vision.read_tree,
  export=exports.BIG_VISION,
  write=big_vision.writer,
)
NPZ = Format(
  name="official .npz",
  detect=lambda path: as_path(path).is_file(),
  read=_read_npz,
  tokenizer=lambda path, read: npz.read_tokenizer(path, read.config),
  read_tree=_npz_tree,
  export=exports.NPZ,
  write=npz.writer,
)

FORMATS: tuple[Format, ...] = (HF_TWO_TOWER, HF_VIT, TIMM, RUN, BIG_VISION, LIT_NPZ, NPZ)


@dataclasses.dataclass(frozen=True)
class Located:
  """A checkpoint found (`locate`): the path its format reads, and the class names file
  of the export folder it was found in (None: not an export folder)."""

  path: str
  format: Format
  labels: Optional[str] = None


def find(path: str) -> Optional[Format]:
  """The format of the checkpoint at ``path`` (a local path or a bucket's), or None; a
  transformers class this package does not compute is refused here, by name."""
  directory = hf_folder.directory(path)
  if directory is not None:
    hf_expressible.check_transformers_dir(directory)
  return next((f for f in FORMATS if f.detect(path)), None)


def locate(path: str) -> Optional[Located]:
  """The checkpoint at ``path`` (local or a bucket's), or None: the one lookup of
  `sources.load`, `vit_jax.load` and every command. A folder an npz or big_vision export
  wrote (`Model.save`, ``vit_jax.export``: `npz.EXPORT_FILE`, no run's config.json, no
  transformers or timm files) is its `npz.EXPORT_FILE`; a folder's `LABELS_FILE` (an
  export's class names) comes with it."""
  found = find(path)
  folder = as_path(path)
  labels = folder / LABELS_FILE
  named = os.fspath(labels) if labels.is_file() else None
  if found is None or found is RUN:
    export = folder / npz.EXPORT_FILE
    if export.is_file() and not (folder / RUN_CONFIG_FILE).exists():
      inner = find(os.fspath(export))
      return None if inner is None else Located(os.fspath(export), inner, named)
  return None if found is None else Located(path, found, named)


def of(path: str) -> Located:
  """`locate`'s checkpoint; nothing at ``path`` is one error naming what is read."""
  found = locate(path)
  if found is None:
    raise errors.MissingError(
      f"No checkpoint at {path!r}: pass an official-layout .npz, a "
      "training run's workdir (or its checkpoints/ or a step folder), "
      "a Hugging Face or timm checkpoint (folder or .safetensors), hf-hub:<org>/<name> "
      "or an official name such as ViT-B_16."
    )
  return found


def for_export(export: exports.Export, family: families.Family) -> Optional[Format]:
  """The format a model of ``family`` is written as for ``export`` (`exports.EXPORTS`);
  None for the serving formats, which are not checkpoints."""
  return next((f for f in FORMATS if f.export is export and f.family in (None, family.name)), None)
