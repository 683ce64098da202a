"""Fine-tuning a `vit_jax.Model` on arrays from Python, by the command's own run.

    tuned = model.fine_tune(images, labels, steps=20)   # images [N, H, W, 3], labels [N]
    workdir = train_on_arrays(model, images, labels, steps=20)   # what it runs

The arrays are saved as an ``arrays:`` dataset (`vit_jax.data.arrays`) and the model as
its ``.npz`` (with its config) in ``<workdir>/inputs``; the run config is
`vit_jax.run.defaults` with the model, those two and the settings below, and
`vit_jax.run.train_and_evaluate` trains it in ``workdir``: the compiled step, sharding,
input pipeline, checkpoints and exact resume of ``python -m vit_jax.main``. Calling it
again with the same ``workdir`` resumes the run (or returns its result when it is done).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from vit_jax import errors
from vit_jax.data import arrays
from vit_jax.run import defaults

INPUTS = "inputs"  # <workdir>/inputs: the arrays and the starting weights
MAX_BATCH = 32  # the default batch, or the number of images when fewer
DEFAULT_LR = 0.01  # SGD with momentum (the defaults' optimizer), after a short warm-up


def train_on_arrays(
  model: Any,
  images: Any,
  labels: Any = None,
  *,
  steps: int = 20,
  workdir: Optional[str | os.PathLike] = None,
  batch: Optional[int] = None,
  lr: float = DEFAULT_LR,
  seed: int = 0,
  class_names: Optional[Sequence[str]] = None,
  test_images: Any = None,
  test_labels: Any = None,
  overrides: Optional[Mapping[str, Any]] = None,
) -> str:
  """Trains ``model`` (a `vit_jax.Model`) ``steps`` steps on ``images`` (uint8 or float
  in [0, 1], [N, H, W, 3], any size: the pipeline crops and resizes to the model's) and
  ``labels`` (class indices [N]), or ``images`` an iterable of (images, labels) batches
  and no ``labels`` (`arrays.gather_batches`); a new head when the class count differs. ``workdir``:
  the run's folder (default: a new temporary one); ``overrides``: any other run key by
  its dotted name (``{"pp.flip": False, "optim.name": "adamw"}``). Returns the run's folder, which
  `vit_jax.load` reads (`Model.fine_tune` does)."""
  if model.image_size is None or model.image_size[0] != model.image_size[1]:
    raise errors.ConfigError(
      f"fine_tune trains square inputs; {model!r} has image size {model.image_size}: "
      "call model.at_resolution(R) first."
    )
  if labels is None:
    images, labels = arrays.gather_batches(images)
  workdir = os.fspath(workdir or tempfile.mkdtemp(prefix="vit_jax_fine_tune_"))
  inputs = os.path.join(workdir, INPUTS)
  os.makedirs(inputs, exist_ok=True)
  data_path = os.path.join(inputs, "arrays.npz")
  dataset = arrays.save_arrays(
    data_path,
    images,
    labels,
    test_images=test_images,
    test_labels=test_labels,
    class_names=class_names,
  )
  weights = os.path.join(inputs, "pretrained")
  if not os.path.isdir(weights) or not os.listdir(weights):
    model.save(weights)  # a resumed call keeps the first call's starting weights
  num_examples = len(np.asarray(labels))
  config = defaults.get_config()
  config.model = model.config
  config.pretrained = os.path.join(weights, "model.npz")
  config.dataset = dataset
  config.train_split = "train"
  config.test_split = "test" if test_images is not None else "train"
  config.num_classes = len(arrays.ArrayDataset(data_path).class_names)
  config.pp.crop = model.image_size[0]
  config.batch = config.batch_eval = batch or min(MAX_BATCH, num_examples)
  config.total_steps = steps
  config.lr.base, config.lr.warmup_steps = lr, min(config.lr.warmup_steps, steps // 5)
  config.log_every = config.eval_every = config.checkpoint_every = max(steps, 1)
  config.seed = seed
  for key, value in (overrides or {}).items():
    _set(config, key, value)
  from vit_jax import run  # pylint: disable=g-import-not-at-top  (the run: TensorFlow)

  run.train_and_evaluate(config, workdir)
  return workdir


def _set(config: Any, dotted: str, value: Any) -> None:
  """``config.<dotted> = value``; a key the defaults do not have is one error."""
  *parents, leaf = dotted.split(".")
  node = config
  for part in parents:
    node = node.get(part) if hasattr(node, "get") else None
  if node is None or not hasattr(node, "get") or leaf not in node:
    raise errors.ConfigError(
      f"overrides key {dotted!r} is not a run config key (vit_jax.run.defaults.get_config())."
    )
  node[leaf] = value
