"""Input pipelines: tfds datasets, image folders and the offline `digits` dataset.

Every source yields the same global batches, sharded over the mesh axis 'data'
(``settings``: a `Settings`; `eval_iterator` and `dataset_info` also take a run config,
read through `Settings.from_config`, which knows nothing of the objective: the settings
with its captions are a run's ``spec.data``, or `vit_jax.run.objectives.data_settings`):
  train_iterator(settings, mesh, *, start_step=0) -> endless
      {'image': f32[B, crop, crop, 3] in [-1, 1], 'label': f32[B, K] one-hot}
      (``settings.train_images`` says which: normalised, or with settings.randaug the
      uint8 values 0..255 that the step's ``train_images.augmenter`` augments and
      normalises)
  eval_iterator(settings, mesh, *, split=None) -> one pass per iteration, adds
      'mask': f32[B] (1 real example, 0 padding)
  dataset_info(settings) -> DatasetInfo(num_classes, num_train, num_test, class_names)
  make_global_batch(local_batch, mesh) -> global jax.Arrays
  local_batch_size(global_batch, mesh, key) -> this process's rows; fails on a batch
      that does not split over the processes and the 'data' devices
The names load on first use (PEP 562): the pipeline's modules import Grain and tfds, which
a step, a plan or a weights import never needs. Opening a tfds dataset registers the
`digits` builder.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> the module that defines it.
_WHERE = {
  "CaptionSettings": "caption_settings",
  "DatasetInfo": "dataset",
  "Needs": "settings",
  "PRESETS": "presets",
  "Preset": "presets",
  "Settings": "settings",
  "check_data_dir": "dataset",
  "dataset_info": "dataset",
  "eval_iterator": "pipeline",
  "local_batch_size": "batching",
  "make_global_batch": "batching",
  "train_iterator": "pipeline",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
  if name not in _WHERE:
    raise AttributeError(f"module 'vit_jax.data' has no attribute {name!r}")
  return getattr(importlib.import_module(f"vit_jax.data.{_WHERE[name]}"), name)
