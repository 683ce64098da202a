"""Every use of a private JAX, jaxlib or Orbax API, in one module.

vit_jax needs a few things these packages do not make public (jax 0.10 and orbax-checkpoint
0.12 have no public API for them): whether a JAX backend has started, the accelerator
checks JAX itself makes, whether `import jax` found a Cloud TPU VM, XLA's cost analysis of
an HLO module, and Orbax's event-loop runner for a save. Each is a `Hook` in `HOOKS`,
looked up when first used (so importing this module imports none of them), never a silent
fallback: a hook the installed packages lack is one `MissingHookError` naming it, what
needs it and the installed versions. Two are newer than the oldest versions setup.py
allows, and vit_jax runs without them (``since``, ``without``): the AMD GPU check (jax
0.10.1) and Orbax's runner (orbax-checkpoint 0.12.5; before it Orbax ran its saves with
`asyncio.run`); their absence is one warning line naming the versions, once per process.
`tests/test_compat.py` resolves every hook against the installed packages.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
from typing import Any, Callable

from vit_jax.infra import errors

# The distributions whose versions a missing hook's error names.
_PACKAGES = ("jax", "jaxlib", "orbax-checkpoint")


@dataclasses.dataclass(frozen=True)
class Hook:
  """A private attribute ``module.name`` and what vit_jax uses it for (the error says);
  ``since``: the first version with it, where newer than setup.py's oldest; ``without``:
  what vit_jax does where it is missing (an optional hook: `optional`)."""

  module: str
  name: str
  use: str
  since: str | None = None
  without: str | None = None


HOOKS = {
  "backends_started": Hook(
    "jax._src.xla_bridge", "backends_are_initialized", "whether a JAX backend has started"
  ),
  "tpu_chips": Hook(
    "jax._src.hardware_utils", "num_available_tpu_chips_and_device_id", "TPU chips on the bus"
  ),
  "nvidia_gpu": Hook("jax._src.hardware_utils", "has_visible_nvidia_gpu", "a visible NVIDIA GPU"),
  "amd_gpus": Hook(
    "jax._src.hardware_utils",
    "num_available_amd_gpus",
    "visible AMD GPUs",
    since="jax 0.10.1",
    without="no AMD GPU is looked for (that JAX looks for none either)",
  ),
  "cloud_tpu_vm": Hook(
    "jax._src.cloud_tpu_init", "running_in_cloud_tpu_vm", "whether this is a Cloud TPU VM"
  ),
  "cost_analysis": Hook(
    "jaxlib._jax",
    "hlo_module_cost_analysis",
    "XLA's cost of an HLO module",
    since="jaxlib 0.7.0",  # jax 0.6 reads jaxlib.xla_extension instead
  ),
  "hlo_from_text": Hook("jaxlib._hlo", "hlo_module_from_text", "an HLO module from its text"),
  "orbax_loop_runner": Hook(
    "orbax.checkpoint._src.asyncio_utils",
    "_run_sync_via_new_loop",
    "Orbax's save-loop runner, to drain a save's loop before it closes",
    since="orbax-checkpoint 0.12.5",
    without="a save that fails (a full disk) may print Orbax's own tracebacks before its error",
  ),
}
_WARNED: set[str] = set()  # the optional hooks found missing (warned once)


class MissingHookError(errors.UserError):
  """The installed JAX, jaxlib or Orbax lacks a private API vit_jax uses."""


def versions() -> str:
  """The installed versions of `_PACKAGES`, e.g. ``jax 0.10.2, jaxlib 0.10.2, ...``."""
  found = []
  for package in _PACKAGES:
    try:
      found.append(f"{package} {importlib.metadata.version(package)}")
    except importlib.metadata.PackageNotFoundError:
      found.append(f"{package} (not installed)")
  return ", ".join(found)


def _missing(hook: Hook) -> str:
  """What the error or warning of a missing ``hook`` begins with."""
  where = f"{hook.module}.{hook.name}"
  return f"vit_jax uses {where} ({hook.use}), which the installed {versions()} lack"


def resolve(key: str) -> Any:
  """The attribute of hook ``key``; `MissingHookError` (one line) where it is missing."""
  hook = HOOKS[key]
  try:
    return getattr(importlib.import_module(hook.module), hook.name)
  except (ImportError, AttributeError):
    advice = f"{hook.since} or later" if hook.since else "the versions setup.py allows"
    raise MissingHookError(f"{_missing(hook)}: install {advice}.") from None


def optional(key: str) -> Any:
  """The attribute of optional hook ``key``, or None where it is missing (one warning line
  the first time: the versions, the one that has it, what vit_jax does without it)."""
  hook = HOOKS[key]
  try:
    return resolve(key)
  except MissingHookError:
    if key not in _WARNED:
      from absl import logging  # pylint: disable=g-import-not-at-top  # a hook's user has it

      _WARNED.add(key)
      logging.warning("%s (%s has it): %s.", _missing(hook), hook.since, hook.without)
    return None


def backends_started() -> bool:
  """Whether a JAX backend has started (its platform is fixed then)."""
  return bool(resolve("backends_started")())


def accelerator_attached() -> bool:
  """Whether a TPU chip is on the PCI bus or a GPU is visible: the checks JAX makes."""
  chips, _ = resolve("tpu_chips")()
  amd_gpus = optional("amd_gpus")
  return bool(chips or resolve("nvidia_gpu")() or (amd_gpus is not None and amd_gpus(stop_at=1)))


def on_cloud_tpu_vm() -> bool:
  """Whether `import jax` found a Cloud TPU VM (TPU chips and libtpu)."""
  return bool(resolve("cloud_tpu_vm"))


def hlo_from_text(text: str) -> Any:
  """The HLO module of ``text`` (its printed form)."""
  return resolve("hlo_from_text")(text)


def cost_analysis(client: Any, module: Any) -> dict[str, float]:
  """XLA's cost analysis ('flops', 'bytes accessed', ...) of HLO ``module`` on ``client``."""
  return resolve("cost_analysis")(client, module)


def replace_orbax_loop_runner(runner: Callable[[Any], Any]) -> bool:
  """Makes Orbax run each synchronous save coroutine with ``runner`` (process-wide);
  whether this Orbax has the runner (`optional`: a warning line where not)."""
  if optional("orbax_loop_runner") is None:
    return False
  hook = HOOKS["orbax_loop_runner"]
  setattr(importlib.import_module(hook.module), hook.name, runner)
  return True
