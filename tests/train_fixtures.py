"""Configs and batches shared by the training tests and their subprocess scripts."""

import signal

import jax
import ml_collections
import numpy as np
import pytest
from flax import traverse_util

from configs import common, quickstart
from vit_jax import data, run
from vit_jax.models import get_model_config


def common_config(**overrides) -> ml_collections.ConfigDict:
  """`configs/common.py` with ``overrides`` (nested dicts merge into its sections): the code
  has no fallback values, so a test's hand-made config starts from every default."""
  config = common.get_config()
  config.update(overrides)
  return config


# The quickstart shrunk to seconds (with the `testing` model at 8x8): every test's tiny run.
TINY = {
  "pp.crop": 8,
  "batch": 16,
  "batch_eval": 64,
  "shuffle_buffer": 64,
  "total_steps": 6,
  "lr.warmup_steps": 2,
  "log_every": 2,
  "eval_every": 4,
  "checkpoint_every": 3,
}


def override(config: ml_collections.ConfigDict, values: dict) -> ml_collections.ConfigDict:
  """Sets ``{"dotted.key": value}`` on ``config`` (as `--config.dotted.key=value` would)."""
  for key, value in values.items():
    *parents, leaf = key.split(".")
    node = config
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  return config


def tiny_config(
  data_dir: str, base: ml_collections.ConfigDict | None = None, **overrides
) -> ml_collections.ConfigDict:
  """``base`` (default: the quickstart) shrunk by `TINY`, then ``overrides`` (keys with
  dots as ``__``: ``lr__warmup_steps=5``), reading digits from ``data_dir``."""
  config = base or quickstart.get_config()
  config.data_dir = data_dir
  config.model = get_model_config("testing")
  override(config, TINY)
  return override(config, {k.replace("__", "."): v for k, v in overrides.items()})


def trained_config(data_dir: str) -> ml_collections.ConfigDict:
  """The tiny run trained for 150 steps of 32 (a few seconds): a classifier far above
  chance, with 10-shot evaluation of digits at its last step (`conftest.trained_run`)."""
  config = tiny_config(
    data_dir,
    batch=32,
    batch_eval=128,
    shuffle_buffer=256,
    total_steps=150,
    lr__warmup_steps=10,
    log_every=50,
    eval_every=1000,
    checkpoint_every=1000,
  )
  config.fewshot.datasets = ("digits",)
  config.fewshot.shots = (10,)
  config.fewshot.every = 150
  return config


def step_config() -> ml_collections.ConfigDict:
  """The `testing` model at 8x8 with plain SGD: updates are linear in the gradient, so
  sharded and unsharded steps can be compared tightly."""
  config = quickstart.get_config()
  config.model = get_model_config("testing")
  config.pp.crop = 8
  config.batch = 16
  config.batch_eval = 16
  config.optim.name = "sgd"
  config.optim.weight_decay = 0.0
  config.lr.base = 0.5
  config.lr.warmup_steps = 0
  config.lr.decay = "constant"
  return config


def record_steps(trainer, state, batch, prefix: str, results: dict, steps: int = 2):
  """Takes ``steps`` train steps; records their losses (``<prefix>/loss``) and the final
  parameters (``<prefix>/params/<path>``) into ``results``; returns the final state."""
  losses = []
  for _ in range(steps):
    state, metrics = trainer.train_step(state, batch)
    losses.append(float(metrics["train/loss"]))
  results[f"{prefix}/loss"] = np.array(losses)
  for k, v in traverse_util.flatten_dict(jax.device_get(state.params), sep="/").items():
    results[f"{prefix}/params/{k}"] = np.asarray(v)
  return state


def fixed_batch(
  n: int = 16, image_size: int = 8, num_classes: int = 10, seed: int = 0
) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  images = rng.uniform(-1, 1, (n, image_size, image_size, 3)).astype(np.float32)
  labels = np.eye(num_classes, dtype=np.float32)[rng.integers(0, num_classes, n)]
  return {"image": images, "label": labels}


def run_preempted(config: ml_collections.ConfigDict, workdir: str, monkeypatch, steps: int = 4):
  """Runs `train_and_evaluate` until its input stops after ``steps`` batches (a preemption)."""
  real_iterator = data.train_iterator

  def preempted(*args, **kwargs):
    it = real_iterator(*args, **kwargs)
    for _ in range(steps):
      yield next(it)
    raise RuntimeError("preempted")

  with monkeypatch.context() as patch:
    patch.setattr(data, "train_iterator", preempted)
    with pytest.raises(RuntimeError, match="preempted"):
      run.train_and_evaluate(config, workdir)


# A run's process killed by SIGKILL once the checkpoint before batch `steps` + 1 is
# committed, while it asks for that batch (step `steps` dispatched): `run_sigkilled`.
_SIGKILLED_RUN = """
import json, os, signal, sys, time
import ml_collections
from vit_jax import data, run

config = ml_collections.ConfigDict(json.loads(sys.argv[1]))
workdir, steps = sys.argv[2], int(sys.argv[3])
every = config.checkpoint_every
saved = os.path.join(workdir, "checkpoints", str(steps // every * every))
real_iterator = data.train_iterator

def killed(*args, **kwargs):
  batches = real_iterator(*args, **kwargs)
  for _ in range(steps):
    yield next(batches)
  deadline = time.monotonic() + 120
  while not os.path.isdir(saved) and time.monotonic() < deadline:
    time.sleep(0.02)
  os.kill(os.getpid(), signal.SIGKILL)

data.train_iterator = killed
run.train_and_evaluate(config, workdir)
"""


def run_sigkilled(config: ml_collections.ConfigDict, workdir: str, monkeypatch, steps: int = 4):
  """Runs `train_and_evaluate` in a fresh process killed by SIGKILL as it asks for batch
  ``steps`` + 1, once the checkpoint before it is committed (``monkeypatch``: unused, the
  signature of `run_preempted`)."""
  del monkeypatch
  from tests import fresh_python  # pylint: disable=g-import-not-at-top

  args = ["-c", _SIGKILLED_RUN, config.to_json(), workdir, str(steps)]
  proc = fresh_python.run(args, fresh_python.clean_env())
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-4000:]


def build_steps(config: ml_collections.ConfigDict, num_classes: int = 10):
  """The run's `RunSteps` for ``config`` on all devices, resolved without reading its data."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.num_classes = num_classes
  return run.build(config, open_data=False)


def fit_and_learn(
  config: ml_collections.ConfigDict, steps: int = 6, num_classes: int = 10
) -> tuple[run.TrainState, list[float]]:
  """The tiny run every family test shares, without data, evaluation or checkpoints: the
  run's fresh state for ``config`` (its ``pretrained`` weights fitted as a run fits them),
  then ``steps`` train steps on one fixed batch at a constant learning rate; the state and
  the loss of each step."""
  import jax  # pylint: disable=g-import-not-at-top

  config = ml_collections.ConfigDict(config.to_dict())
  config.total_steps, config.lr.warmup_steps, config.lr.decay = steps, 0, "constant"
  run_steps = build_steps(config, num_classes)
  state = run_steps.init_state()
  batch = fixed_batch(config.batch, config.pp.crop, num_classes)
  batch = jax.device_put(batch, run_steps.batch_sharding)
  losses = []
  for _ in range(steps):
    state, metrics = run_steps.train_step(state, batch)
    losses.append(float(metrics["train/loss"]))
  return state, losses


def fit_notes(records) -> list[str]:
  """The fit's notes (`weights.load_pretrained`) among logging ``records``, in order."""
  notes = []
  for record in records:
    message = record.getMessage()
    if message.startswith("load_pretrained(") and "): " in message:
      notes.append(message.split("): ", 1)[1].removesuffix("."))
  return notes
