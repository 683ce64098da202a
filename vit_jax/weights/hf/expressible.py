"""Whether a transformers checkpoint folder describes a model this package computes.

transformers' `config.json` names its ``model_type`` and ``architectures``;
`check_transformers` decides from those, before any array is read: a model type or class
this package does not read is one `CheckpointError` naming it and what is missing.
"""

from __future__ import annotations

import os
from typing import Any

from vit_jax.infra import errors
from vit_jax.weights import files
from vit_jax.weights.hf import two_tower_table

# transformers model types with what this package's ViT lacks.
TRANSFORMERS_UNEXPRESSED = {
  "dinov3_vit": "DINOv3 in transformers' layout: import timm's copy, vit_*_dinov3",
  "dinov2": "transformers' Dinov2 layout (LayerScale, SwiGLU options): import timm's copy",
  "vit_mae": "the MAE encoder's random masking and decoder",
  "vit_msn": "transformers' ViTMSN layout",
  "eva": "EVA blocks",
  "clip_vision_model": "transformers' CLIP layout: import timm's copy",
  "siglip_vision_model": "transformers' SigLIP layout: import timm's copy",
}
TRANSFORMERS_TYPE = "vit"  # the one model_type `hf` reads
TRANSFORMERS_CLASSES = ("ViTModel", "ViTForImageClassification")
TWO_TOWER_READ = "SiglipModel, Siglip2Model and CLIPModel (both towers)"


def check_transformers(config: dict[str, Any], source: str) -> None:
  """A `CheckpointError` when a transformers ``config`` (its config.json, with a
  ``model_type``) describes a model this package does not compute."""
  model_type = config.get("model_type")
  classes = config.get("architectures") or []
  classes = classes if isinstance(classes, list) else [classes]
  if model_type in two_tower_table.ARCHITECTURES:
    return _check_two_tower_classes(str(model_type), classes, source)
  if model_type != TRANSFORMERS_TYPE:
    missing = TRANSFORMERS_UNEXPRESSED.get(str(model_type), "no reader for it")
    named = ", ".join(map(str, classes)) or "no architectures"
    raise errors.CheckpointError(
      f"{source}: transformers model_type {model_type!r} ({named}) is not computed by this "
      f"package ({missing}); it reads model_type {TRANSFORMERS_TYPE!r} "
      f"({', '.join(TRANSFORMERS_CLASSES)}) and the image-text models {TWO_TOWER_READ}."
    )
  unknown = [c for c in classes if c not in TRANSFORMERS_CLASSES]
  if unknown:
    raise errors.CheckpointError(
      f"{source}: transformers architectures {unknown} are not computed by this package "
      f"(it reads {', '.join(TRANSFORMERS_CLASSES)})."
    )


def _check_two_tower_classes(model_type: str, classes: list[Any], source: str) -> None:
  """An image-text model_type names its one two-tower class (or none)."""
  expected = two_tower_table.ARCHITECTURES[model_type]
  unknown = [c for c in classes if c != expected]
  if unknown:
    raise errors.CheckpointError(
      f"{source}: transformers architectures {unknown} of model_type {model_type!r} are "
      f"not computed by this package: it reads {expected} (both towers) as a two-tower "
      "model; a single tower's folder is not read."
    )


def check_transformers_dir(directory: str) -> None:
  """`check_transformers` of the transformers config.json in ``directory``, if there is one
  (a ``model_type`` and no timm ``architecture``)."""
  path = os.path.join(directory, files.HUB_CONFIG)
  if not os.path.isfile(path):
    return
  config = files.read_json(path)
  if "model_type" in config and "architecture" not in config:
    check_transformers(config, repr(directory))
