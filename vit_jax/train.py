"""Training: the train state, the pure `train_step`, and `train_and_evaluate(config, workdir)`.

The step is a top-level pure function jitted once with explicit in/out shardings over the
device mesh and the state donated; the same code runs on one CPU, a GPU, a TPU host or
many hosts. Resuming restores the newest intact Orbax step and restarts the data stream
at that step, so a resumed run sees the batches an uninterrupted one would have.
"""

from __future__ import annotations

import collections
import functools
import itertools
import os
import time
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tensorflow as tf
from absl import logging
from flax import struct
from jax.experimental import multihost_utils

from vit_jax import (
  data,
  divergence,
  errors,
  losses,
  memory_fit,
  objectives,
  optim,
  pretrained,
  run_checkpoints,
  run_checks,
  sharding,
  step_cost,
)
from vit_jax import evaluate as evaluate_lib
from vit_jax import progress as progress_lib
from vit_jax.aliases import Batch
from vit_jax.fewshot import evaluator as fewshot_lib

# Train steps dispatched ahead of the oldest unfinished one: enough to keep an accelerator
# busy. Unbounded, 2 CPU processes (gloo collectives) deadlocked at about 64 in flight.
MAX_STEPS_IN_FLIGHT = 4
# XLA options for programs that run once (initialization) on a CPU: without backend
# optimization the quickstart's init (dozens of random-initializer loops) compiles ~2.5x
# faster, and running it takes milliseconds either way.
RUN_ONCE_CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


@struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar
  params: Any
  opt_state: Any
  rng: jax.Array  # uint32[2]: the run's base key; per-step keys are folded from it


def train_step(
  state: TrainState,
  batch: Batch,
  *,
  loss_fn: Callable[[Any, Batch, jax.Array], jax.Array],
  tx: optax.GradientTransformation,
  accum_steps: int,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer update from a global batch, in ``accum_steps`` (1: one) micro-batches.

  ``loss_fn(params, batch, rng)``: the objective's mean loss over a (micro-)batch, e.g.
  `objectives.Classification.loss`.

  Micro-batch j takes examples j, j + A, j + 2A, ... so that each one is spread over all
  devices; the mean of the micro-batch gradients equals the full-batch gradient.
  """
  step_rng = jax.random.fold_in(state.rng, state.step)
  grad_fn = jax.value_and_grad(loss_fn)
  if accum_steps == 1:
    loss_value, grads = grad_fn(state.params, batch, step_rng)
  else:

    def split(x):  # [B, ...] -> [A, B/A, ...]
      return jnp.swapaxes(x.reshape(x.shape[0] // accum_steps, accum_steps, *x.shape[1:]), 0, 1)

    def accumulate(carry, micro):
      loss_sum, grad_sum = carry
      micro_batch, j = micro
      micro_loss, micro_grads = grad_fn(state.params, micro_batch, jax.random.fold_in(step_rng, j))
      return (loss_sum + micro_loss, jax.tree.map(jnp.add, grad_sum, micro_grads)), None

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    (loss_sum, grad_sum), _ = jax.lax.scan(
      accumulate,
      (jnp.zeros((), jnp.float32), zeros),
      (jax.tree.map(split, batch), jnp.arange(accum_steps)),
    )
    loss_value = loss_sum / accum_steps
    grads = jax.tree.map(lambda g: g / accum_steps, grad_sum)

  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {"train/loss": loss_value, "train/grad_norm": optax.tree.norm(grads)}
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def _check_batch_sizes(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> None:
  """Fails before compiling when a batch cannot be split as the run needs."""
  # The pipeline's own rule: batches split over the processes and the 'data' devices.
  data.local_batch_size(config.batch, mesh)
  data.local_batch_size(config.batch_eval, mesh, key="batch_eval")
  accum = config.accum_steps
  if accum == memory_fit.AUTO:
    return  # memory_fit chooses among the counts that divide the batch
  if not isinstance(accum, int) or accum < 1:
    raise errors.ConfigError(f"accum_steps={accum!r} must be an integer >= 1 or 'auto'.")
  data_size = mesh.shape[sharding.DATA_AXIS]
  if config.batch % (accum * data_size):
    raise errors.ConfigError(
      f"batch={config.batch} is not divisible by accum_steps={accum} x {data_size} devices "
      f"on the 'data' mesh axis: choose a batch that is a multiple of {accum * data_size}."
    )


def _global_array(value: np.ndarray, sharding: jax.sharding.NamedSharding) -> jax.Array:
  """A host value (the same on every process) as a global array with ``sharding``."""
  value = np.asarray(value)
  return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


class Trainer:
  """What `train_and_evaluate` builds once: mesh, model, optimizer, shardings, jitted steps."""

  def __init__(self, config: ml_collections.ConfigDict, num_classes: int):
    self.config = config
    self.mesh = sharding.make_mesh(tuple(config.mesh))
    _check_batch_sizes(config, self.mesh)
    self.objective = objectives.make(config, num_classes)
    self.model = self.objective.model
    self.tx, self.schedule = optim.make_optimizer(config)
    crop = config.pp.crop
    self._dummy = jnp.zeros((1, crop, crop, 3), jnp.float32)

    def init_boxed(rng):
      params = self.objective.init(rng, self._dummy)
      return TrainState(
        step=jnp.zeros((), jnp.int32), params=params, opt_state=self.tx.init(params), rng=rng
      )

    rng = jax.random.PRNGKey(config.seed)
    abstract = jax.eval_shape(init_boxed, rng)
    self.state_shardings = sharding.state_shardings(abstract, self.mesh, config.partitioning)
    self.abstract_state = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      nn.unbox(abstract),
      self.state_shardings,
    )
    self._rng = rng
    self._eval_batches: dict[Optional[str], Any] = {}
    on_cpu = self.mesh.devices.flat[0].platform == "cpu"
    self._init = jax.jit(
      lambda r: nn.unbox(init_boxed(r)),
      out_shardings=self.state_shardings,
      compiler_options=RUN_ONCE_CPU_COMPILER_OPTIONS if on_cpu else None,
    )
    self._num_classes = num_classes
    replicated = sharding.replicated(self.mesh)
    batch_sharding = sharding.batch_sharding(self.mesh)
    # accum_steps='auto': None until `compile_train_step` has fitted it.
    self.train_step = (
      None
      if config.accum_steps == memory_fit.AUTO
      else self._jit_train_step(self.objective, config.accum_steps)
    )
    self.step_flops: Optional[float] = None  # one step over all devices; see compile_train_step
    self.eval_step = jax.jit(
      self.objective.eval_step,
      in_shardings=(self.state_shardings.params, batch_sharding),
      out_shardings=replicated,
    )

  def init_state(self) -> TrainState:
    """A fresh state, with parameters from ``config.pretrained`` when it is set."""
    state = self._init(self._rng)
    source = self.config.pretrained
    if not source:
      return state
    # The whole fresh tree on every process (load_pretrained takes heads and position
    # embeddings from it): device_get fails on arrays split over several processes.
    init_params = multihost_utils.process_allgather(state.params, tiled=True)
    params = pretrained.load_pretrained(
      source,
      init_params,
      self.config.model,
      reset_head=self.config.reset_head,
      posemb_resize_method=self.config.posemb_resize,
      new_grid_hw=self.objective.encoder.grid_hw(self._dummy.shape[1:3]),
    )
    params = jax.tree.map(_global_array, params, self.state_shardings.params)
    opt_init = jax.jit(self.tx.init, out_shardings=self.state_shardings.opt_state)
    return state.replace(params=params, opt_state=opt_init(params))

  def _jit_train_step(self, objective: objectives.Objective, accum_steps: int) -> Any:
    return jax.jit(
      functools.partial(train_step, loss_fn=objective.loss, tx=self.tx, accum_steps=accum_steps),
      in_shardings=(self.state_shardings, sharding.batch_sharding(self.mesh)),
      out_shardings=(self.state_shardings, sharding.replicated(self.mesh)),
      donate_argnums=0,
    )

  def compile_train_step(self, state: TrainState, batch: Batch) -> jax.stages.Compiled:
    """The train step compiled once for these shapes; sets `step_flops` for MFU.

    ``accum_steps='auto'`` fits the accumulation (and remat) to the device memory first
    (`memory_fit`). The FLOPs come from XLA's cost analysis of the compiled step, or from
    the analytic ViT count where the step loops (scan, accumulation).
    """
    start = time.perf_counter()
    if self.config.accum_steps == memory_fit.AUTO:

      def compile_candidate(accum_steps: int, remat: bool) -> jax.stages.Compiled:
        objective = self.objective
        if remat != self.config.model.remat:
          config = ml_collections.ConfigDict(self.config.to_dict())
          config.model.remat = remat
          objective = objectives.make(config, self._num_classes)
        return self._jit_train_step(objective, accum_steps).lower(state, batch).compile()

      chosen = memory_fit.fit(
        compile_candidate,
        batch=self.config.batch,
        data_size=self.mesh.shape[sharding.DATA_AXIS],
        limit_bytes=memory_fit.device_memory_limit(self.mesh.devices.flat[0]),
        remat=self.config.model.remat,
      )
      compiled = chosen.compiled
    else:
      compiled = self.train_step.lower(state, batch).compile()
    per_image = step_cost.vit_flops_per_image(
      self.config.model, self.config.pp.crop, self._num_classes, train=True
    )
    self.step_flops, source = step_cost.step_flops(
      compiled, self.mesh.size, per_image and per_image * self.config.batch
    )
    logging.info(
      "Compiled the train step in %.1f s: %s GFLOPs per step (%s count), "
      "%.2f GiB peak memory per device.",
      time.perf_counter() - start,
      f"{self.step_flops / 1e9:.4g}" if self.step_flops else "?",
      source,
      step_cost.peak_bytes(compiled) / 2**30,
    )
    return compiled

  def evaluate(self, params: Any, split: Optional[str] = None) -> dict[str, float]:
    """Accuracy over the whole ``split`` (default: the config's test split)."""
    if split not in self._eval_batches:  # built once: each iteration is a full pass
      self._eval_batches[split] = data.eval_iterator(self.config, self.mesh, split=split)
    return evaluate_lib.evaluate(self.eval_step, params, self._eval_batches[split])


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains (or resumes) and evaluates as the config says; returns the final metrics.

  ``total_steps=0`` only evaluates the initial (e.g. pretrained) parameters.
  """
  tf.io.gfile.makedirs(workdir)
  losses.check_loss(config.loss)
  run_checks.check_loop(config)
  # config.num_classes, or the data's count; the data rejects a config that contradicts it.
  info = data.dataset_info(config)
  trainer = Trainer(config, info.num_classes)
  checkpoint_dir = os.path.join(workdir, "checkpoints")
  # What the run trains on, stored with each step: resuming on other data is an error.
  run_data = dict(
    dataset=config.dataset,
    train_split=config.train_split,
    test_split=config.test_split,
    num_train=info.num_train,
    seed=config.seed,
  )
  resumable = run_checkpoints.check_resume(
    checkpoint_dir, run_data, trainer.abstract_state, allow_changed_seed=config.allow_changed_seed
  )
  run_checks.check_evaluate_only(config, resumable=resumable)
  run_checks.write_or_compare_config(config, workdir)

  manager = run_checkpoints.RunCheckpoints(
    checkpoint_dir, keep=config.keep_checkpoints, data=run_data
  )
  state = manager.restore_latest(trainer.abstract_state)
  guard = divergence.Guard(
    config, restored_step=None if state is None else int(jax.device_get(state.step))
  )
  if state is None:
    state = trainer.init_state()
  start_step = int(jax.device_get(state.step))
  total_steps = config.total_steps
  progress = progress_lib.Progress(
    workdir, total_steps=total_steps, global_batch=config.batch, start_step=start_step
  )
  logging.info(
    "Training %s on %s from step %d to %d on %d devices (mesh %s, %s).",
    config.model.name,
    config.dataset,
    start_step,
    total_steps,
    jax.device_count(),
    dict(trainer.mesh.shape),
    config.partitioning,
  )

  fewshot = fewshot_lib.from_config(config, trainer.mesh)
  metrics: dict[str, float] = {}
  fewshot_metrics: dict[str, float] = {}
  train_iter = None
  try:
    if total_steps > start_step:
      train_iter = data.train_iterator(config, trainer.mesh, start_step=start_step)
      first_batch = next(train_iter)
      # Compiled once here (not on the first call) to read its FLOPs for MFU.
      compiled_step = trainer.compile_train_step(state, first_batch)
      progress.start(trainer.step_flops, config.model.dtype)
      batches = itertools.chain([first_batch], train_iter)
    in_flight: collections.deque = collections.deque()
    for step in range(start_step + 1, total_steps + 1):
      state, step_metrics = compiled_step(state, next(batches))
      in_flight.append(step_metrics)
      if len(in_flight) > MAX_STEPS_IN_FLIGHT:
        jax.block_until_ready(in_flight.popleft())
      if step % config.log_every == 0 or step == total_steps:
        metrics = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
        guard.check(step, metrics)
        metrics["train/lr"] = float(trainer.schedule(step - 1))
        metrics = progress.report_train(step, metrics)
      if step % config.eval_every == 0 and step != total_steps:
        progress.report_eval(step, trainer.evaluate(state.params))
      if fewshot is not None and step % config.fewshot.every == 0:
        fewshot_metrics = fewshot_lib.as_metrics(fewshot(state.params))
        progress.report_eval(step, fewshot_metrics)
      if step % config.checkpoint_every == 0 and step != total_steps:
        guard.check_before_save(step, step_metrics, state.params)
        manager.save(step, state)

    if total_steps > start_step:
      guard.check_before_save(total_steps, step_metrics, state.params)
      manager.save(total_steps, state)
    final = trainer.evaluate(state.params)
    progress.report_eval(total_steps, final)
  finally:
    # Stop the input pipeline's threads: tf.data still running at interpreter exit can
    # abort the process (status 134) after a successful run.
    if hasattr(train_iter, "close"):
      train_iter.close()
    # Whatever happened, the saves already started complete: no checkpoint is lost.
    manager.close()
    progress.close()
  return {**metrics, **fewshot_metrics, **final}
