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
batch; absent: `step_cost.vit_flops_per_image`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

import jax

from vit_jax import errors
from vit_jax.aliases import Batch
from vit_jax.models import VisionTransformer, create_model
from vit_jax.models.settings import Settings
from vit_jax.run.objectives import classification, contrastive, masked_patches


class Objective(Protocol):
  model: Any
  encoder: VisionTransformer

  def init(self, rng: jax.Array, images: jax.Array) -> Any: ...

  def loss(self, params: Any, batch: Batch, rng: jax.Array) -> jax.Array: ...

  def eval_step(self, params: Any, batch: Batch) -> dict[str, jax.Array]: ...


# name -> builder(model_config, num_classes, settings, mesh)
OBJECTIVES: dict[str, Callable[..., Objective]] = {
  "classification": lambda model, k, s, mesh: classification.Classification(
    create_model(model, num_classes=k), s.loss, s.label_smoothing
  ),
  "mpp": lambda model, k, s, mesh: masked_patches.MaskedPatchPrediction(model, s.options),
  "contrastive": lambda model, k, s, mesh: contrastive.Contrastive(model, s.options, mesh),
}


def check_name(name: str) -> None:
  if name not in OBJECTIVES:
    raise errors.ConfigError(
      f"Unknown config.objective={name!r}; choose one of {tuple(OBJECTIVES)}."
    )


def make(
  model_config: Settings,
  num_classes: int,
  settings: Any,
  mesh: Optional[jax.sharding.Mesh] = None,
) -> Objective:
  """The objective ``settings.name`` names (`spec.ObjectiveSettings`)."""
  check_name(settings.name)
  return OBJECTIVES[settings.name](model_config, num_classes, settings, mesh)
