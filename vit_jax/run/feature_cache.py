"""A LiT run's image features, computed once per example: the locked image tower never
changes, so its output for an example is the same every epoch when the example's image
is (``config.pp.min_area=1.0``, ``config.pp.flip=False``, no RandAugment: `check`).

``config.contrastive.cache_image_features=True``: each host-local train batch (with its
rows' example indices, `data.train_iterator(transform=...)`) gets 'image_features' [b, D],
the image tower's output (before ``img_head``, which trains), looked up in a host table
of the train split [n, D]; a batch with a row not yet in the table runs the tower once
(on this process's first device, with the run's locked parameters) and stores the rows.
From the second epoch on no step runs the image tower: the compiled step reads the
features (`objectives.contrastive.Contrastive.train_fields`). The table is host memory,
n x D x 4 bytes per process, and is rebuilt after a resume (the same values).

The features are the tower's at ``train=False`` (no dropout or stochastic depth), as a
locked tower is evaluated; the uncached step runs it with ``train=True``, which differs
only where the image model has dropout or stochastic depth.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from vit_jax.infra import errors
from vit_jax.infra.aliases import HostBatch


def check(options: Any, settings: Any) -> None:
  """``config.contrastive.cache_image_features`` needs the image tower locked and each
  example's train image the same every epoch (``settings``: the run's data settings)."""
  if not options.get("cache_image_features"):
    return
  if not options.lock_image:
    raise errors.ConfigError(
      "config.contrastive.cache_image_features=True caches the locked image tower's "
      "features, but config.contrastive.lock_image=False trains it: lock it (LiT) or "
      "set cache_image_features=False."
    )
  if settings.min_area < 1.0 or settings.flip or settings.randaug is not None:
    raise errors.ConfigError(
      "config.contrastive.cache_image_features=True keeps one image per example, but the "
      f"train images change every epoch (config.pp.min_area={settings.min_area}, "
      f"flip={settings.flip}, randaug={settings.randaug}): set config.pp.min_area=1.0, "
      "config.pp.flip=False and config.pp.randaug=None, or cache_image_features=False."
    )


class FeatureCache:
  """The host-local batch transform: 'image' -> 'image_features' [b, D] by 'index'."""

  def __init__(self, image_model: Any, image_params: Any, num_examples: int):
    # The whole tree on this process (replicated or sharded over the mesh alike).
    params = multihost_utils.process_allgather(image_params, tiled=True)
    self._device = jax.local_devices()[0]
    self._params = jax.device_put(params, self._device)
    self._features = jax.jit(lambda p, x: image_model.apply({"params": p}, x, train=False))
    self.num_examples = num_examples
    self.table: np.ndarray | None = None  # float32 [n, D]
    self.filled = np.zeros(num_examples, bool)
    self.computed = 0  # batches that ran the image tower

  def __call__(self, batch: HostBatch) -> HostBatch:
    batch = dict(batch)
    index, images = batch.pop("index"), batch.pop("image")
    missing = ~self.filled[index]
    if missing.any():
      images = jax.device_put(images, self._device)
      features = np.asarray(self._features(self._params, images), np.float32)  # [b, D]
      if self.table is None:
        self.table = np.zeros((self.num_examples, features.shape[-1]), np.float32)
      self.table[index[missing]] = features[missing]
      self.filled[index[missing]] = True
      self.computed += 1
    batch["image_features"] = self.table[index]
    return batch
