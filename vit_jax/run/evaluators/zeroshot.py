"""Zero-shot classification and image-text retrieval of a two-tower model: during a
contrastive run (logged as ``zeroshot/...`` and ``retrieval/...`` every
``config.eval_every`` steps) and for a finished run (`python -m vit_jax.zeroshot`).

- Zero-shot: each class's embedding is the normalised mean of the text embeddings of its
  prompts (every template filled with its name, as CLIP's prompt ensembling); an image
  is assigned the class whose embedding is nearest (`two_tower.zero_shot_logits`).
- Retrieval: every test image against every test caption, recall@k image-to-text and
  text-to-image (the fraction whose own partner ranks in the top k, `retrieval`). Example
  i's caption is the one the eval batches carry (`captions.Captions.eval_ids`: template i
  mod T of its class), so its embedding is that prompt's. An item's rank is the number of
  others that score strictly higher: captions made from labels repeat, and identical ones
  tie.

On data with its own captions (no classes) only retrieval runs, each image against
every caption of its own (`retrieval.Retrieval`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import jax
import numpy as np

from vit_jax import data
from vit_jax.data import captions as captions_lib
from vit_jax.data.dataset import Dataset
from vit_jax.infra import sharding
from vit_jax.infra.aliases import Params
from vit_jax.models import two_tower
from vit_jax.run.evaluators import retrieval

_TEXT_CHUNK = 1024  # prompts embedded per forward pass


class ZeroShotEvaluator:
  """``embed``: (params, images or None, ids or None) -> (zimg, ztxt, {'t', 'b'}), a run's
  `objectives.contrastive.Contrastive.embed` or a loaded two-tower module's apply;
  ``captions``: the prompts of the dataset's classes tokenized by the model's tokenizer
  (`captions.Captions`); ``batches``: eval batches ('image', 'label', 'mask':
  `data.eval_iterator`)."""

  def __init__(self, embed: Callable, captions: captions_lib.Captions, batches: Iterable, mesh):
    self.captions, self.batches = captions, batches

    def images(params, batch):
      zimg = embed(params, batch["image"], None)[0]
      return dict(zimg=zimg, label=batch["label"].argmax(-1), mask=batch["mask"])

    self._images = jax.jit(images, out_shardings=sharding.replicated(mesh))
    self._texts = jax.jit(lambda p, ids: embed(p, None, ids)[1])

  def prompt_embeddings(self, params: Params) -> np.ndarray:
    """[K, T, E]: the text embedding of every class's every prompt."""
    ids = self.captions.ids  # [K, T, L]
    flat = ids.reshape(-1, ids.shape[-1])
    z = [self._texts(params, flat[i : i + _TEXT_CHUNK]) for i in range(0, len(flat), _TEXT_CHUNK)]
    return np.concatenate([np.asarray(jax.device_get(c)) for c in z]).reshape(*ids.shape[:2], -1)

  def __call__(self, params: Params) -> dict[str, float]:
    parts = [jax.device_get(self._images(params, batch)) for batch in self.batches]
    real = np.concatenate([p["mask"] for p in parts]) > 0
    zimg, labels = (np.concatenate([p[k] for p in parts])[real] for k in ("zimg", "label"))
    prompts = self.prompt_embeddings(params)  # [K, T, E]
    t = np.exp(float(jax.device_get(params["t"])[0]))
    logits = np.asarray(two_tower.zero_shot_logits(zimg, prompts.mean(axis=1), t))  # [N, K]
    metrics = {"zeroshot/accuracy": float(np.mean(logits.argmax(-1) == labels))}
    ztxt = prompts[labels, np.arange(len(labels)) % prompts.shape[1]]  # [N, E]
    metrics.update(retrieval.retrieval_metrics(zimg, ztxt))
    metrics["zeroshot/examples"] = float(len(labels))
    return metrics


class ZeroShot(ZeroShotEvaluator):
  """The run's evaluator (`EVALUATORS`), every ``config.eval_every`` steps."""

  def __init__(self, steps: Any):
    settings = steps.spec.data
    dataset = Dataset(settings)
    batches = data.eval_iterator(settings, steps.mesh)
    super().__init__(steps.objective.embed, dataset.captions, batches, steps.mesh)
    self.every = steps.spec.loop.eval_every


def build(steps: Any) -> ZeroShot | retrieval.Retrieval | None:
  """None unless the run trains a two-tower model on captioned data: zero-shot and
  retrieval with captions made from labels, retrieval alone with the data's own."""
  text = steps.spec.data.text
  if steps.objective.text_len is None or text is None:
    return None
  if text.tokenizer is not None:
    return retrieval.Retrieval(steps)
  return ZeroShot(steps) if text.templates is not None else None
