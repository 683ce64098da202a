"""From a config file's ConfigDict to a `RunSpec`: every check of a run's settings, once.

    spec = resolve(config, mesh=mesh)

Nothing is built or written here except what the checks need: the data's class count
and train size (read from the dataset unless ``open_data=False``), a hub name in
``config.pretrained`` fetched into the Hugging Face cache (or failed on, offline) before
anything compiles, and, for ``accum_steps='auto'``, compiled (never run) candidate steps.
Every problem is a `vit_jax.infra.errors.UserError` naming the config key, its value and the fix.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Optional

import jax
import ml_collections

from vit_jax import data, models, weights
from vit_jax.data.settings import Settings as DataSettings
from vit_jax.infra import errors, sharding
from vit_jax.models import backend_defaults, model_settings, naflex, posemb
from vit_jax.models.settings import Settings
from vit_jax.run import (
  defaults,
  evaluators,
  losses,
  memory_fit,
  objectives,
  resume_policy,
  step_cost,
)
from vit_jax.run import spec as spec_lib
from vit_jax.run import steps as steps_lib
from vit_jax.run.evaluators import instances
from vit_jax.run.mixup import MixupSettings
from vit_jax.run.optim import OptimizerSettings

# Loop settings: the smallest value each may take.
_LOOP_MINIMUM = {
  "total_steps": 0,
  "log_every": 1,
  "eval_every": 1,
  "checkpoint_every": 1,
  "keep_checkpoints": 1,
}


def _loop(config: ml_collections.ConfigDict) -> spec_lib.LoopSettings:
  for key, low in _LOOP_MINIMUM.items():
    value = config[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
      raise errors.ConfigError(f"config.{key}={value!r} must be an integer >= {low}.")
  return spec_lib.LoopSettings(**{key: config[key] for key in _LOOP_MINIMUM})


def _objective(config: ml_collections.ConfigDict) -> spec_lib.ObjectiveSettings:
  objectives.entry(config.objective).check(config)
  losses.check_loss(config.loss)
  losses.check_label_smoothing(config.label_smoothing)
  options = config.get(config.objective, ml_collections.ConfigDict())
  return spec_lib.ObjectiveSettings(
    config.objective,
    config.loss,
    float(config.label_smoothing),
    ml_collections.FrozenConfigDict(options),
  )


def _mixup(config: ml_collections.ConfigDict) -> MixupSettings:
  settings = MixupSettings.from_config(config)
  if settings.p and not objectives.entry(config.objective).trains_on_labels:
    raise errors.ConfigError(
      f"config.mixup.p={settings.p} mixes images and labels, which "
      f"config.objective={config.objective!r} does not train on: set config.mixup.p=0."
    )
  if settings.p and config.pp.get("seq_len") is not None:
    raise errors.ConfigError(
      f"config.mixup.p={settings.p} with config.pp.seq_len={config.pp.seq_len}: mixup "
      "blends square images; NaFlex rows of different grids do not blend. Set config.mixup.p=0."
    )
  return settings


def _check_crop(model: Settings, crop: int) -> None:
  """config.pp.crop is a whole number of patches along each side (hybrids: of the patch
  size times the ResNet root's stride), said with the key to change before the model
  would say it of an image size."""
  sh, sw = models.create_model(model, num_classes=None).input_stride
  unit = math.lcm(sh, sw)
  if crop % unit:
    what = "patch size" if model.resnet is None else "patch size times the ResNet stride"
    below, above = crop // unit * unit, (crop // unit + 1) * unit
    choices = f"{below} or {above}" if below else f"{above}"
    raise errors.ConfigError(
      f"config.pp.crop={crop} is not a multiple of the model's {what} {sh}x{sw} "
      f"(config.model.patches.size={tuple(model.patches.size)}): use config.pp.crop={choices}."
    )


def _check_naflex(image: Settings, data_settings: DataSettings) -> None:
  """config.pp.seq_len takes a ViT whose learned table is resized to each image's grid."""
  if data_settings.naflex is None:
    return
  what = f"config.pp.seq_len={data_settings.naflex.seq_len} (NaFlex inputs)"
  if models.is_mixer(image) or models.is_bit(image):
    raise errors.ConfigError(f"{what} takes a ViT, not an MLP-Mixer or a BiT ResNet.")
  naflex.check_model(image, what)


def _accum_steps(config: ml_collections.ConfigDict, batch: int, data_size: int) -> Any:
  accum = config.accum_steps
  if accum == memory_fit.AUTO:
    return accum
  if not isinstance(accum, int) or isinstance(accum, bool) or accum < 1:
    raise errors.ConfigError(f"config.accum_steps={accum!r} must be an integer >= 1 or 'auto'.")
  if batch % (accum * data_size):
    raise errors.ConfigError(
      f"config.batch={batch} is not divisible by config.accum_steps={accum} x {data_size} "
      f"devices on the 'data' mesh axis: choose a batch that is a multiple of "
      f"{accum * data_size}."
    )
  return accum


def _num_classes(
  config: ml_collections.ConfigDict, data_settings: DataSettings, info: Optional[data.DatasetInfo]
) -> tuple[int, Optional[int], Optional[tuple[str, ...]]]:
  """(classes, train examples, class names): from the data's ``info`` (the data rejects a
  contradicting config.num_classes), or config.num_classes alone when the data is not
  opened (``info`` None)."""
  if info is not None:
    names = tuple(info.class_names) if info.class_names else None
    _check_data_size(config, data_settings, info.num_train)
    return info.num_classes, info.num_train, names
  if not config.num_classes:
    raise errors.ConfigError(
      f"config.num_classes is not set and the data of {config.dataset!r} is not read "
      "here: set config.num_classes."
    )
  return int(config.num_classes), None, None


def _check_data_size(
  config: ml_collections.ConfigDict, settings: DataSettings, num_train: int
) -> None:
  """A train split that fills no global batch cannot train: refused before anything is
  written (what the objective needs of the data: its ``check_data``)."""
  if config.total_steps and num_train < settings.batch:
    raise errors.ConfigError(
      f"config.train_split={settings.train_split!r} of {settings.dataset!r} has {num_train} "
      f"examples, fewer than config.batch={settings.batch}: use a larger split or a "
      "smaller config.batch."
    )


def _process_count(mesh: jax.sharding.Mesh) -> int:
  return len({d.process_index for d in mesh.devices.flat})


def fit_accumulation(
  spec: spec_lib.RunSpec, mesh: jax.sharding.Mesh, memory_limit_bytes: Optional[int]
) -> spec_lib.RunSpec:
  """``spec`` with ``accum_steps='auto'`` replaced by the fewest micro-batches (then remat)
  whose compiled step fits ``memory_limit_bytes`` per device (None: no limit, 1)."""
  if spec.accum_steps != memory_fit.AUTO:
    return spec

  def compile_candidate(accum_steps: int, remat: bool) -> Optional[jax.stages.Compiled]:
    candidate = dataclasses.replace(spec, accum_steps=accum_steps)
    if remat != spec.model.remat:
      candidate = candidate.with_model(remat=remat)
    try:
      return steps_lib.build_steps(candidate, mesh).compile_train_step()
    except Exception as e:  # pylint: disable=broad-except
      if errors.is_out_of_memory(e):  # XLA:TPU refuses a step larger than HBM when compiling
        return None
      raise

  try:
    chosen = memory_fit.fit(
      compile_candidate,
      batch=spec.batch,
      data_size=mesh.shape[sharding.DATA_AXIS],
      limit_bytes=memory_limit_bytes,
      remat=spec.model.remat,
    )
  except ValueError as e:
    raise errors.ConfigError(str(e)) from e
  fitted = dataclasses.replace(spec, accum_steps=chosen.accum_steps)
  return fitted if chosen.remat == spec.model.remat else fitted.with_model(remat=chosen.remat)


def _check_memory(
  spec: spec_lib.RunSpec, mesh: jax.sharding.Mesh, limit: Optional[int], *, host: bool
) -> None:
  """Refuses a resolution and batch whose input batches or activations cannot fit, before
  anything is compiled: a lower bound (`step_cost.vit_activation_bytes`) against the
  device's memory (``limit``, else `memory_fit.per_device_limit`), and, when this
  machine will feed the run (``host``), its input batches against this machine's memory."""
  gib = 2.0**30
  what = f"the {limit / gib:.1f} GiB given for a device" if limit else ""
  if limit is None:
    limit, what = memory_fit.per_device_limit(mesh)
    what = f"{limit / gib:.1f} GiB, {what}" if limit else what
  settings = (
    f"config.pp.crop={spec.crop} with config.batch={spec.batch} and "
    f"config.accum_steps={spec.accum_steps}"
  )
  available = memory_fit.host_memory_available() if host else None
  images = spec.batch // _process_count(mesh)
  batch_bytes = images * spec.crop**2 * 3 * 4 * (spec.data.prefetch + 2)  # f32 [B, H, W, 3]
  if available and batch_bytes > available:
    raise errors.ConfigError(
      f"{settings}: the input pipeline's {spec.data.prefetch + 2} batches in flight take "
      f"{batch_bytes / gib:.1f} GiB of host memory, more than the {available / gib:.1f} GiB "
      "available: lower config.pp.crop, config.batch or config.prefetch."
    )
  micro_batch = spec.batch // (spec.accum_steps * mesh.shape[sharding.DATA_AXIS])
  platform = mesh.devices.flat[0].platform
  need = step_cost.vit_activation_bytes(
    spec.model, spec.crop, micro_batch, compiler_rematerializes=platform != "cpu"
  )
  if limit and need and need > limit:
    raise errors.ConfigError(
      f"{settings}: the train step keeps at least {need / gib:.1f} GiB of activations per "
      f"device ({micro_batch} images per device and micro-batch), more than {what}: "
      + errors.memory_advice(
        batch=spec.batch, accum_steps=spec.accum_steps, remat=spec.model.remat, crop=spec.crop
      )
      + "."
    )


def resolve(
  config: ml_collections.ConfigDict,
  *,
  mesh: jax.sharding.Mesh,
  memory_limit_bytes: Optional[int] = None,
  open_data: bool = True,
) -> spec_lib.RunSpec:
  """The checked `RunSpec` of ``config`` on ``mesh``; raises a UserError on a bad value.

  ``memory_limit_bytes``: a device's memory for ``accum_steps='auto'`` (default: what the
  mesh's first device reports; `vit_jax.plan` passes a TPU's HBM). ``open_data=False``
  takes the class count from ``config.num_classes`` without reading the dataset, and
  checks a hub name in ``config.pretrained`` without fetching it (`weights.check_source`).
  """
  defaults.check_complete(config)
  model = model_settings(config.model)
  # An unset attention or dtype: the backend's fastest (explicit settings kept).
  execution_choice = backend_defaults.choose(model, backend_defaults.platform(mesh.devices.flat))
  model = execution_choice.apply(model)
  loop = _loop(config)
  objective = _objective(config)
  optimizer = OptimizerSettings.from_config(config)
  data_settings = objectives.data_settings(config)
  _check_crop(models.image_settings(model), data_settings.crop)
  _check_naflex(models.image_settings(model), data_settings)
  sharding.logical_rules(config.partitioning)  # an unknown strategy fails by name
  evaluator_settings = evaluators.read_settings(config)
  pretrained_source = config.pretrained or None
  if pretrained_source:
    weights.check_source(pretrained_source, fetch=open_data)
  posemb.check_resize_method(config.posemb_resize)
  processes = _process_count(mesh)
  data.local_batch_size(data_settings.batch, mesh, "batch", processes)
  data.local_batch_size(data_settings.batch_eval, mesh, "batch_eval", processes)
  accum_steps = _accum_steps(config, data_settings.batch, mesh.shape[sharding.DATA_AXIS])
  info = data.dataset_info(data_settings) if open_data else None
  num_classes, num_train, class_names = _num_classes(config, data_settings, info)
  objectives.entry(config.objective).check_data(config, model, data_settings, info)
  if open_data:  # the named evaluations' data (config.evals), before anything is written
    instances.check_data(evaluator_settings.get("evals", ()), data_settings, num_classes)
  spec = spec_lib.RunSpec(
    model=model,
    num_classes=num_classes,
    num_train=num_train,
    data=data_settings,
    objective=objective,
    optimizer=optimizer,
    mixup=_mixup(config),
    loop=loop,
    pretrained=spec_lib.PretrainedSettings(
      pretrained_source, bool(config.reset_head), config.posemb_resize
    ),
    evaluators=evaluator_settings,
    mesh_axes=tuple(tuple(axis) for axis in config.mesh),
    partitioning=config.partitioning,
    accum_steps=accum_steps,
    seed=int(config.seed),
    allowed_changes=frozenset(s for s in resume_policy.SWITCHES if config[s]),
    config_json=_recorded(json.loads(config.to_json_best_effort()), execution_choice),
    class_names=class_names,
  )
  if memory_limit_bytes is None:
    memory_limit_bytes = memory_fit.device_memory_limit(memory_fit.local_device(mesh))
  spec = fit_accumulation(spec, mesh, memory_limit_bytes)
  _check_memory(spec, mesh, memory_limit_bytes, host=open_data)
  return spec


def _recorded(config_json: dict[str, Any], choice: backend_defaults.Choice) -> dict[str, Any]:
  """config.json with an unset model dtype recorded as the backend chose it: the run's record
  says what it computed in, and a run recorded before the unset default (its "float32")
  resumes on a CPU or TPU. An unset attention stays unset: it was always the backend's
  choice, and it changes no array."""
  model = config_json["model"]
  if model.get("dtype", "") is None:
    model["dtype"] = choice.dtype
  return config_json


def build(
  config: ml_collections.ConfigDict,
  *,
  mesh: Optional[jax.sharding.Mesh] = None,
  open_data: bool = True,
) -> steps_lib.RunSteps:
  """`resolve` then `steps.build_steps`, on ``mesh`` (default: ``config.mesh`` over all
  devices); the resolved spec is the result's ``spec``."""
  defaults.check_complete(config)
  mesh = mesh or sharding.make_mesh(tuple(config.mesh))
  return steps_lib.build_steps(resolve(config, mesh=mesh, open_data=open_data), mesh)
