"""The quickstart's first train batches and one eval pass, as the input pipeline gives them:
what the TensorFlow-free test compares between digits from scikit-learn's arrays (no
TensorFlow) and the prepared tfds dataset (TensorFlow installed)."""

import threading

import numpy as np

from configs import quickstart
from vit_jax.data import dataset, pipeline
from vit_jax.data import settings as data_settings

_STEPS = 12  # 1,536 examples: past the end of the 1,437 train examples' first epoch


def quickstart_batches(**overrides) -> dict[str, np.ndarray]:
  """``configs/quickstart.py`` with ``overrides``: its train batches' example indices and
  labels ([steps, B]) and its eval pass's images, labels and masks (concatenated)."""
  config = quickstart.get_config()
  config.update(overrides)
  data = dataset.Dataset(data_settings.Settings.from_config(config))
  stop = threading.Event()
  batches = pipeline.local_train_batches(data, config.batch, 0, 0, 1, stop, with_index=True)
  train = [next(batches) for _ in range(_STEPS)]
  stop.set()
  batches.close()
  evaluation = list(pipeline.EvalBatches(data, config.test_split, config.batch_eval, 0, 1))
  return {
    "index": np.stack([b["index"] for b in train]),
    "label": np.stack([b["label"] for b in train]),
    "eval_image": np.concatenate([b["image"] for b in evaluation]),
    "eval_label": np.concatenate([b["label"] for b in evaluation]),
    "eval_mask": np.concatenate([b["mask"] for b in evaluation]),
  }
