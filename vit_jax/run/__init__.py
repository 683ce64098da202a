"""A training run: resolve a config once, build its steps, run the loop in a run folder.

    from vit_jax import run
    from vit_jax.infra import sharding
    mesh = sharding.make_mesh(tuple(config.mesh))
    spec = run.resolve(config, mesh=mesh)          # checked, immutable `RunSpec`
    steps = run.build_steps(spec, mesh)            # model, optimizer, shardings, jitted steps
    metrics = run.train(steps, workdir)            # the loop (steps.spec: the run)
    steps = run.build(config)                      # the first two
    metrics = run.train_and_evaluate(config, workdir)   # all three

Modules: `spec` (the run's settings), `resolve` (every check, once), `steps` (the pure
`train_step` and what is compiled), `loop`, `folder` (the run folder's layout),
`checkpoints` (its Orbax steps), `objectives` and `evaluators` (registries by name),
`optim`, `losses`, `memory_fit` (memory probes, ``accum_steps='auto'``), `step_cost` (FLOPs, memory,
peak), `progress` (the progress line, TensorBoard), `divergence` (the non-finite guard).
"""

from vit_jax.run.folder import RunFolder
from vit_jax.run.loop import train, train_and_evaluate
from vit_jax.run.resolver import build, resolve
from vit_jax.run.spec import RunSpec
from vit_jax.run.steps import RunSteps, TrainState, build_steps, train_step

__all__ = [
  "RunFolder",
  "RunSpec",
  "RunSteps",
  "TrainState",
  "build",
  "build_steps",
  "resolve",
  "train",
  "train_and_evaluate",
  "train_step",
]
