"""The training loop: runs a resolved run's compiled steps over its data, in its folder.

    metrics = train_and_evaluate(config, workdir)     # resolve + run
    metrics = run(spec, steps, workdir)               # a resolved run, built steps

Resuming restores the newest intact Orbax step and restarts the data stream at that step,
so a resumed run sees the batches an uninterrupted one would have. Every check (settings,
resume compatibility, the workdir's config.json) passes before the run writes anything.
"""

from __future__ import annotations

import collections
import itertools
import time
from typing import Any, Optional

import jax
import ml_collections
from absl import logging

from vit_jax import data, errors
from vit_jax.run import checkpoints as checkpoints_lib
from vit_jax.run import divergence, evaluators, resolver, step_cost
from vit_jax.run import folder as folder_lib
from vit_jax.run import progress as progress_lib
from vit_jax.run import steps as steps_lib
from vit_jax.run.spec import RunSpec

# Train steps dispatched ahead of the oldest unfinished one: enough to keep an accelerator
# busy. Unbounded, 2 CPU processes (gloo collectives) deadlocked at about 64 in flight.
MAX_STEPS_IN_FLIGHT = 4


def _tunables(spec: RunSpec) -> dict[str, Any]:
  """The settings a divergence error advises to change, by config key."""
  o = spec.optimizer
  return {
    "lr.base": o.lr_base,
    "lr.warmup_steps": o.warmup_steps,
    "optim.grad_clip_norm": o.grad_clip_norm,
    "optim.momentum_dtype": o.momentum_dtype,
    "model.dtype": spec.model.dtype,
  }


def _check_start(spec: RunSpec, steps: steps_lib.RunSteps, folder: folder_lib.RunFolder) -> bool:
  """Every check of the run against its folder, before anything is written; returns
  whether there is a step to resume."""
  resumable = checkpoints_lib.check_resume(
    folder.checkpoints,
    spec.data_identity(),
    steps.abstract_state,
    allow_changed_seed=spec.allow_changed_seed,
  )
  if spec.loop.total_steps == 0 and not spec.pretrained.source and not resumable:
    raise errors.ConfigError(
      "config.total_steps=0 only evaluates, but there is nothing to evaluate: no "
      "config.pretrained and no checkpoint in the workdir (it would evaluate a random "
      "initialization). Set config.pretrained=<.npz or <workdir>/checkpoints>, or "
      "config.total_steps > 0 to train."
    )
  folder.check_config(spec.config_json)
  return resumable


def _compile_train_step(steps: steps_lib.RunSteps) -> tuple[jax.stages.Compiled, Optional[float]]:
  """The train step compiled once up front, with its FLOPs per step (for MFU)."""
  start = time.perf_counter()
  compiled = steps.compile_train_step()
  flops, source = steps.step_flops(compiled)
  logging.info(
    "Compiled the train step in %.1f s: %s GFLOPs per step (%s count), "
    "%.2f GiB peak memory per device.",
    time.perf_counter() - start,
    f"{flops / 1e9:.4g}" if flops else "?",
    source,
    step_cost.peak_bytes(compiled) / 2**30,
  )
  return compiled, flops


def run(spec: RunSpec, steps: steps_lib.RunSteps, workdir: str) -> dict[str, float]:
  """Trains (or resumes) and evaluates ``spec`` in ``workdir``; returns the final metrics.

  ``total_steps=0`` only evaluates the initial (e.g. pretrained) parameters.
  """
  folder = folder_lib.RunFolder(workdir)
  _check_start(spec, steps, folder)
  folder.write_config(spec.config_json)
  loop = spec.loop
  manager = checkpoints_lib.RunCheckpoints(
    folder.checkpoints, keep=loop.keep_checkpoints, data=spec.data_identity()
  )
  state = manager.restore_latest(steps.abstract_state)
  guard = divergence.Guard(
    _tunables(spec), restored_step=None if state is None else int(jax.device_get(state.step))
  )
  if state is None:
    state = steps.init_state()
  start_step = int(jax.device_get(state.step))
  total_steps = loop.total_steps
  progress = progress_lib.Progress(
    folder.events, total_steps=total_steps, global_batch=spec.batch, start_step=start_step
  )
  logging.info(
    "Training %s on %s from step %d to %d on %d devices (mesh %s, %s).",
    spec.model.name,
    spec.data.dataset,
    start_step,
    total_steps,
    jax.device_count(),
    dict(steps.mesh.shape),
    spec.partitioning,
  )

  run_evaluators = evaluators.build_all(steps)
  metrics: dict[str, float] = {}
  train_iter = None
  try:
    if total_steps > start_step:
      train_iter = data.train_iterator(spec.data, steps.mesh, start_step=start_step)
      first_batch = next(train_iter)
      compiled_step, step_flops = _compile_train_step(steps)
      progress.start(step_flops, spec.model.dtype)
      batches = itertools.chain([first_batch], train_iter)
      in_flight: collections.deque = collections.deque()
      for step in range(start_step + 1, total_steps + 1):
        state, step_metrics = compiled_step(state, next(batches))
        in_flight.append(step_metrics)
        if len(in_flight) > MAX_STEPS_IN_FLIGHT:
          jax.block_until_ready(in_flight.popleft())
        if step % loop.log_every == 0 or step == total_steps:
          metrics = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
          guard.check(step, metrics)
          metrics["train/lr"] = float(steps.schedule(step - 1))
          metrics = progress.report_train(step, metrics)
        if step == total_steps:
          break  # the final evaluation follows the save
        for evaluator in run_evaluators.values():
          if step % evaluator.every == 0:
            progress.report_eval(step, evaluator(state.params))
        if step % loop.checkpoint_every == 0:
          guard.check_before_save(step, step_metrics, state.params)
          manager.save(step, state)
      guard.check_before_save(total_steps, step_metrics, state.params)
      manager.save(total_steps, state)
    final: dict[str, float] = {}
    for evaluator in run_evaluators.values():
      final.update(evaluator(state.params))
    progress.report_eval(total_steps, final)
  finally:
    # Stop the input pipeline's threads: tf.data still running at interpreter exit can
    # abort the process (status 134) after a successful run.
    if hasattr(train_iter, "close"):
      train_iter.close()
    # Whatever happened, the saves already started complete: no checkpoint is lost.
    manager.close()
    progress.close()
  return {**metrics, **final}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Resolves ``config`` on all devices (`resolve.build`), builds its steps and runs them."""
  steps = resolver.build(config)
  return run(steps.spec, steps, workdir)
