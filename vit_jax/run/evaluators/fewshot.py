"""Few-shot accuracy of a model's frozen features (paper Sec. 4.1): during training
(``config.fewshot``, logged as ``fewshot/<dataset>_<shots>shot``) and for any checkpoint
(`python -m vit_jax.fewshot`).

Features are the model's pre-logits representation (after the final LayerNorm, the
pooling and, when the model has one, the tanh representation layer): the model applied
without its head. They come from a jitted forward pass over every example of a split
once (the eval pipeline's preprocessing and padded, masked last batch), the batch split
over the mesh's 'data' axis. The classifier and the sampling are `ridge`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from vit_jax import data
from vit_jax.infra import errors, sharding
from vit_jax.infra.aliases import Params
from vit_jax.models import create_model
from vit_jax.run.evaluators import ridge

DEFAULT_SHOTS: tuple[int, ...] = (1, 5, 10, 25)
DEFAULT_SEEDS = 3  # Class-balanced samples per shot count: seeds 0, 1, ...


@dataclasses.dataclass(frozen=True)
class FewshotSettings:
  """``config.fewshot``: few-shot evaluation during training (off while ``datasets`` is
  empty)."""

  datasets: tuple[str, ...]
  shots: tuple[int, ...]
  seeds: int
  l2_reg: float
  every: int  # steps between evaluations

  @classmethod
  def from_config(cls, section: ml_collections.ConfigDict) -> "FewshotSettings":
    if section.datasets and section.every <= 0:
      raise errors.ConfigError(
        f"config.fewshot.every={section.every} must be positive (steps between "
        "evaluations); an empty config.fewshot.datasets turns them off."
      )
    return cls(
      datasets=tuple(section.datasets),
      shots=tuple(section.shots),
      seeds=int(section.seeds),
      l2_reg=float(section.l2_reg),
      every=int(section.every),
    )


@dataclasses.dataclass(frozen=True)
class Result:
  """Accuracy on the test split over the seeds of one (dataset, shots) pair."""

  dataset: str
  shots: int
  accuracies: tuple[float, ...]  # one per seed
  seconds: float  # fitting and scoring, all seeds
  examples: int  # features computed for the dataset (pool and test split)
  feature_seconds: float  # computing them (shared by the dataset's results)

  @property
  def mean(self) -> float:
    return float(np.mean(self.accuracies))

  @property
  def spread(self) -> float:
    """The standard deviation over the seeds."""
    return float(np.std(self.accuracies))

  @property
  def name(self) -> str:
    return f"{self.dataset}_{self.shots}shot"


def splits_of(dataset: str) -> tuple[str, str]:
  """(pool to sample shots from, held-out split): the dataset's preset splits."""
  preset = data.PRESETS.get(dataset)
  return (preset.train_split, preset.test_split) if preset else ("train", "test")


def features_step(
  params: Params, batch: Mapping[str, jax.Array], *, model: nn.Module
) -> dict[str, jax.Array]:
  """Representation [B, D], int label [B] and mask [B] of one eval batch."""
  return {
    "features": model.apply({"params": params}, batch["image"], train=False),
    "label": jnp.argmax(batch["label"], axis=-1),
    "mask": batch["mask"],
  }


class FewShotEvaluator:
  """Builds the feature model, its jitted step and the eval pipelines once; call per params.

  ``model_config``: the model's (`vit_jax.models.variants` layout); ``data_settings``: the
  data settings each few-shot dataset is read with (crop, data_dir, batch_eval, ...), only
  dataset and splits replaced. ``train_split``/``test_split`` override `splits_of` for
  every dataset.
  """

  def __init__(
    self,
    model_config: ml_collections.ConfigDict,
    data_settings: data.Settings,
    mesh: jax.sharding.Mesh,
    datasets: Sequence[str],
    *,
    shots: Sequence[int] = DEFAULT_SHOTS,
    seeds: int = DEFAULT_SEEDS,
    l2_reg: float = ridge.DEFAULT_L2_REG,
    train_split: str | None = None,
    test_split: str | None = None,
  ):
    if model_config.classifier == "unpooled":
      raise errors.ConfigError(
        "Few-shot evaluation needs one representation per image; the model "
        "has classifier='unpooled': use 'token' or 'gap'."
      )
    self.shots, self.seeds, self.l2_reg = tuple(shots), seeds, l2_reg
    self.model = create_model(model_config, num_classes=None)
    crop = data_settings.crop
    abstract = jax.eval_shape(
      lambda: self.model.init(jax.random.PRNGKey(0), jnp.zeros((1, crop, crop, 3)))
    )
    self.param_names = frozenset(abstract["params"])
    self._step = jax.jit(
      functools.partial(features_step, model=self.model), out_shardings=sharding.replicated(mesh)
    )
    self._splits: dict[str, tuple[Any, Any, int]] = {}
    for dataset in datasets:
      pool, held_out = splits_of(dataset)
      settings = dataclasses.replace(
        data_settings,
        dataset=dataset,
        num_classes=None,
        train_split=train_split or pool,
        test_split=test_split or held_out,
      )
      self._splits[dataset] = (
        data.eval_iterator(settings, mesh, split=settings.train_split),
        data.eval_iterator(settings, mesh, split=settings.test_split),
        data.dataset_info(settings).num_classes,
      )

  def feature_params(self, params: Params) -> dict[str, Any]:
    """The parameters the head-less model uses: no head, nor anything of another objective."""
    return {k: v for k, v in params.items() if k in self.param_names}

  def features(self, params: Params, batches: Any) -> tuple[np.ndarray, np.ndarray]:
    """Features [N, D] and int labels [N] of every real example of one pass of ``batches``."""
    feats, labels = [], []
    for batch in batches:
      out = jax.device_get(self._step(params, batch))
      real = out["mask"] > 0
      feats.append(out["features"][real])
      labels.append(out["label"][real])
    return np.concatenate(feats), np.concatenate(labels)

  def __call__(self, params: Params) -> list[Result]:
    """Every (dataset, shots) result for ``params`` (the full model's or the head-less one's)."""
    params = self.feature_params(params)
    results = []
    for dataset, (pool_batches, test_batches, num_classes) in self._splits.items():
      start = time.perf_counter()
      pool_x, pool_y = self.features(params, pool_batches)
      test_x, test_y = self.features(params, test_batches)
      feature_seconds = time.perf_counter() - start
      examples = len(pool_x) + len(test_x)
      logging.info(
        "fewshot %s: features of %d examples (width %d) in %.1fs (%.0f/s).",
        dataset,
        examples,
        pool_x.shape[1],
        feature_seconds,
        examples / feature_seconds,
      )
      for shots in self.shots:
        start = time.perf_counter()
        accuracies = []
        for seed in range(self.seeds):
          idx = ridge.sample_per_class(pool_y, shots, seed)
          classifier = ridge.fit(pool_x[idx], pool_y[idx], num_classes, self.l2_reg)
          accuracies.append(ridge.accuracy(classifier, test_x, test_y))
        results.append(
          Result(
            dataset,
            shots,
            tuple(accuracies),
            time.perf_counter() - start,
            examples,
            feature_seconds,
          )
        )
    return results


def as_metrics(results: Sequence[Result]) -> dict[str, float]:
  """`fewshot/<dataset>_<shots>shot` (mean accuracy) and its `_spread`, for the run's log."""
  metrics = {}
  for r in results:
    metrics[f"fewshot/{r.name}"] = r.mean
    metrics[f"fewshot/{r.name}_spread"] = r.spread
  return metrics


class FewShot:
  """The run's evaluator (`EVALUATORS`): `FewShotEvaluator` on the run's model every
  ``config.fewshot.every`` steps, its results as metrics."""

  def __init__(self, steps: Any, fs: FewshotSettings):
    self.every = fs.every
    self._evaluator = FewShotEvaluator(
      steps.spec.model,
      steps.spec.data,
      steps.mesh,
      fs.datasets,
      shots=fs.shots,
      seeds=fs.seeds,
      l2_reg=fs.l2_reg,
    )

  def __call__(self, params: Any) -> dict[str, float]:
    return as_metrics(self._evaluator(params))


def build(steps: Any) -> Optional[FewShot]:
  """None while ``config.fewshot.datasets`` is empty."""
  settings = steps.spec.evaluators["fewshot"]
  return FewShot(steps, settings) if settings.datasets else None
