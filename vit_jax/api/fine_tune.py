"""Fine-tuning a `vit_jax.Model` on arrays from Python, by the command's own run.

    tuned, history = model.fine_tune(images, labels, steps=20)   # images [N, H, W, 3]
    workdir, history = train_on_arrays(model, images, labels, steps=20)   # what it runs

The arrays are saved as an ``arrays:`` dataset (`vit_jax.data.arrays`) and the model as
its ``.npz`` (with its config) in ``<workdir>/inputs``; the run config is
`vit_jax.run.defaults` with the model, those two, the model's own eval preprocessing
(`data_config.to_run_pp`: a timm checkpoint's crop_pct and bicubic resize stay the tuned
model's) and the settings below, and `vit_jax.run.train_and_evaluate` trains it in
``workdir``: the compiled step, sharding, input pipeline, checkpoints and exact resume of
``python -m vit_jax.main``. The run's progress reports (`run.progress.Observer`) draw a
tqdm bar (loss, img/s, ETA) and print the evaluations, and are returned as a
`run.progress.History`.

A ``workdir`` that holds a run is continued only with the arguments that started it
(``inputs/fine_tune.json``): an interrupted call resumes and a finished one returns its
model; other arguments (another ``lr``, more ``steps``, other arrays) are refused in one
line naming them, never trained or returned silently.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np
import tqdm.auto

from vit_jax import models
from vit_jax.data import arrays, data_config
from vit_jax.infra import errors
from vit_jax.infra.paths import RunPaths
from vit_jax.run import defaults
from vit_jax.run.progress import History
from vit_jax.weights import npz, orbax_steps

INPUTS = "inputs"  # <workdir>/inputs: the arrays, the starting weights, the call's arguments
ARGUMENTS_FILE = "fine_tune.json"  # <workdir>/inputs/fine_tune.json: what started the run
MAX_BATCH = 32  # the default batch, or the number of images when fewer
DEFAULT_LR = 0.01  # SGD with momentum (the defaults' optimizer), after a short warm-up
REPORTS = 50  # progress reports (bar updates, History rows) per run, at most


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
  progress: bool = True,
) -> tuple[str, History]:
  """Trains ``model`` (a `vit_jax.Model`) ``steps`` steps on ``images`` (uint8 or float
  in [0, 1], [N, H, W, 3], any size: the pipeline crops and resizes to the model's) and
  ``labels`` (class indices [N]), or ``images`` an iterable of (images, labels) batches
  and no ``labels`` (`arrays.gather_batches`); a new head when the class count differs.
  ``workdir``: the run's folder (default: a new temporary one; one that holds a run is
  continued only with the same arguments, see the module docstring); ``overrides``: any
  other run key by its dotted name (``{"pp.flip": False, "optim.name": "adamw"}``);
  ``progress``: draw the bar and print the evaluations. Returns the run's folder, which
  `vit_jax.load` reads (`Model.fine_tune` does), and the `History` of this call's reports
  (a finished run returned again has its final evaluation only)."""
  if model.image_size is None or model.image_size[0] != model.image_size[1]:
    raise errors.ConfigError(
      f"fine_tune trains square inputs; {model!r} has image size {model.image_size}: "
      "call model.at_resolution(R) first."
    )
  if labels is None:
    images, labels = arrays.gather_batches(images)
  workdir = os.fspath(workdir or tempfile.mkdtemp(prefix="vit_jax_fine_tune_"))
  inputs = os.path.join(workdir, INPUTS)
  data_path = os.path.join(inputs, "arrays.npz")
  weights = os.path.join(inputs, "pretrained")
  called = _arguments(
    model,
    steps=steps,
    lr=lr,
    batch=batch,
    seed=seed,
    class_names=None if class_names is None else list(class_names),
    overrides=dict(overrides or {}),
    images=_digest(images),
    labels=_digest(labels),
    test_images=None if test_images is None else _digest(test_images),
    test_labels=None if test_labels is None else _digest(test_labels),
  )
  if not _check_same_run(workdir, called):  # a new run: this call's inputs
    os.makedirs(inputs, exist_ok=True)
    arrays.save_arrays(
      data_path,
      images,
      labels,
      test_images=test_images,
      test_labels=test_labels,
      class_names=class_names,
    )
    shutil.rmtree(weights, ignore_errors=True)
    model.save(weights)
    with open(os.path.join(inputs, ARGUMENTS_FILE), "w") as f:
      json.dump(called, f, indent=2, sort_keys=True)
  config = defaults.get_config()
  config.model = models.to_config(model.config)
  config.pretrained = os.path.join(weights, npz.EXPORT_FILE)
  config.dataset = arrays.PREFIX + data_path
  config.train_split = "train"
  config.test_split = "test" if test_images is not None else "train"
  config.num_classes = len(arrays.ArrayDataset(data_path).class_names)
  config.pp.crop = model.image_size[0]
  for key, value in data_config.to_run_pp(model.data_config).items():
    config.pp[key] = value  # the checkpoint's eval preprocessing stays the run's
  config.batch = config.batch_eval = batch or min(MAX_BATCH, len(np.asarray(labels)))
  config.total_steps = steps
  config.lr.base, config.lr.warmup_steps = lr, min(config.lr.warmup_steps, steps // 5)
  config.log_every = max(1, math.ceil(steps / REPORTS))
  config.eval_every = config.checkpoint_every = max(steps, 1)
  config.seed = seed
  for key, value in (overrides or {}).items():
    _set(config, key, value)
  from vit_jax import run  # pylint: disable=g-import-not-at-top  (the run: TensorFlow)

  bar = _ProgressBar(show=progress)
  try:
    run.train_and_evaluate(config, workdir, observer=bar)
  finally:
    bar.close()
  return workdir, bar.history


def _arguments(model: Any, **arguments: Any) -> dict[str, Any]:
  """A call's arguments as ``inputs/fine_tune.json`` holds them: the values given, the
  arrays (already digested) and the starting model by their digests."""
  config = models.to_config(model.config).to_json()
  model_digest = _digest(model.params, config, model.data_config.to_dict())
  return json.loads(json.dumps({**arguments, "model": model_digest}, default=repr))


def _check_same_run(workdir: str, called: dict[str, Any]) -> bool:
  """Whether ``workdir`` holds a run (a saved step) that these arguments started; a run
  that other arguments or another program started is one error naming what differs."""
  run = RunPaths(workdir)
  if not orbax_steps.finalized_steps(run.checkpoints):
    return False
  path = os.path.join(workdir, INPUTS, ARGUMENTS_FILE)
  if not os.path.isfile(path):
    raise errors.ResumeError(
      f"workdir={workdir!r} holds a run that fine_tune did not start (no {INPUTS}/"
      f"{ARGUMENTS_FILE}): pass another workdir, or none for a new temporary one."
    )
  with open(path) as f:
    started = json.load(f)
  changed = sorted(k for k in called if started.get(k) != called[k])
  if not changed:
    return True
  was = ", ".join(_argument(k, started.get(k)) for k in changed)
  now = ", ".join(_argument(k, called[k]) for k in changed)
  raise errors.ResumeError(
    f"workdir={workdir!r} holds a fine_tune run started with {was}; this call has {now}. "
    "Pass another workdir (or none) to train afresh, or the same arguments to get that "
    "run's model back; nothing was changed."
  )


def _argument(name: str, value: Any) -> str:
  """``name=value`` as the caller wrote it; arrays and the model by their digest."""
  if name == "model":
    return f"the model {value}"
  if name in ("images", "labels", "test_images", "test_labels") and value is not None:
    return f"{name} {value}"
  return f"{name}={value!r}"


def _digest(*values: Any) -> str:
  """A short fingerprint of arrays, trees of arrays or JSON-able values: shape, dtype
  and bytes of each leaf."""
  h = hashlib.sha256()
  for leaf in jax.tree.leaves(values):
    if isinstance(leaf, (str, int, float, bool)):
      h.update(repr(leaf).encode())
      continue
    a = np.ascontiguousarray(np.asarray(leaf))
    h.update(f"{a.dtype}{a.shape}".encode())
    h.update(a.tobytes())
  return "#" + h.hexdigest()[:12]


class _ProgressBar:
  """The run's reports (a `run.progress.Observer`) as a tqdm bar over its steps (loss,
  img/s; tqdm's ETA) and a line per evaluation, all kept in ``history``."""

  def __init__(self, show: bool):
    self.history = History()
    self.show = show
    self._bar: Optional[Any] = None

  def on_start(self, start_step: int, total_steps: int) -> None:
    if self.show:
      self._bar = tqdm.auto.tqdm(
        total=total_steps, initial=start_step, unit="step", desc="fine_tune"
      )

  def on_train(self, step: int, total_steps: int, scalars: Mapping[str, float]) -> None:
    self.history.on_train(step, total_steps, scalars)
    if self._bar is not None:
      loss, img_s = scalars.get("train/loss", math.nan), scalars.get("img_per_sec", 0.0)
      self._bar.set_postfix_str(f"loss {loss:.4f}, {img_s:.0f} img/s", refresh=False)
      self._bar.update(step - self._bar.n)

  def on_eval(self, step: int, total_steps: int, metrics: Mapping[str, float]) -> None:
    self.history.on_eval(step, total_steps, metrics)
    if step == total_steps:
      self.close()  # the bar ends full, above the final evaluation
    if self.show:
      values = " | ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items()))
      tqdm.auto.tqdm.write(f"step {step}/{total_steps} | {values}")

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
      self._bar = None


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
