"""What a run trains, by name (``config.objective``): adding one is a module and a line here.

Each objective has ``model``, ``encoder`` (the `VisionTransformer` whose parameters it
trains and fine-tuning reads), ``init(rng, images)``, ``loss(params, batch, rng)`` (the
mean over the batch, for `steps.train_step`) and ``eval_step(params, batch)`` (sums for
`evaluators.test_split`). A builder takes the `ModelSettings`, the number of classes of the
data, the run's `spec.ObjectiveSettings` and its mesh (for losses computed across it).

Optional attributes the run reads: ``batch_fields`` (batch entries besides 'image' and
'label': name -> (per-example shape, dtype)), ``frozen`` (top-level parameter subtrees
with no update and no optimizer state), ``pretrained_key`` (the subtree that
``config.pretrained`` initialises; absent: the whole tree) and
``train_flops_per_example(image_size, batch)`` (the analytic count of one example of a
train step where the model family's count is not it, e.g. a contrastive loss over the
batch; absent: `step_cost.vit_flops_per_image`), ``accuracy_metric`` (the name under
``eval/`` of what its eval sums' 'correct' / 'count' measure; absent: 'accuracy', a class
accuracy) and ``accumulated_value_and_grad(params,
micro_batches, rngs)`` (a loss that couples the batch's examples, over the whole batch
from ``config.accum_steps`` micro-batches; absent: the mean of the micro-batches' losses).

Each name's `Entry` also answers what the rest of the package asks of an objective (its
checks, the data it needs, whether it trains on labels): the resolver, the input
pipeline's settings (`data_settings`) and the zero-shot command ask `entry(name)`, and
nothing outside this package compares objective names.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Protocol

import jax
import ml_collections

from vit_jax import errors
from vit_jax.aliases import Batch
from vit_jax.data.dataset import DatasetInfo, Needs
from vit_jax.data.dataset import Settings as DataSettings
from vit_jax.models import VisionTransformer, create_model
from vit_jax.models.settings import Settings
from vit_jax.run.objectives import classification, contrastive, masked_patches


class Objective(Protocol):
  model: Any
  encoder: VisionTransformer

  def init(self, rng: jax.Array, images: jax.Array) -> Any: ...

  def loss(self, params: Any, batch: Batch, rng: jax.Array) -> jax.Array: ...

  def eval_step(self, params: Any, batch: Batch) -> dict[str, jax.Array]: ...


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
