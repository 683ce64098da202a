"""The training loop: runs a resolved run's compiled steps over its data, in its folder.

    metrics = train_and_evaluate(config, workdir)     # resolve, build, train
    metrics = train(steps, workdir)                   # built steps (`steps.spec`: the run)

Resuming restores the newest intact Orbax step and restarts the data stream at that step,
so a resumed run sees the batches an uninterrupted one would have. Every check (settings,
resume compatibility, the workdir's config.json) passes before the run writes anything.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import time
from typing import Any, Optional

import jax
import ml_collections
from absl import logging

from vit_jax import data
from vit_jax.infra import errors
from vit_jax.run import checkpoints as checkpoints_lib
from vit_jax.run import divergence, evaluators, memory_fit, preemption, resolver, step_cost
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


def _check_start(steps: steps_lib.RunSteps, folder: folder_lib.RunFolder) -> bool:
  """Every check of the run against its folder, before anything is written; returns
  whether there is a step to resume."""
  spec = steps.spec
  resumable = checkpoints_lib.check_resume(
    folder.checkpoints,
    spec.data_identity(),
    steps.abstract_state,
    allowed=spec.allowed_changes,
  )
  if spec.loop.total_steps == 0 and not spec.pretrained.source and not resumable:
    raise errors.ConfigError(
      "config.total_steps=0 only evaluates, but there is nothing to evaluate: no "
      "config.pretrained and no checkpoint in the workdir (it would evaluate a random "
      "initialization). Set config.pretrained=<.npz or <workdir>/checkpoints>, or "
      "config.total_steps > 0 to train."
    )
  folder.check_config(spec.config_json, allowed=spec.allowed_changes)
  return resumable


def _compile_train_step(steps: steps_lib.RunSteps) -> tuple[Any, Optional[float]]:
  """The train step compiled once up front (a run of several NaFlex budgets: one per
  budget, `steps_lib.BudgetSteps`), with its FLOPs per step (for MFU: the first budget's,
  about every budget's, as the tokens per step are); a step that needs more memory than a
  device has stops here, before it runs."""
  mix = steps.spec.data.budget_mix()
  if mix is None:
    return _compile_one(steps)
  compiled = {budget: _compile_one(steps.at_budget(budget)) for budget in mix.budgets}
  by_budget = {budget: step for budget, (step, _) in compiled.items()}
  return steps_lib.BudgetSteps(by_budget), compiled[mix.budgets[0]][1]


def _compile_one(steps: steps_lib.RunSteps) -> tuple[jax.stages.Compiled, Optional[float]]:
  """One train step compiled, with its FLOPs, its memory checked."""
  start = time.perf_counter()
  compiled = steps.compile_train_step()
  flops, source = steps.step_flops(compiled)
  peak = step_cost.peak_bytes(compiled)
  logging.info(
    "Compiled the train step in %.1f s: %s GFLOPs per step (%s count), "
    "%.2f GiB peak memory per device.",
    time.perf_counter() - start,
    f"{flops / 1e9:.4g}" if flops else "?",
    source,
    peak / 2**30,
  )
  limit, what = memory_fit.per_device_limit(steps.mesh)
  if limit and peak > limit:
    spec = steps.spec
    raise errors.OutOfMemoryError(
      f"The compiled train step needs {peak / 2**30:.2f} GiB per device, more than "
      f"{limit / 2**30:.2f} GiB ({what}): "
      + errors.memory_advice(
        batch=spec.batch, accum_steps=spec.accum_steps, remat=spec.model.remat, crop=spec.crop
      )
      + "."
    )
  return compiled, flops


def _compile_in_background(
  steps: steps_lib.RunSteps,
) -> concurrent.futures.Future[tuple[Any, Optional[float]]]:
  """Starts `_compile_train_step` on a thread: XLA compiles (without the GIL) while the
  state is initialized or restored and the input pipeline starts. Its result, or its
  error, is taken where the first step needs it."""
  pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="compile_train_step")
  future = pool.submit(_compile_train_step, steps)
  pool.shutdown(wait=False)
  return future


@dataclasses.dataclass
class _Session:
  """What one run of the loop writes to and answers to."""

  folder: folder_lib.RunFolder
  manager: checkpoints_lib.RunCheckpoints
  progress: progress_lib.Progress
  guard: divergence.Guard
  evaluators: dict[str, evaluators.Evaluator]
  stop: preemption.StopSignals
  compiling: concurrent.futures.Future[tuple[Any, Optional[float]]]


def _steps_until_done(
  steps: steps_lib.RunSteps, state: steps_lib.TrainState, session: _Session
) -> tuple[steps_lib.TrainState, dict[str, float]]:
  """Steps from the state's step to ``total_steps``, then saves; the last train metrics.

  Raises `preemption.Stopped` after saving the step in flight when a signal asks to stop.
  """
  spec = steps.spec
  folder, manager, progress, guard, stop = (
    session.folder,
    session.manager,
    session.progress,
    session.guard,
    session.stop,
  )
  loop, total_steps = spec.loop, spec.loop.total_steps
  start_step = int(jax.device_get(state.step))
  metrics: dict[str, float] = {}
  # a LiT run's image features (None: the batches as the pipeline makes them)
  transform = steps.objective.feature_cache(state.params, spec.num_train)
  train_iter = data.train_iterator(
    spec.data, steps.mesh, start_step=start_step, transform=transform
  )
  try:
    first_batch = next(train_iter)
    compiled_step, step_flops = session.compiling.result()
    if stop.signum is not None:
      raise preemption.Stopped(stop.signum, start_step, saved=False)
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
        folder.heartbeat()
      if step < total_steps and stop.should_stop(step):
        guard.check_before_save(step, step_metrics, state.params)
        manager.save(step, state)
        manager.wait_until_finished()
        raise preemption.Stopped(stop.signum, step, saved=True)
      if step == total_steps:
        break  # the final evaluation follows the save
      for evaluator in session.evaluators.values():
        if step % evaluator.every == 0:
          progress.report_eval(step, evaluator(state.params))
      if step % loop.checkpoint_every == 0:
        guard.check_before_save(step, step_metrics, state.params)
        manager.save(step, state)
        folder.heartbeat()
    guard.check_before_save(total_steps, step_metrics, state.params)
    manager.save(total_steps, state)
  finally:
    # Stop the input pipeline's threads (prefetch, Grain's, the reader's read-ahead) before
    # the run returns, so none is left reading at interpreter exit.
    train_iter.close()
  return state, metrics


def train(
  steps: steps_lib.RunSteps, workdir: str, observer: Optional[progress_lib.Observer] = None
) -> dict[str, float]:
  """Trains (or resumes) and evaluates the run ``steps`` were built for (``steps.spec``)
  in ``workdir``; returns the final metrics. ``observer`` is told each progress report
  and evaluation (`progress.Observer`).

  ``total_steps=0`` only evaluates the initial (e.g. pretrained) parameters. Every check
  (the settings, the folder's config and checkpoints, the pretrained weights' fit) passes
  before the first byte is written; then the run locks the folder (`RunFolder.lock`).
  SIGTERM / SIGINT stop it after saving the step in flight (`preemption`).
  """
  spec = steps.spec
  folder = folder_lib.RunFolder(workdir)
  resumable = _check_start(steps, folder)
  # A fresh run trains (unless total_steps=0); a resumed one only when its step is short.
  compiling = None if resumable or not spec.loop.total_steps else _compile_in_background(steps)
  # A fresh state is built before anything is written: pretrained weights that do not
  # fit the model fail here, leaving no config.json or checkpoints behind.
  fresh = None if resumable else steps.init_state()
  with folder.untouched_unless_saved(), preemption.StopSignals() as stop, folder.lock():
    manager = checkpoints_lib.RunCheckpoints(
      folder.checkpoints, keep=spec.loop.keep_checkpoints, data=spec.data_identity()
    )
    progress = None
    try:
      state = manager.restore_latest(steps.abstract_state) if resumable else None
      restored_step = None if state is None else int(jax.device_get(state.step))
      if state is None:
        state = fresh if fresh is not None else steps.init_state()
      start_step = int(jax.device_get(state.step))
      if compiling is None and start_step < spec.loop.total_steps:
        compiling = _compile_in_background(steps)
      folder.write_config(spec.config_json, step=start_step, class_names=spec.class_names)
      guard = divergence.Guard(_tunables(spec), restored_step=restored_step)
      total_steps = spec.loop.total_steps
      progress = progress_lib.Progress(
        folder.events,
        total_steps=total_steps,
        global_batch=spec.batch,
        start_step=start_step,
        observer=observer,
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
      session = _Session(
        folder, manager, progress, guard, evaluators.build_all(steps), stop, compiling
      )
      metrics: dict[str, float] = {}
      if total_steps > start_step:
        state, metrics = _steps_until_done(steps, state, session)
      final: dict[str, float] = {}
      for evaluator in session.evaluators.values():
        final.update(evaluator(state.params))
      progress.report_eval(total_steps, final)
    finally:
      # Whatever happened, the saves already started complete: no checkpoint is lost.
      manager.close()
      if progress is not None:
        progress.close()
  return {**metrics, **final}


def train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str,
  observer: Optional[progress_lib.Observer] = None,
) -> dict[str, float]:
  """Resolves ``config`` on all devices (`resolver.build`), builds its steps and runs them
  (``observer``: `train`'s)."""
  return train(resolver.build(config), workdir, observer)
