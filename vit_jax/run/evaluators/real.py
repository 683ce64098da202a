"""ImageNet ReaL accuracy (Beyer et al. 2020, "Are we done with ImageNet?"): the top-1
class counts as correct when it is in the image's set of ReaL labels (tfds
``imagenet2012_real``'s ``real_label``, the same 1000 class indices as ``imagenet2012``);
images whose set is empty are left out, as big_vision's evaluator does. Logged as
``<name>/accuracy`` and ``<name>/examples`` (the images counted)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from vit_jax.data import order
from vit_jax.data.dataset import Dataset
from vit_jax.data.settings import Settings
from vit_jax.infra import errors
from vit_jax.infra.aliases import Batch, Params
from vit_jax.run.steps import RunSteps


def real_accuracy(predictions: np.ndarray, label_sets: Sequence[np.ndarray]) -> tuple[int, int]:
  """(correct, counted) of top-1 ``predictions`` int [N] against each image's label set;
  an image with an empty set is not counted."""
  correct = counted = 0
  for predicted, labels in zip(predictions, label_sets):
    if len(labels):
      counted += 1
      correct += int(int(predicted) in set(labels.tolist()))
  return correct, counted


def label_sets(settings: Settings, key: str) -> list[np.ndarray]:
  """Each example's label set (the int64 values of the tfds feature ``key``) of
  ``settings.test_split``, in the order the eval batches visit the split."""
  dataset = Dataset(settings)
  features = getattr(getattr(dataset._source, "builder", None), "info", None)  # pylint: disable=protected-access
  if features is None or key not in features.features:
    names = list(features.features) if features is not None else "none"
    raise errors.ConfigError(
      f"kind='real' reads each image's label set from the tfds feature {key!r}, which "
      f"{settings.dataset!r} lacks (its features: {names}): use imagenet2012_real "
      "(real_key='real_label')."
    )
  return dataset.split(settings.test_split).int_lists(key)


def top1_step(steps: RunSteps) -> Callable[[Params, Batch], jax.Array]:
  """The jitted top-1 class of each row: (params, batch) -> int32 [B]."""
  if not steps.objective.classifies:
    raise errors.ConfigError(
      f"kind='real' counts a classifier's top-1 class; config.objective="
      f"{steps.spec.objective.name!r} has none: use kind='accuracy'."
    )
  model = steps.objective.model

  def top1(params: Params, batch: Batch) -> jax.Array:
    logits = model.apply({"params": params}, batch["image"], train=False)  # [B, K]
    return jnp.argmax(logits, -1).astype(jnp.int32)  # [B]

  return jax.jit(top1)


def row_indices(batch_index: int, global_batch: int, processes: int, n: int) -> np.ndarray:
  """The split index of each row of global eval batch ``batch_index`` (-1: padding):
  process p's rows are its block, reading its contiguous shard (`order.process_shard`)."""
  local = global_batch // processes
  rows = np.arange(global_batch)
  process, row = rows // local, rows % local
  shards = np.array([order.process_shard(n, p, processes) for p in range(processes)])  # [P, 2]
  position = batch_index * local + row
  start, stop = shards[process, 0], shards[process, 1]
  return np.where(position < stop - start, start + position, -1)


@dataclasses.dataclass
class Real:
  """ReaL accuracy of the top-1 predictions over the split of ``labels`` every ``every`` steps."""

  every: int
  top1: Callable[[Params, Batch], jax.Array]  # `top1_step`
  batches: Iterable[Batch]  # `data.eval_iterator`'s over the split of ``labels``
  labels: list[np.ndarray]  # each example's label set (`label_sets`)
  prefix: str = "real"

  def __call__(self, params: Params) -> dict[str, float]:
    predictions = np.full(len(self.labels), -1, np.int64)
    processes = jax.process_count()
    for k, batch in enumerate(self.batches):
      top1 = np.asarray(multihost_utils.process_allgather(self.top1(params, batch), tiled=True))
      mask = np.asarray(multihost_utils.process_allgather(batch["mask"], tiled=True))
      index = row_indices(k, len(top1), processes, len(self.labels))
      keep = (index >= 0) & (mask > 0)
      predictions[index[keep]] = top1[keep]
    seen = predictions >= 0  # images that failed to decode (skipped) are not counted
    correct, counted = real_accuracy(
      predictions[seen], [s for s, ok in zip(self.labels, seen) if ok]
    )
    if not counted:
      raise errors.ConfigError(
        f"{self.prefix}: no image of the split has a ReaL label: check its split and real_key."
      )
    return {f"{self.prefix}/accuracy": correct / counted, f"{self.prefix}/examples": counted}
