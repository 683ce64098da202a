"""What a run trains (``config.objective``): the model, its loss and its evaluation sums.

  classification: a `VisionTransformer` with a K-way head and ``config.loss`` on the labels.
  mpp: masked patch prediction (`vit_jax.mpp`), self-supervised: labels are not used.

Each objective has ``model``, ``encoder`` (the `VisionTransformer` whose parameters it
trains), ``init(rng, images)``, ``loss(params, batch, rng)`` (the mean over the batch, for
`train.train_step`) and ``eval_step(params, batch)`` (sums for `evaluate.evaluate`).
"""

from __future__ import annotations

from typing import Any, Union

import jax
import jax.numpy as jnp
import ml_collections

from vit_jax import errors, evaluate, losses, mpp
from vit_jax.aliases import Batch
from vit_jax.models import VisionTransformer, create_model

OBJECTIVES: tuple[str, ...] = ("classification", "mpp")


class Classification:
  """Supervised training of ``model`` with the `losses.LOSSES` kind ``loss_kind``."""

  def __init__(self, model: VisionTransformer, loss_kind: str):
    losses.check_loss(loss_kind)
    self.model = self.encoder = model
    self.loss_kind = loss_kind

  def init(self, rng: jax.Array, images: jax.Array) -> Any:
    """Boxed parameters (with their logical axis names)."""
    return self.model.init({"params": rng}, images)["params"]

  def loss(self, params: Any, batch: Batch, rng: jax.Array) -> jax.Array:
    logits = self.model.apply({"params": params}, batch["image"], train=True, rngs={"dropout": rng})
    return jnp.mean(losses.per_example_loss(logits, batch["label"], self.loss_kind))

  def eval_step(self, params: Any, batch: Batch) -> dict[str, jax.Array]:
    return evaluate.eval_step(params, batch, model=self.model, loss=self.loss_kind)


Objective = Union[Classification, mpp.Objective]


def make(config: ml_collections.ConfigDict, num_classes: int) -> Objective:
  """The objective ``config.objective`` names, built from the run config."""
  if config.objective == "classification":
    return Classification(create_model(config.model, num_classes=num_classes), config.loss)
  if config.objective == "mpp":
    return mpp.Objective(config)
  raise errors.ConfigError(
    f"Unknown config.objective={config.objective!r}; choose one of {OBJECTIVES}."
  )
