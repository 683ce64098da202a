"""The timm family registry: one typed, frozen `TimmFamily` record per family of timm models
this package reads or writes (the ViT with its hybrids and DeiT, Eva, NaFlexViT, the
MLP-Mixer, BiT), holding what code outside the family's own module asks of it: the timm
modules registering its architecture names, the array that tells its state dict, its reader,
its config from a name alone, what of a registered name it does not compute, and its writer.

`for_checkpoint` picks the family that reads a state dict, `for_module` the family of an
architecture name's timm module, `writer_for` the write side of the family that writes one
of our models; `expressible.py` here words its refusals from the records. A new family is one
module and one record here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import ml_collections
import numpy as np

from vit_jax import models
from vit_jax.infra import errors
from vit_jax.infra.aliases import Params
from vit_jax.models import families as model_families
from vit_jax.weights.timm import arguments, bit, eva, eva_config, mixer, naflex, vit, vit_config

Config = models.Settings | ml_collections.ConfigDict  # what a writer is given
# (architecture name, its registered arguments, the source named in errors) -> (settings, size)
NameReader = Callable[[str, dict[str, Any], str], tuple[models.Settings, tuple[int, int]]]
# (config, num_classes=, image_size=) -> {'architecture', 'model_name', 'kwargs', ...}
SpecWriter = Callable[..., dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class TimmWriter:
  """A family's write side: whether it writes a model of our config (``writes``), the
  export's `timm_model.json` (``model_spec``) and timm's state dict (``to_timm``)."""

  writes: Callable[[Config], bool]
  model_spec: SpecWriter
  to_timm: Callable[[Params, Config], dict[str, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class TimmFamily:
  """What the code outside a timm family's module needs to know about it.

  ``modules``: timm's modules registering its architecture names (`names.module`).
  ``read``: its reader, a state dict and the arguments read beside it -> our settings and
  parameters, of our model family ``model_family``. ``stem``: the array only its state
  dicts hold (None: told by its name's module alone). ``config_from_name``: our settings
  of one of its names alone (None: read from checkpoints only). ``unexpressed``:
  ``key=value`` of what a registered name has and this package does not compute (None: its
  reader checks), worded by ``refusal`` (formatted with ``module`` and ``missing``).
  ``prefixes``: the name prefixes read where timm's table does not hold the name;
  ``reads``: the family in the words of the refusal of a name never seen. ``writer``: its
  write side (None: never written).
  """

  name: str
  modules: tuple[str, ...]
  read: Callable[[arguments.Checkpoint], arguments.Loaded]
  model_family: model_families.Family
  stem: Optional[str] = None
  config_from_name: Optional[NameReader] = None
  unexpressed: Optional[Callable[[str], list[str]]] = None
  refusal: str = "(timm {module}.py) has {missing}, which this package does not compute."
  prefixes: tuple[str, ...] = ()
  reads: str = ""
  writer: Optional[TimmWriter] = None


def _is_vit(config: Config) -> bool:
  """Whether ``config`` is of our ViT family (`models.is_mixer` and `is_bit` for the rest)."""
  return models.family_of(config) is model_families.VIT


VIT = TimmFamily(
  name="vit",
  modules=vit_config.MODULES,
  read=vit_config.read,
  model_family=model_families.VIT,
  config_from_name=vit_config.config_from_name,
  prefixes=("vit", "deit", "deit3", "flexivit"),
  reads="vit_*, deit*, flexivit_*",
  writer=TimmWriter(
    lambda c: _is_vit(c) and not eva_config.is_eva(c) and not naflex.writes(c),
    vit.model_spec,
    vit.to_timm,
  ),
)
EVA = TimmFamily(
  name="eva",
  modules=(eva_config.MODULE,),
  read=eva.read,
  model_family=model_families.VIT,
  config_from_name=eva_config.config_from_name,
  unexpressed=eva_config.unexpressed,
  prefixes=("eva02", "eva"),
  reads="eva.py's DINOv3, EVA-02, Perception Encoder and RoPE-ViT",
  writer=TimmWriter(lambda c: _is_vit(c) and eva_config.is_eva(c), eva.model_spec, eva.to_timm),
)
NAFLEX = TimmFamily(
  name="naflex",
  modules=(naflex.MODULE,),
  read=naflex.read,
  model_family=model_families.VIT,
  config_from_name=naflex.config_from_name,
  unexpressed=naflex.unexpressed,
  refusal=("(timm {module}.py) has {missing}, which this package does not compute."),
  reads="naflexvit.py's NaFlexViT (square images and NaFlex inputs)",
  writer=TimmWriter(lambda c: _is_vit(c) and naflex.writes(c), naflex.model_spec, naflex.to_timm),
)
MIXER = TimmFamily(
  name="mixer",
  modules=(mixer.MODULE,),
  read=mixer.read,
  model_family=model_families.MIXER,
  stem=mixer.STEM,
  config_from_name=mixer.config_from_name,
  unexpressed=mixer.unexpressed,
  refusal=(
    "(timm {module}.py) has {missing}, which this package does not compute (it computes "
    "the MLP-Mixer of mixer_*)."
  ),
  prefixes=("mixer",),
  reads="mixer_*",
  writer=TimmWriter(models.is_mixer, mixer.model_spec, mixer.to_timm),
)
BIT = TimmFamily(
  name="bit",
  modules=(bit.MODULE,),
  read=bit.read,
  model_family=model_families.BIT,
  stem=bit.STEM,
  prefixes=("resnetv2",),
  reads="resnetv2_* (BiT)",
  writer=TimmWriter(models.is_bit, bit.model_spec, bit.to_timm),
)
FAMILIES = (VIT, EVA, NAFLEX, MIXER, BIT)


def for_module(module: Optional[str]) -> Optional[TimmFamily]:
  """The family whose architectures timm's ``module`` registers, or None."""
  return next((f for f in FAMILIES if module in f.modules), None)


def for_checkpoint(module: Optional[str], tensors: dict[str, Any]) -> TimmFamily:
  """The family that reads a state dict: the one whose stem array it holds, else the one of
  its architecture name's timm ``module``, else the ViT (a state dict no name describes)."""
  by_stem = next((f for f in FAMILIES if f.stem is not None and f.stem in tensors), None)
  return by_stem or for_module(module) or VIT


def writer_for(config: Config) -> TimmWriter:
  """The write side of the family that writes a model of our ``config``."""
  writers = (f.writer for f in FAMILIES if f.writer is not None)
  writer = next((w for w in writers if w.writes(config)), None)
  if writer is None:  # an image-text model: its image tower is written
    raise errors.ConfigError(f"No timm family writes a {config.get('name', 'model')!r} model.")
  return writer


def named_by_prefix(name: str) -> bool:
  """Whether an architecture ``name`` is of a family read by its prefix (``vit_...``)."""
  return any(name.startswith(p + "_") for f in FAMILIES for p in f.prefixes)


def read_families() -> str:
  """What the families read, in words: 'a, b and c'."""
  described = [f.reads for f in FAMILIES if f.reads]
  return ", ".join(described[:-1]) + " and " + described[-1]
