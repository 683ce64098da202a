"""Supervised classification: a `VisionTransformer` with a K-way head and a `losses` loss."""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from vit_jax.data.dataset import DatasetInfo
from vit_jax.data.settings import Settings as DataSettings
from vit_jax.infra import errors
from vit_jax.infra.aliases import Batch
from vit_jax.models import VisionTransformer
from vit_jax.run import losses
from vit_jax.run.objectives.base import Objective


def check_data(config: Any, model: Any, data: DataSettings, info: Optional[DatasetInfo]) -> None:
  """A dataset of one class cannot train a classifier (its loss is 0 from the start)."""
  del config, model
  if info is not None and info.num_classes < 2:
    raise errors.ConfigError(
      f"config.dataset={data.dataset!r} has {info.num_classes} class: a classifier needs at "
      "least 2 (add a class, or check config.train_split)."
    )


class Classification(Objective):
  """Trains ``model`` on the labels with the `losses.LOSSES` kind ``loss_kind``, the
  training labels smoothed by ``label_smoothing`` (`losses.smooth_labels`): its outputs
  are the classes (a class accuracy under 'eval/accuracy')."""

  classifies = True

  def __init__(self, model: VisionTransformer, loss_kind: str, label_smoothing: float):
    self.model = self.encoder = model
    self.loss_kind = loss_kind
    self.label_smoothing = label_smoothing

  def init(self, rng: jax.Array, images: jax.Array) -> Any:
    """Boxed parameters (with their logical axis names)."""
    return self.model.init({"params": rng}, images)["params"]

  def loss(self, params: Any, batch: Batch, rng: jax.Array) -> jax.Array:
    logits = self.model.apply({"params": params}, batch["image"], train=True, rngs={"dropout": rng})
    labels = losses.smooth_labels(batch["label"], self.label_smoothing)  # [B, K]
    return jnp.mean(losses.per_example_loss(logits, labels, self.loss_kind))

  def eval_step(self, params: Any, batch: Batch) -> dict[str, jax.Array]:
    """Sums of loss and correct predictions over the real (mask == 1) examples of a batch;
    the loss is the training one, so eval and train losses compare."""
    logits = self.model.apply({"params": params}, batch["image"], train=False)  # [B, K]
    mask = batch["mask"]  # [B]
    labels = batch["label"]  # [B, K] one-hot
    per_example = losses.per_example_loss(logits, labels, self.loss_kind)  # [B]
    correct = jnp.argmax(logits, -1) == jnp.argmax(labels, -1)  # [B]
    return {
      "loss_sum": jnp.sum(per_example * mask),
      "correct": jnp.sum(correct * mask),
      "count": jnp.sum(mask),
    }
