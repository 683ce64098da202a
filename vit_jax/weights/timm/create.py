"""Our model settings of a timm architecture name alone (``vit_tiny_patch16_224``, a ``.tag``
ignored): what timm's own `create_model(name)` builds, from the arguments timm registers for
the name (`names`), by the family of its timm module (`families.for_module`). `vit_jax.create`
and `tools/timm_name_status.py` build through here."""

from __future__ import annotations

import difflib

from vit_jax import models
from vit_jax.infra import errors
from vit_jax.weights.timm import expressible, families, names


def check_name(name: str) -> None:
  """``name`` (a ``.tag`` ignored) is a timm architecture; else one error with the closest
  names of timm's and of this package's models."""
  arch = name.split(".")[0]
  if names.registered_args(arch) is not None:
    return
  close = difflib.get_close_matches(arch, [*models.MODEL_NAMES, *names.names()], n=3)
  raise errors.ConfigError(
    f"{name!r} is neither a model of this package nor a timm architecture of timm "
    f"{names.timm_version()}"
    + (f"; did you mean {' or '.join(close)}?" if close else " (e.g. vit_tiny_patch16_224).")
  )


def config_from_name(name: str) -> tuple[models.Settings, tuple[int, int]]:
  """(our model settings, input size) of timm's architecture ``name``. A name that is not in
  the table, or that this package does not compute, is one error."""
  check_name(name)
  arch = name.split(".")[0]
  expressible.check_timm(arch, repr(name))
  family = families.for_module(names.module(arch)) or families.VIT
  if family.config_from_name is None:
    raise errors.ConfigError(f"{name!r}: timm's {family.name} models are read from checkpoints.")
  return family.config_from_name(arch, names.model_args(arch), repr(name))
