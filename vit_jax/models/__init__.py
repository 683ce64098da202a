"""Flax models of the paper: `VisionTransformer` (plain and hybrid) and its builder."""
from __future__ import annotations

from typing import Any, Optional

import jax.numpy as jnp
import ml_collections

from vit_jax.models.posemb import POSEMB_KINDS, resize_grid, sincos_2d
from vit_jax.models.variants import MODEL_NAMES, get_model_config
from vit_jax.models.vit import CLASSIFIERS, VisionTransformer


def create_model(model_config: ml_collections.ConfigDict, *, num_classes: Optional[int],
                 **overrides: Any) -> VisionTransformer:
  """Builds a `VisionTransformer` from a config in the layout of `variants.py`.

  ``overrides`` replace module attributes (e.g. ``dropout_rate=0.1``, ``scan=True``).
  """
  cfg = model_config
  t = cfg.transformer
  resnet = cfg.get("resnet")
  kwargs = dict(
      num_classes=num_classes,
      patch_size=tuple(cfg.patches.size),
      hidden_size=cfg.hidden_size,
      num_layers=t.num_layers,
      mlp_dim=t.mlp_dim,
      num_heads=t.num_heads,
      dropout_rate=t.get("dropout_rate", 0.0),
      attention_dropout_rate=t.get("attention_dropout_rate", 0.0),
      classifier=cfg.get("classifier", "token"),
      posemb=cfg.get("posemb", "learn"),
      representation_size=cfg.get("representation_size"),
      resnet_units=None if resnet is None else tuple(resnet.num_layers),
      resnet_width_factor=1.0 if resnet is None else resnet.width_factor,
      scan=cfg.get("scan", False),
      remat=cfg.get("remat", False),
      remat_policy=cfg.get("remat_policy"),
      attention_impl=cfg.get("attention_impl"),
      dtype=jnp.dtype(cfg.get("dtype", "float32")),
  )
  kwargs.update(overrides)
  return VisionTransformer(**kwargs)


__all__ = ["CLASSIFIERS", "MODEL_NAMES", "POSEMB_KINDS", "VisionTransformer", "create_model",
           "get_model_config", "resize_grid", "sincos_2d"]
