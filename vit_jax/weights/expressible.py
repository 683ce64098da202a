"""Whether a checkpoint's own description names a model this package computes.

The arrays alone cannot tell: a model whose position embeddings are computed rather than
stored (rotary embeddings) leaves no array over, so a reader that maps the arrays it
knows would load it and compute something else. A checkpoint says what it is: timm's
`config.json` names its ``architecture`` (our export's `timm_model.json` its
``model_name``), transformers' its ``model_type`` and ``architectures``. `check_timm` and
`check_transformers` decide from those, before any array is read: a family this package
does not express, or a name it has never seen, is one `CheckpointError` naming it and
what is missing.
"""

from __future__ import annotations

import os
from typing import Any

from vit_jax import errors
from vit_jax.weights import files
from vit_jax.weights.timm import families, names

# timm modules (`names.module`) whose models this package does not compute: the family
# and what it has that ours lacks. A name of a module a timm family reads is checked by
# that family's record (`families.TimmFamily.unexpressed`).
TIMM_MODULES_UNEXPRESSED = {
  "vision_transformer_relpos": (
    "a relative-position ViT",
    "a relative position bias per block (timm's RelPosMlp/RelPosBias)",
  ),
  "vision_transformer_sam": (
    "SAM's image encoder",
    "windowed attention with decomposed relative positions, and the convolutional neck",
  ),
  "beit": ("BEiT", "a relative position bias table per block"),
  "cait": ("CaiT", "talking-heads attention and class-attention blocks"),
  "convit": ("ConViT", "gated positional self-attention"),
  "crossvit": ("CrossViT", "two patch-size branches joined by cross-attention"),
  "xcit": ("XCiT", "cross-covariance attention, local patch interaction and a conv stem"),
  "deepseek_vit": ("DeepSeek's ViT", "RMSNorm, a bias-free SwiGLU and axial RoPE"),
  "gemma4_vit": ("Gemma 4's ViT", "2D RoPE, q/k normalisation and four norms per block"),
  "qwen3_vit": ("Qwen3's ViT", "axial RoPE beside a resampled absolute table"),
}
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


def check_timm(name: str, source: str) -> None:
  """A `CheckpointError` when timm architecture ``name`` (a pretrained tag after a dot is
  ignored; "" names nothing) is not a model this package computes."""
  base = name.split(".")[0]
  if not base:
    return
  module = names.module(base)
  family = families.for_module(module)
  if family is not None:
    missing = family.unexpressed(base) if family.unexpressed is not None else []
    if missing:
      refusal = family.refusal.format(module=module, missing=", ".join(missing))
      raise errors.CheckpointError(f"{source}: timm architecture {name!r} {refusal}")
    return
  if module in TIMM_MODULES_UNEXPRESSED:
    what, missing = TIMM_MODULES_UNEXPRESSED[module]
    raise errors.CheckpointError(
      f"{source}: timm architecture {name!r} is {what} (timm {module}.py), which this "
      f"package does not compute: it has {missing}."
    )
  if module is None and not families.named_by_prefix(base):
    raise errors.CheckpointError(
      f"{source}: timm architecture {name!r} is none this package computes (it reads "
      f"timm's {families.read_families()} models)."
    )


def check_transformers(config: dict[str, Any], source: str) -> None:
  """A `CheckpointError` when a transformers ``config`` (its config.json, with a
  ``model_type``) describes a model this package does not compute."""
  from vit_jax.weights.hf import two_tower_table  # pylint: disable=g-import-not-at-top

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
  from vit_jax.weights.hf import two_tower_table  # pylint: disable=g-import-not-at-top

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
  path = os.path.join(directory, "config.json")
  if not os.path.isfile(path):
    return
  config = files.read_json(path)
  if "model_type" in config and "architecture" not in config:
    check_transformers(config, repr(directory))
