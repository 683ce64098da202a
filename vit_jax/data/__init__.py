"""Input pipelines: tfds datasets, image folders and the offline `digits` dataset.

Every source yields the same global batches, sharded over the mesh axis 'data'
(``settings``: a `Settings`; `eval_iterator` and `dataset_info` also take a run config,
read through `Settings.from_config`):
  train_iterator(settings, mesh, *, start_step=0) -> endless
      {'image': f32[B, crop, crop, 3] in [-1, 1], 'label': f32[B, K] one-hot}
  eval_iterator(settings, mesh, *, split=None) -> one pass per iteration, adds
      'mask': f32[B] (1 real example, 0 padding)
  dataset_info(settings) -> DatasetInfo(num_classes, num_train, num_test, class_names)
  make_global_batch(local_batch, mesh) -> global jax.Arrays
  local_batch_size(global_batch, mesh, key) -> this process's rows; fails on a batch
      that does not split over the processes and the 'data' devices
Importing this package registers the `digits` tfds builder.
"""

from vit_jax.data import digits  # Registers tfds.builder('digits').
from vit_jax.data.batching import local_batch_size, make_global_batch
from vit_jax.data.dataset import DatasetInfo, Settings, check_data_dir, dataset_info
from vit_jax.data.pipeline import eval_iterator, train_iterator
from vit_jax.data.presets import PRESETS, Preset

__all__ = [
  "DatasetInfo",
  "PRESETS",
  "Preset",
  "Settings",
  "check_data_dir",
  "dataset_info",
  "digits",
  "eval_iterator",
  "local_batch_size",
  "make_global_batch",
  "train_iterator",
]
