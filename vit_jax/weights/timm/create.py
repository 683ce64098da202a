"""Our model config of a timm architecture name alone (``vit_tiny_patch16_224``, a ``.tag``
ignored): what timm's own `create_model(name)` builds, from the arguments timm registers for
the name (`names`), by the family of its timm module (`families.for_module`). `vit_jax.create`
and `tools/timm_name_status.py` build through here."""

from __future__ import annotations

import ml_collections

from vit_jax import errors, models
from vit_jax.weights.timm import expressible, families, names


def config_from_name(name: str) -> tuple[ml_collections.ConfigDict, tuple[int, int]]:
  """(our model config, input size) of timm's architecture ``name``. A name that is not in
  the table, or that this package does not compute, is one error."""
  arch = name.split(".")[0]
  if names.registered_args(arch) is None:
    raise errors.ConfigError(
      f"{name!r} is neither a model of this package ({', '.join(models.MODEL_NAMES)}) nor a "
      f"timm ViT architecture of timm {names.timm_version()} (e.g. vit_tiny_patch16_224)."
    )
  expressible.check_timm(arch, repr(name))
  family = families.for_module(names.module(arch)) or families.VIT
  if family.config_from_name is None:
    raise errors.ConfigError(f"{name!r}: timm's {family.name} models are read from checkpoints.")
  return family.config_from_name(arch, names.model_args(arch), repr(name))
