"""A run's own train and eval steps compiled for a TPU slice or GPU nodes, and what they need.

    plan = make_plan(config, topology)   # compiles both steps for the slice's devices
    print(format_plan(plan)); plan.fits

The steps are the training command's: `vit_jax.run` resolves the config against a mesh
of the topology's devices (``config.mesh``), with ``accum_steps='auto'`` fitted to the
device's memory (on a GPU, JAX's allocator's share of it), and builds the same jitted
steps a run builds; they are lowered with abstract inputs and compiled, never run.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional

import jax
import ml_collections
from absl import logging

from vit_jax import models
from vit_jax import run as run_lib
from vit_jax.infra import sharding
from vit_jax.plan import budgets, gpu_estimate, gpu_topology, hlo, report
from vit_jax.plan.report import gib
from vit_jax.plan.topology import AnyTopology


@dataclasses.dataclass(frozen=True)
class Plan:
  """Everything `format_plan` prints; JSON-ready through `dataclasses.asdict`."""

  topology: str
  slice: str  # libtpu's name, e.g. 'v3:8x16'; the CUDA plugin's for GPUs, e.g. '1x1x8'
  device_kind: str
  chips: int
  devices: int
  processes: int
  mesh: dict[str, int]
  partitioning: str
  model: str
  dtype: str
  remat: bool
  crop: int
  num_classes: int
  batch: int
  accum_steps: int
  batch_per_device: int  # per micro-batch when accumulating
  batch_per_host: int
  params_bytes: int  # per device, from the state's shardings
  opt_state_bytes: int
  batch_bytes: int
  eval_batch: int
  eval_batch_bytes: int
  hbm_bytes: float  # one device's share of the chip's HBM (GPUs: JAX's allocator's share)
  budget_bytes: float  # hbm_bytes x (1 - the topology's headroom)
  train: report.Measure
  eval: report.Measure
  step_flops: Optional[float]  # all devices, one step
  flops_source: str  # 'xla' (its loops multiplied out), or 'analytic' (GPUs)
  model_flops_per_image: Optional[float]  # analytic
  time: Optional[report.StepTime]
  # The whole run (`report.RunTotals`): config.total_steps at the step bound.
  total_steps: int
  run_hours_at_bound: Optional[float]
  run_core_days: Optional[float]
  run_exaflops: Optional[float]
  run_exaflops_xla: Optional[float]
  memory_note: str = ""  # what hbm_bytes is, where not the device's whole HBM
  interconnect: str = "ICI"
  example: str = "image"  # what the batch counts: 'image', or 'image-text pair'
  towers: str = ""  # a two-tower model's text tower, loss and locked tower, in words
  # RandAugment (config.pp.randaug) compiled alone as the train step runs it: its share.
  augmentation: Optional[report.Measure] = None
  augmentation_time: Optional[report.StepTime] = None
  augmentation_route: str = ""
  # GPUs: the step (and RandAugment alone) priced at what a GPU measured (`gpu_estimate`).
  estimate: Optional[gpu_estimate.Estimate] = None
  augmentation_estimate: Optional[gpu_estimate.Estimate] = None
  budget_rows: tuple[budgets.BudgetRow, ...] = ()  # several NaFlex budgets: each one's step

  @property
  def fits(self) -> bool:
    steps = (self.train, self.eval)
    fit = all(m.memory is not None and m.memory.total <= self.budget_bytes for m in steps)
    return fit and all(row.fits for row in self.budget_rows)


def _mesh(config: ml_collections.ConfigDict, topology: AnyTopology) -> Any:
  return sharding.make_mesh(tuple(config.mesh), devices=topology.devices())


def _measure(
  what: str,
  where: str,
  lower: Callable[[], Any],
  num_devices: int,
  topology: AnyTopology,
  options: Any,
) -> tuple[report.Measure, Any]:
  """`report.measure` of the step ``lower()`` gives, with a log line when its compile
  starts and one when it ends (minutes for a large model on a small host). The line's
  compile time is the report's (``compile_seconds``: XLA's compile alone); the tracing,
  lowering and reading of the program around it are given apart, so one output never
  shows two compile times for one step."""
  logging.info("Compiling the %s for %s...", what, where)
  start = time.perf_counter()
  measured, compiled = report.measure(lower(), num_devices, topology.node_size, options)
  outcome = (
    f"needs >= {gib(measured.needed_bytes)} per device, refused by XLA"
    if compiled is None
    else f"{gib(measured.needed_bytes)} per device"
  )
  logging.info(
    "Compiled the %s in %.1f s (%s); %.1f s with tracing and reading the program.",
    what,
    measured.compile_seconds,
    outcome,
    time.perf_counter() - start,
  )
  return measured, compiled


def _towers(spec: Any, steps: Any) -> str:
  """A two-tower run in words: the text tower, the shared width, the loss and whether the
  image tower is locked (no gradient, no optimizer state); '' for any other model."""
  model = spec.model
  if not models.is_two_tower(model):
    return ""
  text = model.text
  locked = steps.objective.frozen
  return (
    f"image tower {model.image.name}; text tower width {text.width}, {text.depth} layers, "
    f"{model.text_len} tokens, pool {text.pool}; embeddings {model.embed_dim}; "
    f"{spec.objective.options.loss} loss over the global batch"
    + ("; image tower locked (no gradient, no optimizer state)" if locked else "")
  )


def make_plan(config: ml_collections.ConfigDict, topology: AnyTopology) -> Plan:
  """Compiles ``config``'s train and eval steps for ``topology``; see `Plan`."""
  mesh = _mesh(config, topology)
  chip = topology.chip
  hbm = topology.device_memory_bytes
  n = mesh.size
  slice_name = "" if topology.slice_name == topology.name else f"{topology.slice_name}, "
  where = f"{topology.name} ({slice_name}{n} {chip.device_kind} devices)"
  auto = " (accum_steps='auto': compiling candidate steps)" if config.accum_steps == "auto" else ""
  name = config.model.get("name", "the model")
  logging.info("Planning %s, batch %d, for %s%s.", name, config.batch, where, auto)
  # The class count comes from config.num_classes (the presets set it): no data is read.
  spec = run_lib.resolve(config, mesh=mesh, memory_limit_bytes=int(hbm), open_data=False)
  steps = run_lib.build_steps(spec, mesh)
  options = gpu_topology.COMPILER_OPTIONS if chip.platform == "cuda" else None
  train_batch, eval_batch = steps.abstract_train_batch(), steps.abstract_eval_batch()
  train, compiled = _measure(
    f"train step (batch {spec.batch}, accum_steps {spec.accum_steps})",
    where,
    lambda: steps.train_step.lower(steps.abstract_state, train_batch),
    n,
    topology,
    options,
  )
  evaluation, _ = _measure(
    f"eval step (batch {eval_batch['image'].shape[0]})",
    where,
    lambda: steps.eval_step.lower(steps.abstract_state.params, eval_batch),
    n,
    topology,
    options,
  )
  augmentation, augmentation_time, augmented = _augmentation(
    spec, steps, mesh, where, topology, options
  )
  mixed = budgets.plan_budgets(
    steps, chip, n, hbm * (1 - topology.headroom),
    lambda what, lower: _measure(what, where, lower, n, topology, options), (train, compiled),
  )  # fmt: skip
  per_image = steps.train_flops_per_example()
  step_flops, source, timing = report.train_step_time(
    train,
    compiled,
    chip,
    num_devices=n,
    model_flops=per_image and per_image * spec.batch,
    dtype=str(spec.model.dtype),
  )
  estimate = gpu_estimate.of_compiled(compiled, chip, timing)
  augmented = gpu_estimate.of_compiled(augmented, chip) if estimate else None
  data_size = mesh.shape[sharding.DATA_AXIS]
  totals = report.run_totals(
    total_steps=spec.loop.total_steps,
    batch=spec.batch,
    chip=chip,
    chips=topology.chips,
    bound_s=timing and timing.bound_s,
    train_flops_per_image=per_image,
    step_flops=step_flops,
  )
  return Plan(
    topology=topology.name,
    slice=topology.slice_name,
    device_kind=chip.device_kind,
    chips=topology.chips,
    devices=n,
    processes=topology.num_processes,
    mesh=dict(mesh.shape),
    partitioning=spec.partitioning,
    model=spec.model.name,
    dtype=str(spec.model.dtype),
    remat=bool(spec.model.remat),
    crop=spec.crop,
    num_classes=spec.num_classes,
    batch=spec.batch,
    accum_steps=spec.accum_steps,
    batch_per_device=spec.batch // (spec.accum_steps * data_size),
    batch_per_host=spec.batch // topology.num_processes,
    params_bytes=report.tree_bytes_per_device(steps.abstract_state.params),
    opt_state_bytes=report.tree_bytes_per_device(steps.abstract_state.opt_state),
    batch_bytes=report.tree_bytes_per_device(train_batch),
    eval_batch=eval_batch["image"].shape[0],
    eval_batch_bytes=report.tree_bytes_per_device(eval_batch),
    hbm_bytes=hbm,
    budget_bytes=hbm * (1 - topology.headroom),
    train=train,
    eval=evaluation,
    step_flops=step_flops,
    flops_source=source,
    model_flops_per_image=per_image,
    time=timing,
    total_steps=spec.loop.total_steps,
    run_hours_at_bound=totals.hours_at_bound,
    run_core_days=totals.core_days,
    run_exaflops=totals.exaflops,
    run_exaflops_xla=totals.exaflops_xla,
    memory_note=topology.memory_note,
    interconnect=chip.interconnect,
    example=models.family_of(spec.model).example,
    towers=_towers(spec, steps),
    augmentation=augmentation,
    augmentation_time=augmentation_time,
    augmentation_route=ROUTE if augmentation else "",
    estimate=estimate,
    augmentation_estimate=augmented,
    budget_rows=mixed,
  )


ROUTE = (
  "on the accelerator, in the train step: one image at a time, the drawn op alone, "
  "gather-free (data/randaug.py)"
)


def _augmentation(
  spec: Any, steps: Any, mesh: Any, where: str, topology: AnyTopology, options: Any
) -> tuple[Optional[report.Measure], Optional[report.StepTime], Any]:
  """RandAugment compiled alone for the slice, on the train batch the step gets (XLA's
  count, its loops multiplied out and its switch at the mean of its ops, `loop_cost`),
  its time at the bound and the compiled program; Nones for a run without it."""
  augment = spec.data.train_images.augmenter(mesh)
  if augment is None:
    return None, None, None
  batch, key = steps.abstract_train_batch(), steps.abstract_state.rng
  measured, compiled = _measure(
    f"RandAugment {spec.data.randaug}",
    where,
    lambda: jax.jit(augment).lower(batch, key),
    mesh.size,
    topology,
    options,
  )
  if compiled is None:
    return measured, None, None
  flops = measured.xla_flops * mesh.size
  timing = report.step_time(
    measured, topology.chip, num_devices=mesh.size, step_flops=flops, model_flops=None
  )
  return measured, timing, compiled


def _memory_rows(plan: Plan) -> list[tuple[str, str, str]]:
  def column(m: report.Measure, batch_bytes: int, state: bool) -> list[str]:
    known = [gib(plan.params_bytes), gib(plan.opt_state_bytes) if state else "-", gib(batch_bytes)]
    if m.memory is None:
      return known + ["-"] * 3 + [f">= {gib(m.needed_bytes)} (refused by XLA)"]
    mem = m.memory
    return known + [gib(mem.arguments), gib(mem.temporaries), gib(mem.code), gib(mem.total)]

  names = [
    "parameters",
    "optimizer state",
    "batch",
    "arguments (compiled)",
    "temporaries",
    "generated code",
    "total",
  ]
  train = column(plan.train, plan.batch_bytes, True)
  evaluation = column(plan.eval, plan.eval_batch_bytes, False)
  rows = list(zip(names, train, evaluation))

  def headroom(m: report.Measure) -> str:
    return f"{(plan.hbm_bytes - m.needed_bytes) / 2**30:+.2f} GiB"

  label = "memory JAX may use" if plan.memory_note else f"HBM ({plan.device_kind}, per device)"
  rows.append((label, gib(plan.hbm_bytes), f"budget {gib(plan.budget_bytes)}"))
  rows.append(("headroom", headroom(plan.train), headroom(plan.eval)))
  return rows


def _collective_line(totals: Optional[hlo.Totals]) -> str:
  if totals is None:
    return "-"
  parts = [
    f"{kind} {totals.runs[kind]} x, {gib(totals.bytes[kind])}"
    for kind in hlo.KINDS
    if totals.runs[kind]
  ]
  unknown = f" ({totals.unknown_trip_counts} loop(s) of unknown length counted once)"
  return ("; ".join(parts) or "none") + (unknown if totals.unknown_trip_counts else "")


def format_plan(plan: Plan) -> str:
  """The plan as the command prints it."""
  lines = [
    f"{plan.model} on {plan.topology} ({plan.slice}: {plan.chips} chips, {plan.devices} "
    f"devices of {plan.device_kind}, {plan.processes} host(s))",
    f"mesh {plan.mesh}, partitioning={plan.partitioning}, dtype={plan.dtype}, "
    f"remat={plan.remat}, crop {plan.crop}, {plan.num_classes} classes",
    *([plan.towers] if plan.towers else []),
    f"batch {plan.batch}: {plan.batch_per_device} per device"
    + (f" per micro-batch (accum_steps={plan.accum_steps})" if plan.accum_steps > 1 else "")
    + f", {plan.batch_per_host} per host; eval batch {plan.eval_batch}",
    "",
    f"{'per device':26s} {'train step':>22s} {'eval step':>22s}",
  ]
  lines += [f"  {name:24s} {a:>22s} {b:>22s}" for name, a, b in _memory_rows(plan)]
  if plan.memory_note:
    lines.append(f"  (memory JAX may use: {plan.memory_note})")
  lines.append("")
  if plan.step_flops:
    per_image = plan.step_flops / plan.batch
    analytic = plan.model_flops_per_image
    lines.append(
      f"FLOPs per step {plan.step_flops:.4g} ({plan.flops_source} count), per {plan.example} "
      f"{per_image:.4g}"
      + (f" (analytic {analytic:.4g})" if analytic and plan.flops_source != "analytic" else "")
    )
  if plan.train.unknown_trip_counts:
    lines.append(
      f"  ({plan.train.unknown_trip_counts} loop(s) of unknown trip count: their bodies' "
      "FLOPs and bytes counted once)"
    )
  lines.append(
    f"collectives per train step, per device: {_collective_line(plan.train.collectives)}"
  )
  if plan.time:
    t = plan.time
    network = f", network {t.network_s * 1e3:.1f} ms" if plan.processes > 1 and t.network_s else ""
    lines.append(
      f"step time >= {t.bound_s * 1e3:.1f} ms ({t.limited_by}-bound; compute "
      f"{t.compute_s * 1e3:.1f} ms, HBM {t.hbm_s * 1e3:.1f} ms, {plan.interconnect} "
      f"{t.ici_s * 1e3:.1f} ms{network})" + (f"; MFU at that bound {t.mfu:.0%}" if t.mfu else "")
    )
  if plan.estimate:
    lines.append(gpu_estimate.describe(plan.estimate))
  if plan.run_hours_at_bound is not None:
    lines.append(_run_line(plan))
  if plan.augmentation is not None:
    lines.append(_augmentation_line(plan))
  lines += budgets.lines(plan.budget_rows)
  seconds = (plan.train.compile_seconds, plan.eval.compile_seconds)
  lines.append(f"compiled in {seconds[0]:.1f} s (train), {seconds[1]:.1f} s (eval)")
  lines.append("fits" if plan.fits else "does not fit (below)")
  return "\n".join(lines)


def _run_line(plan: Plan) -> str:
  """The whole run at the bound: hours, TensorCore-days and total FLOPs."""
  flops = ""
  if plan.run_exaflops:
    flops = f"; {plan.run_exaflops:.4g} EFLOPs (analytic, 3 x forward per image)"
    if plan.run_exaflops_xla:
      flops += f", {plan.run_exaflops_xla:.4g} ({plan.flops_source} count)"
  hours = plan.estimate and f", ~{plan.total_steps * plan.estimate.step_s / 3600:.2f} h estimated"
  return (
    f"run: {plan.total_steps} steps >= {plan.run_hours_at_bound:.2f} h at that bound"
    f"{hours or ''}, "
    f"{plan.run_core_days:.3g} TensorCore-days{flops}"
  )


def _augmentation_line(plan: Plan) -> str:
  """RandAugment's share of the train step: FLOPs, HBM bytes and time at the bound."""
  aug, train = plan.augmentation, plan.train
  share = lambda part, whole: f" ({part / whole:.1%} of the step)" if whole else ""
  text = (
    f"RandAugment {plan.augmentation_route}; per device: {aug.xla_flops:.3g} FLOPs"
    f"{share(aug.xla_flops, (plan.step_flops or 0) / plan.devices)}, "
    f"{aug.xla_bytes_accessed / 1e9:.3g} GB of HBM"
    f"{share(aug.xla_bytes_accessed, train.xla_bytes_accessed)}"
  )
  if plan.augmentation_time and plan.time:
    bound = plan.augmentation_time.bound_s
    text += f", >= {bound * 1e3:.2f} ms at the bound{share(bound, plan.time.bound_s)}"
  if plan.augmentation_estimate and plan.estimate:
    step = plan.augmentation_estimate.step_s
    text += f", ~{step * 1e3:.1f} ms estimated{share(step, plan.estimate.step_s)}"
  return text


def shortfall(plan: Plan) -> str:
  """One message: which step needs how much more than the budget, and the levers."""
  worst_name, worst = max(
    (("train", plan.train), ("eval", plan.eval)), key=lambda item: item[1].needed_bytes
  )
  over = worst.needed_bytes - plan.budget_bytes
  levers = []
  if plan.partitioning != "fsdp":
    levers.append(
      f"config.partitioning=fsdp (now {plan.partitioning}: splits parameters and optimizer "
      f"state over the {plan.mesh.get(sharding.DATA_AXIS)} 'data' devices)"
    )
  if not plan.remat:
    levers.append("config.model.remat=True (recomputes activations in the backward pass)")
  levers.append(
    f"config.accum_steps (now {plan.accum_steps}; 'auto' picks the fewest micro-batches that fit)"
  )
  levers.append(
    f"a smaller batch per device (now {plan.batch_per_device}: a smaller config.batch or a "
    "larger slice)"
  )
  return (
    f"the {worst_name} step needs {gib(worst.needed_bytes)} per device, {gib(over)} more than "
    f"the budget of {gib(plan.budget_bytes)} ({plan.budget_bytes / plan.hbm_bytes:.0%} of the "
    f"{gib(plan.hbm_bytes)}"
    f"{' (' + plan.memory_note + ')' if plan.memory_note else ''} of a {plan.device_kind} "
    "device). Levers: " + "; ".join(levers) + "."
  )
