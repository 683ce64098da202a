"""What a run trains, by name (``config.objective``): adding one is a module and a line here.

Each objective subclasses `base.Objective`: ``model``, ``encoder`` (the
`VisionTransformer` whose parameters it trains and fine-tuning reads), ``init(rng,
images)``, ``loss(params, batch, rng)`` and ``eval_step(params, batch)``, and the optional
capabilities the run reads (``batch_fields``, ``frozen``, ``pretrained_key``,
``accuracy_metric``, ``text_len``, ``train_fields``, ``feature_cache``,
``train_flops_per_example``, ``accumulated_value_and_grad``), declared there with their
defaults and overridden by the objectives that have them. A builder takes the
`ModelSettings`, the number of classes of the data, the run's `spec.ObjectiveSettings` and
its mesh (for losses computed across it).

Each name's `Entry` also answers what the rest of the package asks of an objective (its
checks, the data it needs, whether it trains on labels): the resolver, the input
pipeline's settings (`data_settings`) and the zero-shot command ask `entry(name)`, and
nothing outside this package compares objective names.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
import ml_collections

from vit_jax.data.dataset import DatasetInfo
from vit_jax.data.settings import Needs
from vit_jax.data.settings import Settings as DataSettings
from vit_jax.infra import errors
from vit_jax.models import create_model
from vit_jax.models.settings import Settings
from vit_jax.run.objectives import classification, contrastive, masked_patches
from vit_jax.run.objectives.base import Objective


def _no_check(*args: Any) -> None:
  del args


@dataclasses.dataclass(frozen=True)
class Entry:
  """One objective: how a run builds it, and its answers about a run config, its data and
  a finished run of it."""

  # (model settings, number of classes, spec.ObjectiveSettings, mesh) -> the objective
  build: Callable[[Settings, int, Any, Optional[jax.sharding.Mesh]], Objective]
  # (config): its own checks (its config section, ...), before any data is read
  check: Callable[[ml_collections.ConfigDict], None] = _no_check
  # (config) -> what it asks of the data; a finished run whose data has captions scores
  # images against texts, with the tokenizer of its captions (`data.CaptionSettings`)
  data_needs: Callable[[ml_collections.ConfigDict], Needs] = lambda config: Needs()
  # (config, model settings, data settings, the data's DatasetInfo; None: not read)
  check_data: Callable[
    [ml_collections.ConfigDict, Settings, DataSettings, Optional[DatasetInfo]], None
  ] = _no_check
  trains_on_labels: bool = False  # what Mixup mixes with the images (config.mixup)


OBJECTIVES: dict[str, Entry] = {
  "classification": Entry(
    build=lambda model, k, s, mesh: classification.Classification(
      create_model(model, num_classes=k), s.loss, s.label_smoothing
    ),
    check_data=classification.check_data,
    trains_on_labels=True,
  ),
  "mpp": Entry(
    build=lambda model, k, s, mesh: masked_patches.MaskedPatchPrediction(model, s.options),
    check=masked_patches.check,
  ),
  "contrastive": Entry(
    build=lambda model, k, s, mesh: contrastive.Contrastive(model, s.options, mesh),
    check=contrastive.check,
    data_needs=contrastive.data_needs,
    check_data=contrastive.check_data,
  ),
}


def entry(name: str) -> Entry:
  """The `Entry` of ``config.objective``; an unknown name is one error listing them."""
  if name not in OBJECTIVES:
    raise errors.ConfigError(
      f"Unknown config.objective={name!r}; choose one of {tuple(OBJECTIVES)}."
    )
  return OBJECTIVES[name]


def data_settings(config: ml_collections.ConfigDict) -> DataSettings:
  """The data settings of a run config (or of a run's saved config: one written before
  ``objective`` existed trained a classifier, which asks nothing) with what its objective
  asks of the data."""
  name = config.get("objective")
  return DataSettings.from_config(config, entry(name).data_needs(config) if name else Needs())


def make(
  model_config: Settings,
  num_classes: int,
  settings: Any,
  mesh: Optional[jax.sharding.Mesh] = None,
) -> Objective:
  """The objective ``settings.name`` names (`spec.ObjectiveSettings`)."""
  return entry(settings.name).build(model_config, num_classes, settings, mesh)
