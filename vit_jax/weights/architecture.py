"""A model's architecture read off the shapes of an official-layout parameter tree.

Official `.npz` files carry no config. Each family's record (`models.families`) tells its
trees apart by a parameter path of its own (the Mixer's ``stem``, the BiT's
``root_block``; the ViT is the rest) and reads its shapes: `models.vit_shapes` for the
ViT (plain, hybrid, Axial-ViT and the later family's options), `models.mixer` and
`models.bit` for theirs. Here: the one entry for every reader, and the official name of
an architecture.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import flax.linen as nn
import ml_collections
import numpy as np
from flax import traverse_util

from vit_jax import models
from vit_jax.models import families, vit_shapes

POSEMB = vit_shapes.POSEMB
POSEMB_X = vit_shapes.POSEMB_X
POSEMB_Y = vit_shapes.POSEMB_Y
LAYER_SCALE_INIT = vit_shapes.LAYER_SCALE_INIT


def _shapes(params: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
  flat = traverse_util.flatten_dict(nn.unbox(dict(params)), sep="/")
  return {k: tuple(np.shape(v)) for k, v in flat.items()}


def family(params: Mapping[str, Any]) -> families.Family:
  """The family whose parameter tree ``params`` is."""
  return families.family_of_shapes(_shapes(params))


def _official_name(config: ml_collections.ConfigDict) -> Optional[str]:
  """The registered variant with this architecture, if any."""

  def arch(c: ml_collections.ConfigDict) -> tuple:
    kind = families.family_of(c)
    return kind.name, kind.architecture_key(c)

  target = arch(config)
  same = [n for n in models.MODEL_NAMES if arch(models.get_model_config(n)) == target]
  # Variants that share an architecture (gap-norep and ViT, SigLIP and ViT-B/16, ...)
  # differ in what the shapes also show: pooling, registers, norms, LayerScale.
  visible = vit_shapes.visible_options
  alike = [n for n in same if visible(models.get_model_config(n)) == visible(config)]
  return (alike or same or [None])[0]


def describe(params: Mapping[str, Any]) -> dict[str, Any]:
  """What the shapes say of the model, each None where they do not say it (a ViT: patch
  size, input channels, width, depth, heads, MLP dim, position embedding, ResNet root; a
  Mixer: patch size, input channels, width, depth, patches, token and channel MLP dims; a
  BiT: stages, units per stage, width factor)."""
  shapes = _shapes(params)
  return families.family_of_shapes(shapes).describe_shapes(shapes)


def infer_settings(params: Mapping[str, Any]) -> models.Settings:
  """The model settings that ``params`` were made for (checked: `models.model_settings`).

  Their ``name`` is the official variant's when the architecture is one, else 'custom'.
  Raises one CheckpointError naming everything that cannot be read from the shapes.
  """
  shapes = _shapes(params)
  family = families.family_of_shapes(shapes)
  template = models.variant_settings(family.template)
  settings = family.settings_from_shapes(shapes, template)
  return settings.replace(name=_official_name(settings) or "custom")


def num_prefix_rows(config: ml_collections.ConfigDict) -> int:
  """Rows of the learned 1-D position table before the grid's: the prefix tokens', unless
  the table covers the patches only (any family: a Mixer or a BiT has none)."""
  if config.get("posemb_patches_only", False):
    return 0
  return models.create_model(config, num_classes=None).num_prefix_tokens


def num_classes(params: Mapping[str, Any]) -> Optional[int]:
  """The head's class count; None for a checkpoint without a head."""
  head = _shapes(params).get("head/kernel")
  return head[-1] if head else None


def trained_image_size(
  params: Mapping[str, Any], config: ml_collections.ConfigDict
) -> Optional[tuple[int, int]]:
  """The (height, width) the parameters fix: a ViT's learned position embeddings (a 1-D
  table is taken to be a square grid), a Mixer's token-mixing MLP; None where nothing
  fixes it."""
  shapes = _shapes(params)
  grid = families.family_of_shapes(shapes).trained_grid(shapes, config)
  if grid is None:
    return None
  stride = models.create_model(config, num_classes=None).input_stride
  return grid[0] * stride[0], grid[1] * stride[1]
