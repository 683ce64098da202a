"""Image-text retrieval recall@k, with every caption of every image (COCO's 5 per image).

- image -> text: an image is a hit at k when any of its own captions is among the k
  captions scoring highest against it: its best own caption's rank (the number of
  captions scoring strictly higher) is below k.
- text -> image: every caption is a query; a hit at k when its image is among the k
  images scoring highest against it.

This is the protocol of the COCO and Flickr30k retrieval benchmarks (Karpathy's 5k test
images with 25k captions), as CLIP's, ALIGN's and SigLIP's papers report it and
open_clip's retrieval evaluation computes it (a hit where any positive is in the top k).
We count ranks as "strictly higher" rather than taking a top-k, so tied scores (captions
made from labels repeat) are counted for the query, never against it. Scores are
computed a block of queries at a time: no [images, captions] matrix is held.

On data with its own captions (`data.free_text`) the run's evaluator (`Retrieval`) embeds
the test images from the eval batches and every caption of the test split, read once
from the split and tokenized once.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import numpy as np

from vit_jax import data
from vit_jax.data import batching, order
from vit_jax.data.dataset import Dataset
from vit_jax.infra import sharding
from vit_jax.infra.aliases import Params

RECALL_AT = (1, 5, 10)
_BLOCK = 1024  # queries scored at a time
_READ = 1024  # examples of the test split read at a time for their captions


def recall_at(scores: np.ndarray, ks: Sequence[int] = RECALL_AT) -> dict[int, float]:
  """[N, N] scores of query i against candidate j (own partner j = i) -> recall@k."""
  own = np.diagonal(scores)[:, None]
  rank = np.sum(scores > own, axis=1)  # [N]
  return {k: float(np.mean(rank < k)) for k in ks}


def retrieval_metrics(
  zimg: np.ndarray, ztxt: np.ndarray, owner: Optional[np.ndarray] = None
) -> dict[str, float]:
  """recall@1/5/10 both ways of N normalised image embeddings [N, E] and M caption
  embeddings [M, E], caption j being one of image ``owner[j]``'s (int [M]; None: M = N
  pairs, caption i of image i). Every image needs at least one caption."""
  owner = np.arange(len(ztxt)) if owner is None else np.asarray(owner, np.int64)
  if np.bincount(owner, minlength=len(zimg)).min() == 0:
    raise ValueError("every image needs at least one caption to be retrieved")
  ranks_i2t = np.empty(len(zimg), np.int64)
  for lo in range(0, len(zimg), _BLOCK):
    scores = zimg[lo : lo + _BLOCK] @ ztxt.T  # [b, M]
    own = owner[None, :] == lo + np.arange(len(scores))[:, None]  # [b, M]
    best = np.max(np.where(own, scores, -np.inf), axis=1, keepdims=True)  # [b, 1]
    ranks_i2t[lo : lo + len(scores)] = np.sum(scores > best, axis=1)
  ranks_t2i = np.empty(len(ztxt), np.int64)
  for lo in range(0, len(ztxt), _BLOCK):
    scores = ztxt[lo : lo + _BLOCK] @ zimg.T  # [b, N]
    own = scores[np.arange(len(scores)), owner[lo : lo + _BLOCK]][:, None]  # [b, 1]
    ranks_t2i[lo : lo + len(scores)] = np.sum(scores > own, axis=1)
  out = {}
  for direction, ranks in (("image_to_text", ranks_i2t), ("text_to_image", ranks_t2i)):
    for k in RECALL_AT:
      out[f"retrieval/{direction}_recall@{k}"] = float(np.mean(ranks < k))
  return out


def split_captions(dataset: Dataset, split: str) -> tuple[np.ndarray, np.ndarray]:
  """(int32 [M, text_len] ids of every caption of the split's examples, int64 [M] the
  split index of each one's example), read ``_READ`` examples at a time."""
  source = dataset.split(split)
  ids, owners = [], []
  for lo in range(0, source.num_examples, _READ):
    captions = source.read(lo, min(lo + _READ, source.num_examples))[2]  # [k] tuples of str
    counts = [len(c) for c in captions]
    texts = [t.encode("utf-8") for c in captions for t in c]
    ids.append(dataset.tokenize(np.array(texts, object)))
    owners.append(np.repeat(lo + np.arange(len(captions)), counts))
  return np.concatenate(ids), np.concatenate(owners)


def eval_indices(n: int, global_batch: int, blocks: int, num_batches: int) -> np.ndarray:
  """int64 [num_batches, global_batch]: the split index of each row of the eval batches
  (-1: padding). Process block p of ``blocks`` fills rows [p * b, (p + 1) * b) of every
  global batch from its contiguous shard of the split (`order.process_shard`)."""
  local = global_batch // blocks
  out = np.full([num_batches, blocks, local], -1, np.int64)
  for p in range(blocks):
    lo, hi = order.process_shard(n, p, blocks)
    index = lo + np.arange(num_batches * local).reshape(num_batches, local)
    out[:, p] = np.where(index < hi, index, -1)
  return out.reshape(num_batches, global_batch)


class Retrieval:
  """The run's evaluator on data with its own captions (no classes): every test image
  against every caption of the test split, recall@1/5/10 both ways, every
  ``config.eval_every`` steps."""

  def __init__(self, steps: Any):
    objective, settings = steps.objective, steps.spec.data
    self.batches = data.eval_iterator(settings, steps.mesh)
    self.every = steps.spec.loop.eval_every
    self._dataset, self._split = Dataset(settings), settings.test_split
    self._blocks = batching.process_row_block(settings.batch_eval, steps.mesh)[1]
    self._captions: Optional[tuple[np.ndarray, np.ndarray]] = None  # read at the first call
    self._images = jax.jit(
      lambda p, images: objective.embed(p, images, None)[0],
      out_shardings=sharding.replicated(steps.mesh),
    )
    self._texts = jax.jit(lambda p, ids: objective.embed(p, None, ids)[1])

  def __call__(self, params: Params) -> dict[str, float]:
    if self._captions is None:
      self._captions = split_captions(self._dataset, self._split)
    ids, owner = self._captions
    parts, masks = [], []
    for batch in self.batches:
      parts.append(np.asarray(jax.device_get(self._images(params, batch["image"]))))
      masks.append(np.asarray(jax.device_get(batch["mask"])))
    n = self._dataset.split(self._split).num_examples
    index = eval_indices(n, len(parts[0]), self._blocks, len(parts)).ravel()
    index = np.where(np.concatenate(masks) > 0, index, -1)  # a skipped image is left out
    zimg = np.zeros([n, parts[0].shape[1]], np.float32)  # [N, E] in split order
    zimg[index[index >= 0]] = np.concatenate(parts)[index >= 0]
    seen = np.zeros(n, bool)
    seen[index[index >= 0]] = True
    keep = seen[owner]  # the captions of the images evaluated
    chunks = [self._texts(params, ids[i : i + _READ]) for i in range(0, len(ids), _READ)]
    ztxt = np.concatenate([np.asarray(jax.device_get(c)) for c in chunks])  # [M, E]
    renumber = np.cumsum(seen) - 1  # split index -> row among the images evaluated
    metrics = retrieval_metrics(zimg[seen], ztxt[keep], renumber[owner[keep]])
    return {
      **metrics,
      "retrieval/examples": float(seen.sum()),
      "retrieval/captions": float(keep.sum()),
    }
