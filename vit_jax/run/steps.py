"""A run's compiled pieces, built apart from the loop: model, optimizer, shardings, steps.

    steps = build_steps(spec, mesh)
    state = steps.init_state()                      # or restored into steps.abstract_state
    state, metrics = steps.train_step(state, batch)

`build_steps` needs only a resolved `RunSpec` and a mesh: no data, no workdir, and the
mesh may hold compile-only devices (a TPU topology on a CPU host), since
`steps.train_step.lower(steps.abstract_state, steps.abstract_train_batch())` takes
abstract inputs (`jax.ShapeDtypeStruct`s with shardings) as well as real ones.

The step is the top-level pure `train_step`, jitted once with explicit in/out shardings
over the mesh and the state donated; the same code runs on one CPU, a GPU, a TPU host or
many hosts.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.experimental import multihost_utils

from vit_jax import models, weights
from vit_jax.data import randaug
from vit_jax.infra import sharding
from vit_jax.infra.aliases import Batch
from vit_jax.models import cost
from vit_jax.run import mixup, objectives, optim, step_cost
from vit_jax.run.spec import RunSpec

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


def _micro_batches(x: jax.Array, accum_steps: int) -> jax.Array:
  """[B, ...] -> [A, B/A, ...]: micro-batch j holds rows j, j + A, j + 2A, ..."""
  return jnp.swapaxes(x.reshape(x.shape[0] // accum_steps, accum_steps, *x.shape[1:]), 0, 1)


def train_step(
  state: TrainState,
  batch: Batch,
  *,
  loss_fn: Callable[[Any, Batch, jax.Array], jax.Array],
  tx: optax.GradientTransformation,
  accum_steps: int,
  mix: Optional[Callable[[Batch, jax.Array], Batch]] = None,
  augment: Optional[Callable[[Batch, jax.Array], Batch]] = None,
  accumulated_value_and_grad: Optional[
    Callable[[Any, Batch, jax.Array], tuple[jax.Array, Any]]
  ] = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer update from a global batch, in ``accum_steps`` (1: one) micro-batches.

  ``loss_fn(params, batch, rng)``: the objective's mean loss over a (micro-)batch, e.g.
  `objectives.classification.Classification.loss`. ``augment(batch, rng)``: RandAugment
  and normalisation of the pipeline's uint8-valued images (`data.randaug`), then
  ``mix(batch, rng)``: Mixup / CutMix (`run.mixup`), each of the whole batch before it is
  split, keyed by the step (and RandAugment by the row).

  Micro-batch j takes examples j, j + A, j + 2A, ... so that each one is spread over all
  devices; the mean of the micro-batch gradients equals the full-batch gradient. A loss
  that couples the batch's examples (a contrastive one) is not a mean over them: its
  objective's ``accumulated_value_and_grad(params, micro_batches [A, B/A, ...], rngs [A])``
  gives the loss over the whole batch and its gradient from the micro-batches.
  """
  step_rng = jax.random.fold_in(state.rng, state.step)
  if augment is not None:
    batch = augment(batch, jax.random.fold_in(step_rng, randaug.RNG_TAG))
  if mix is not None:
    batch = mix(batch, jax.random.fold_in(step_rng, mixup.RNG_TAG))
  grad_fn = jax.value_and_grad(loss_fn)
  if accum_steps == 1:
    loss_value, grads = grad_fn(state.params, batch, step_rng)
  elif accumulated_value_and_grad is not None:
    rngs = jax.vmap(lambda j: jax.random.fold_in(step_rng, j))(jnp.arange(accum_steps))
    micro = jax.tree.map(lambda x: _micro_batches(x, accum_steps), batch)
    loss_value, grads = accumulated_value_and_grad(state.params, micro, rngs)
  else:

    def accumulate(carry, micro):
      loss_sum, grad_sum = carry
      micro_batch, j = micro
      micro_loss, micro_grads = grad_fn(state.params, micro_batch, jax.random.fold_in(step_rng, j))
      return (loss_sum + micro_loss, jax.tree.map(jnp.add, grad_sum, micro_grads)), None

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    (loss_sum, grad_sum), _ = jax.lax.scan(
      accumulate,
      (jnp.zeros((), jnp.float32), zeros),
      (jax.tree.map(lambda x: _micro_batches(x, accum_steps), batch), jnp.arange(accum_steps)),
    )
    loss_value = loss_sum / accum_steps
    grads = jax.tree.map(lambda g: g / accum_steps, grad_sum)

  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {"train/loss": loss_value, "train/grad_norm": optax.tree.norm(grads)}
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def _global_array(value: np.ndarray, sharding_: jax.sharding.NamedSharding) -> jax.Array:
  """A host value (the same on every process) as a global array with ``sharding_``."""
  value = np.asarray(value)
  return jax.make_array_from_callback(value.shape, sharding_, lambda index: value[index])


@dataclasses.dataclass
class RunSteps:
  """What `build_steps` makes once for a run and a mesh."""

  spec: RunSpec
  mesh: jax.sharding.Mesh
  objective: objectives.Objective
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  state_shardings: TrainState  # a NamedSharding per leaf
  abstract_state: TrainState  # jax.ShapeDtypeStruct per leaf, with its sharding
  batch_sharding: jax.sharding.NamedSharding
  train_step: Any  # jax.jit(train_step) with shardings and donation
  eval_step: Any  # jax.jit(objective.eval_step)
  init: Any  # jax.jit: rng -> a fresh TrainState

  def _batch(self, size: int, fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """``fields``: name -> (per-example shape, dtype), or None to drop a field."""
    shapes = dict(
      # [B, H, W, 3] in [-1, 1] (RandAugment: 0..255); NaFlex: packed [B, N, P * P * 3 + 3]
      image=(self.spec.data.image_shape, jnp.float32),
      label=((self.spec.num_classes,), jnp.float32),  # [B, K] one-hot
      **self.objective.batch_fields,  # e.g. 'text': int32 [B, L]
    )
    shapes.update(fields, **extra)
    return {
      k: jax.ShapeDtypeStruct((size, *spec[0]), spec[1], sharding=self.batch_sharding)
      for k, spec in shapes.items()
      if spec is not None
    }

  def abstract_train_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
    """The global train batch as the input pipeline delivers it (and an objective's
    ``train_fields(crop)`` changes it: a LiT run's cached image features), abstract."""
    return self._batch(self.spec.batch, self.objective.train_fields(self.spec.crop))

  def abstract_eval_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
    """The global eval batch (with its padding ``mask`` [B]), abstract."""
    return self._batch(self.spec.data.batch_eval, {}, mask=((), jnp.float32))

  def at_budget(self, budget: int) -> "RunSteps":
    """These steps for the train batches of one NaFlex budget (`data.budget_mix`)."""
    data = self.spec.data.at_budget(budget)
    return dataclasses.replace(self, spec=dataclasses.replace(self.spec, data=data))

  def compile_train_step(self) -> jax.stages.Compiled:
    """The train step compiled for the abstract state and batch (no data needed)."""
    return self.train_step.lower(self.abstract_state, self.abstract_train_batch()).compile()

  def train_flops_per_example(self) -> Optional[float]:
    """The analytic FLOPs of one example of the train step: the objective's count where it
    has one (a two-tower's loss over the batch, a locked tower), else the family's."""
    count = self.objective.train_flops_per_example
    if count is not None:
      return count(self.spec.crop, self.spec.batch)
    naflex = self.spec.data.naflex
    if naflex is not None:  # a plain ViT (`models.naflex.check_model`): the budget's patches
      settings = models.image_settings(self.spec.model)
      return cost.vit_flops_per_image(
        settings, self.spec.crop, self.spec.num_classes, train=True, num_patches=naflex.seq_len
      )
    return step_cost.vit_flops_per_image(
      self.spec.model, self.spec.crop, self.spec.num_classes, train=True
    )

  def step_flops(self, compiled: jax.stages.Compiled) -> tuple[Optional[float], str]:
    """FLOPs of one compiled step over all devices, and their source (`step_cost.step_flops`)."""
    per_image = self.train_flops_per_example()
    return step_cost.step_flops(compiled, self.mesh.size, per_image and per_image * self.spec.batch)

  def init_state(self) -> TrainState:
    """A fresh state, with the spec's pretrained parameters when it names a source."""
    state = self.init(jax.random.PRNGKey(self.spec.seed))
    source = self.spec.pretrained
    if not source.source:
      return state
    # The whole fresh tree on every process (load_pretrained takes heads and position
    # embeddings from it): device_get fails on arrays split over several processes.
    init_params = multihost_utils.process_allgather(state.params, tiled=True)
    crop = self.spec.crop
    key = self.objective.pretrained_key  # a two-tower's image tower
    loaded = weights.load_pretrained(
      source.source,
      init_params[key] if key else init_params,
      models.image_settings(self.spec.model),
      reset_head=source.reset_head,
      posemb_resize_method=source.posemb_resize,
      new_grid_hw=self.objective.encoder.grid_hw((crop, crop)),
    )
    params = {**init_params, key: loaded} if key else loaded
    params = jax.tree.map(_global_array, params, self.state_shardings.params)
    opt_init = jax.jit(self.tx.init, out_shardings=self.state_shardings.opt_state)
    return state.replace(params=params, opt_state=opt_init(params))


@dataclasses.dataclass(frozen=True)
class BudgetSteps:
  """A run's compiled train steps, one per NaFlex budget, called as one: each batch goes
  to the step of its patches per image (`data.budget_mix`)."""

  by_budget: dict[int, jax.stages.Compiled]

  def __call__(self, state: TrainState, batch: dict[str, jax.Array]) -> Any:
    return self.by_budget[batch["image"].shape[1]](state, batch)  # image: [B, N, F]


def build_steps(spec: RunSpec, mesh: jax.sharding.Mesh) -> RunSteps:
  """The run's model, optimizer, state shardings and jitted steps over ``mesh``."""
  if not isinstance(spec.accum_steps, int):
    raise TypeError(f"accum_steps={spec.accum_steps!r}: resolve the run first (run.resolve).")
  objective = objectives.make(spec.model, spec.num_classes, spec.objective, mesh)
  tx, schedule = optim.make_optimizer(spec.optimizer)
  tx = optim.freeze(tx, objective.frozen)
  dummy = jax.ShapeDtypeStruct((1, spec.crop, spec.crop, 3), jnp.float32)

  def init_boxed(rng):
    params = objective.init(rng, jnp.zeros(dummy.shape, dummy.dtype))
    return TrainState(
      step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=rng
    )

  abstract = jax.eval_shape(init_boxed, jax.ShapeDtypeStruct((2,), jnp.uint32))
  state_shardings = sharding.state_shardings(abstract, mesh, spec.partitioning)
  abstract_state = jax.tree.map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
    nn.unbox(abstract),
    state_shardings,
  )
  on_cpu = mesh.devices.flat[0].platform == "cpu"
  replicated = sharding.replicated(mesh)
  batch_sharding = sharding.batch_sharding(mesh)
  return RunSteps(
    spec=spec,
    mesh=mesh,
    objective=objective,
    tx=tx,
    schedule=schedule,
    state_shardings=state_shardings,
    abstract_state=abstract_state,
    batch_sharding=batch_sharding,
    train_step=jax.jit(
      functools.partial(
        train_step,
        loss_fn=objective.loss,
        tx=tx,
        accum_steps=spec.accum_steps,
        accumulated_value_and_grad=objective.accumulated_value_and_grad,
        mix=mixup.make_mixer(spec.mixup, blocks=mesh.shape[sharding.DATA_AXIS]),
        augment=spec.data.train_images.augmenter(mesh),
      ),
      in_shardings=(state_shardings, batch_sharding),
      out_shardings=(state_shardings, replicated),
      donate_argnums=0,
    ),
    eval_step=jax.jit(
      objective.eval_step,
      in_shardings=(state_shardings.params, batch_sharding),
      out_shardings=replicated,
    ),
    init=jax.jit(
      lambda r: nn.unbox(init_boxed(r)),
      out_shardings=state_shardings,
      compiler_options=RUN_ONCE_CPU_COMPILER_OPTIONS if on_cpu else None,
    ),
  )
