"""Flax models of the official repository: `VisionTransformer` (plain and hybrid),
`MlpMixer`, the paper's BiT ResNet baselines (`BitResNet`), and the builder that picks one
from a config."""

from __future__ import annotations

from typing import Any, Optional, Union

import jax.numpy as jnp
import ml_collections

from vit_jax.models.bit import BIT, BitResNet, create_bit, is_bit
from vit_jax.models.execution import EXECUTION_FIELDS, ExecutionOptions
from vit_jax.models.heads import CLASSIFIERS
from vit_jax.models.mixer import MIXER, MlpMixer, create_mixer, is_mixer
from vit_jax.models.options import check_model_config, with_family_defaults
from vit_jax.models.posemb import POSEMB_KINDS, resize_grid, sincos_2d
from vit_jax.models.settings import BitSettings, MixerSettings, ModelSettings, model_settings
from vit_jax.models.variants import MODEL_NAMES, get_model_config
from vit_jax.models.vit import VisionTransformer


def create_model(
  model_config: ml_collections.ConfigDict | ModelSettings | MixerSettings | BitSettings,
  *,
  num_classes: Optional[int],
  **overrides: Any,
) -> Union[VisionTransformer, MlpMixer, BitResNet]:
  """Builds a `VisionTransformer`, an `MlpMixer` for a Mixer config (``model_type``
  'mixer') or a `BitResNet` for a BiT config ('bit'), from a config in the layout of
  `variants.py` (a ConfigDict, checked here by `model_settings`, or the settings themselves).

  ``overrides`` replace module attributes (``classifier="gap"``) or fields of its
  `ExecutionOptions` (``dropout_rate=0.1``, ``scan=True``, ``dtype=jnp.bfloat16``).
  A config saved before the later family's options existed builds the official model
  (`ModelSettings` reads each missing option at its official value).
  """
  cfg = model_settings(model_config)
  if isinstance(cfg, (MixerSettings, BitSettings)):
    execution = dict(remat=cfg.remat, remat_policy=cfg.remat_policy, dtype=jnp.dtype(cfg.dtype))
    execution.update({name: overrides.pop(name) for name in EXECUTION_FIELDS & overrides.keys()})
    create = create_mixer if isinstance(cfg, MixerSettings) else create_bit
    return create(
      cfg, num_classes=num_classes, execution=ExecutionOptions(**execution), **overrides
    )
  t = cfg.transformer
  execution = dict(
    dropout_rate=t.dropout_rate,
    attention_dropout_rate=t.attention_dropout_rate,
    attention_impl=cfg.attention_impl,
    scan=cfg.scan,
    remat=cfg.remat,
    remat_policy=cfg.remat_policy,
    stoch_depth=cfg.stoch_depth,
    dtype=jnp.dtype(cfg.dtype),
  )
  for name in EXECUTION_FIELDS & overrides.keys():
    execution[name] = overrides.pop(name)
  attributes = dict(
    num_classes=num_classes,
    patch_size=cfg.patches.size,
    hidden_size=cfg.hidden_size,
    num_layers=t.num_layers,
    mlp_dim=t.mlp_dim,
    num_heads=t.num_heads,
    classifier=cfg.classifier,
    posemb=cfg.posemb,
    gelu_approximate=cfg.gelu_approximate,
    representation_size=cfg.representation_size,
    head_bias_init=cfg.head_bias_init,
    resnet_units=None if cfg.resnet is None else cfg.resnet.num_layers,
    resnet_width_factor=1.0 if cfg.resnet is None else cfg.resnet.width_factor,
    num_registers=cfg.num_registers,
    class_token=cfg.class_token,
    posemb_patches_only=cfg.posemb_patches_only,
    norm_pre=cfg.norm_pre,
    fc_norm=cfg.fc_norm,
    layer_scale_init=cfg.layer_scale_init,
    layer_norm_epsilon=cfg.layer_norm_epsilon,
    activation=cfg.activation,
    axial=cfg.axial,
    execution=ExecutionOptions(**execution),
  )
  attributes.update(overrides)
  return VisionTransformer(**attributes)


__all__ = [
  "BIT",
  "BitResNet",
  "BitSettings",
  "CLASSIFIERS",
  "ExecutionOptions",
  "MIXER",
  "MODEL_NAMES",
  "MixerSettings",
  "MlpMixer",
  "ModelSettings",
  "POSEMB_KINDS",
  "VisionTransformer",
  "check_model_config",
  "create_model",
  "get_model_config",
  "is_bit",
  "is_mixer",
  "resize_grid",
  "sincos_2d",
  "with_family_defaults",
]
