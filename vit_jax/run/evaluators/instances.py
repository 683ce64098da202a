"""Evaluations as named instances: any number of splits, of any datasets, in one run.

    config.evals.real = dict(kind="real", dataset="imagenet2012_real", split="validation",
                             label_key="original_label")
    config.evals.v2 = dict(dataset="imagenet_v2", split="test", every=2000)
    config.evals.v2_bicubic = dict(dataset="imagenet_v2", split="test",
                                   pp=dict(crop_pct=0.875, interpolation="bicubic"))

Each instance is evaluated every ``every`` steps (default: config.eval_every) and after
the last step, with the run's eval preprocessing (its crop and normalisation) changed by
the instance's ``pp`` (the keys of config.pp that say how an image becomes the crop:
crop_pct, crop_mode, interpolation, resizer, crop_offset; `data_config.with_run_keys`), and logs
``<name>/accuracy``, ``<name>/loss`` and ``<name>/examples``. ``kind`` is "accuracy" (the
top-1 of `accuracy.evaluate`, against ``label_key``) or "real" (ImageNet ReaL: the top-1
counted correct when it is in the image's set of labels ``real_key``, `real`). An omitted
``dataset`` or ``data_dir`` is the run's. The run's own test split (config.test_split,
logged as ``eval/...``) stays the default evaluation beside them; the instances are no
part of what a resume compares, so a resumed run may add or drop one.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Optional, Sequence

import ml_collections

from vit_jax import data
from vit_jax.data import data_config
from vit_jax.infra import errors
from vit_jax.run.evaluators import accuracy, real
from vit_jax.run.steps import RunSteps

KINDS = ("accuracy", "real")  # what an instance counts (module docstring)
_FIELDS = ("kind", "dataset", "split", "label_key", "real_key", "every", "data_dir", "pp")
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
# Metric prefixes of the run's other evaluators and of training: no instance takes them.
RESERVED = ("eval", "fewshot", "zeroshot", "train")


@dataclasses.dataclass(frozen=True)
class Instance:
  """One named evaluation, checked; None: the run's value (dataset, data_dir, every)."""

  name: str
  kind: str
  split: str
  dataset: Optional[str] = None
  label_key: str = "label"
  real_key: str = "real_label"  # kind "real": the feature of each image's label set
  every: Optional[int] = None
  data_dir: Optional[str] = None
  pp: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # eval preprocessing keys


def _instance(name: str, section: Any) -> Instance:
  """``config.evals.<name>`` as an `Instance`; one error line for a bad field."""
  where = f"config.evals.{name}"
  if not _NAME.match(name) or name in RESERVED:
    raise errors.ConfigError(
      f"{where}: the name {name!r} must be lower-case letters, digits and '_' and not one "
      f"of {RESERVED} (it prefixes the metrics, e.g. {name}/accuracy): rename it."
    )
  if isinstance(section, ml_collections.ConfigDict):
    section = section.to_dict()
  if not isinstance(section, Mapping):
    raise errors.ConfigError(
      f"{where}={section!r} must be a dict, e.g. dict(dataset='imagenet_v2', split='test')."
    )
  unknown = sorted(set(section) - set(_FIELDS))
  if unknown:
    raise errors.ConfigError(f"{where} has unknown fields {unknown}: use only {_FIELDS}.")
  fields = {k: v for k, v in dict(section).items() if v is not None}
  kind = fields.get("kind", "accuracy")
  if kind not in KINDS:
    raise errors.ConfigError(f"{where}.kind={kind!r} is not one of {KINDS}.")
  split = fields.get("split")
  if not isinstance(split, str) or not split:
    raise errors.ConfigError(f"{where}.split={split!r}: name the split, e.g. split='test'.")
  every = fields.get("every")
  if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 1):
    raise errors.ConfigError(f"{where}.every={every!r} must be an integer >= 1.")
  for key in ("dataset", "label_key", "real_key", "data_dir"):
    if key in fields and not isinstance(fields[key], str):
      raise errors.ConfigError(f"{where}.{key}={fields[key]!r} must be a string.")
  pp = fields.get("pp", {})
  if isinstance(pp, ml_collections.ConfigDict):
    fields["pp"] = pp = pp.to_dict()
  if not isinstance(pp, Mapping):
    raise errors.ConfigError(f"{where}.pp={pp!r} must be a dict, e.g. dict(crop_pct=0.875).")
  return Instance(name=name, **{**fields, "kind": kind})


def read(section: Optional[ml_collections.ConfigDict]) -> tuple[Instance, ...]:
  """config.evals (None or empty: no instances; a config.json written before it) checked."""
  if not section:
    return ()
  return tuple(_instance(name, section[name]) for name in section.keys())


def data_settings(run: data.Settings, instance: Instance) -> data.Settings:
  """The run's eval data settings (``run``: its ``spec.data``) with the instance's dataset,
  split, label feature and preprocessing."""
  where = f"config.evals.{instance.name}.pp"
  return dataclasses.replace(
    run,
    dataset=instance.dataset or run.dataset,
    data_dir=instance.data_dir or run.data_dir,
    train_split=instance.split,  # what dataset_info sizes; nothing trains on it
    test_split=instance.split,
    label_key=instance.label_key,
    num_classes=None,  # from the instance's data, checked against the head (`check_data`)
    eval_data=data_config.with_run_keys(run.eval_data_config(), instance.pp, where),
  )


def check_data(found: Sequence[Instance], run: data.Settings, num_classes: int) -> None:
  """Each instance's data opens and has the head's ``num_classes`` classes: checked when
  the run is resolved, before anything is written; an error names the instance."""
  for instance in found:
    settings = data_settings(run, instance)
    try:
      classes = data.dataset_info(settings).num_classes
    except errors.UserError as e:
      raise type(e)(f"config.evals.{instance.name}: {e}") from e
    if classes != num_classes:
      raise errors.ConfigError(
        f"config.evals.{instance.name}.dataset={settings.dataset!r} has {classes} classes, "
        f"the model's head {num_classes}: evaluate a dataset of the same classes."
      )


def build(steps: RunSteps) -> dict[str, Any]:
  """The evaluators of config.evals, by instance name (`Evaluator`s)."""
  built: dict[str, Any] = {}
  for instance in steps.spec.evaluators.get("evals", ()):
    settings = data_settings(steps.spec.data, instance)
    every = instance.every or steps.spec.loop.eval_every
    batches = data.eval_iterator(settings, steps.mesh)
    if instance.kind == "real":
      labels = real.label_sets(settings, instance.real_key)
      built[instance.name] = real.Real(every, real.top1_step(steps), batches, labels, instance.name)
    else:
      built[instance.name] = accuracy.Accuracy(
        every=every,
        eval_step=steps.eval_step,
        batches=batches,
        accuracy_metric=steps.objective.accuracy_metric,
        prefix=instance.name,
      )
  return built
