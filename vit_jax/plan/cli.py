r"""Plans a training run on a Cloud TPU slice or NVIDIA GPU nodes from any machine.

    python -m vit_jax.plan --config=configs/pretrain.py:b16,imagenet21k --topology=v3-256 \
        [--config.key=value ...] [--json] [--suggest]

Compiles the run's own train and eval steps for the slice (libtpu, from the `tpu` extra,
compiles for TPU devices without one; JAX's CUDA plugin, from the `gpu-plan` extra, for
GPUs: ``--topology=h100x8``) and prints per device: parameters, optimizer
state, batch, temporaries and code against the chip's memory; FLOPs per step and per
image; the collectives' bytes; a step-time lower bound with the MFU it implies; the
process count and per-host batch. Exit status 0 when the steps fit, 2 with one message
naming the shortfall and the settings that lower it (``--suggest`` compiles each).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any, Sequence

# vit_jax.cli first: it quiets TensorFlow's C++ logging, read when TensorFlow loads.
from vit_jax import cli as cli_lib  # isort: skip

import ml_collections
from absl import flags

from vit_jax import models
from vit_jax.infra import errors, sharding
from vit_jax.models import backend_defaults
from vit_jax.plan import gpu_topology, planner, report, topology

# --suggest halves the batch at most this many times looking for one that fits.
MAX_BATCH_HALVINGS = 4


def _parse(argv: Sequence[str]) -> dict[str, Any]:
  """The flag values; a `CommandLineError` for a bad command line."""
  flag_values = cli_lib.new_flag_values()
  holders = dict(
    config=cli_lib.define_config_flags(
      flag_values, argv, "The run's config file, e.g. configs/pretrain.py:b16,imagenet21k."
    ),
    topology=flags.DEFINE_string(
      "topology",
      None,
      f"The TPU slice or GPU nodes: {topology.VALID_FORMS}.",
      flag_values=flag_values,
    ),
    json=flags.DEFINE_bool("json", False, "Print the plan as JSON.", flag_values=flag_values),
    suggest=flags.DEFINE_bool(
      "suggest",
      False,
      "When the steps do not fit, compile each setting that lowers their memory.",
      flag_values=flag_values,
    ),
  )
  return cli_lib.parse_command_flags(flag_values, argv, holders, ("config", "topology"), __doc__)


def _variant(config: ml_collections.ConfigDict, **changes: Any) -> ml_collections.ConfigDict:
  """A copy of ``config`` with ``changes`` ({"dotted.key": value}) set."""
  variant = copy.deepcopy(config)  # keeps each field's type (accum_steps: int or 'auto')
  variant.update_from_flattened_dict(changes)
  return variant


def suggestions(
  config: ml_collections.ConfigDict, slice_: topology.AnyTopology, plan: planner.Plan
) -> list[str]:
  """What each lever gives, compiled: one line per setting tried."""
  lines = []
  if isinstance(slice_, gpu_topology.GpuTopology):  # the same programs, a larger allocator
    fraction = gpu_topology.LARGER_MEM_FRACTION
    budget = slice_.chip.hbm_bytes * fraction
    fits = max(plan.train.needed_bytes, plan.eval.needed_bytes) <= budget
    lines.append(
      f"  {gpu_topology.MEM_FRACTION_VARIABLE}={fraction} (environment): budget "
      f"{report.gib(budget)}, {'fits' if fits else 'does not fit'}"
    )
  tries: list[tuple[str, ml_collections.ConfigDict]] = []
  if plan.dtype == "float32":
    tries.append(("config.model.dtype=bfloat16", _variant(config, **{"model.dtype": "bfloat16"})))
  if plan.partitioning != "fsdp":
    tries.append(("config.partitioning=fsdp", _variant(config, partitioning="fsdp")))
  if not plan.remat:
    tries.append(("config.model.remat=True", _variant(config, **{"model.remat": True})))
  tries.append(("config.accum_steps=auto", _variant(config, accum_steps="auto")))
  unit = plan.mesh[sharding.DATA_AXIS] * plan.accum_steps
  batch = plan.batch
  for _ in range(MAX_BATCH_HALVINGS):
    batch = batch // 2 // unit * unit
    if batch < unit:
      break
    tries.append((f"config.batch={batch}", _variant(config, batch=batch)))
  for label, variant in tries:
    try:
      tried = planner.make_plan(variant, slice_)
    except Exception as e:  # pylint: disable=broad-except
      needed = report.too_large_bytes(e)  # accum_steps='auto' compiling a refused candidate
      if needed is None and not isinstance(e, errors.UserError):
        raise
      why = str(e) if needed is None else f"a step needs >= {report.gib(needed)}, too large"
      lines.append(f"  {label}: {why}")
      continue
    need = report.gib(tried.train.needed_bytes)
    verdict = "fits" if tried.fits else "does not fit"
    extra = f", accum_steps={tried.accum_steps}, remat={tried.remat}" if "accum" in label else ""
    bound = f", step >= {tried.time.bound_s * 1e3:.1f} ms" if tried.time else ""
    lines.append(f"  {label}: train step {need} per device, {verdict}{extra}{bound}")
    if label.startswith("config.batch=") and tried.fits:
      break
  return lines


def _plan(values: dict[str, Any]) -> int:
  config = values["config"]
  slice_ = topology.parse(values["topology"])
  topology.prepare_environment(slice_)
  # What the resolver chooses for an unset attention or dtype on this hardware, and why.
  execution = backend_defaults.choose(models.model_settings(config.model), slice_.chip.platform)
  if not values["json"]:
    print(execution.describe(), flush=True)
  plan = planner.make_plan(config, slice_)
  if values["json"]:
    found = {**dataclasses.asdict(plan), "fits": plan.fits, "execution": execution.describe()}
    print(json.dumps(found, indent=1))
  else:
    print(planner.format_plan(plan))
  if plan.fits:
    return 0
  if values["suggest"]:
    print("\nWith one setting changed (--suggest):")
    print("\n".join(suggestions(config, slice_, plan)))
  raise errors.OutOfMemoryError(planner.shortfall(plan))


def main(argv: Sequence[str]) -> int:
  """The command, callable in-process: parses ``argv`` (argv[0]: the program), plans and
  prints; the exit status."""
  return cli_lib.run_command(argv, _parse, _plan, context=lambda values: (None, values["config"]))
