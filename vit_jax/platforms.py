"""Keeps JAX off the TPU backend on hosts with libtpu installed but no TPU attached.

With libtpu installed (the `tpu` extra, for `vit_jax.plan`), JAX initialises its TPU
backend in every process that does not name its platforms, and on a host without a TPU
libtpu logs an error about missing TPU workers before JAX falls back to the CPU.
`cpu_unless_accelerator_attached()` sets ``jax_platforms='cpu'`` in exactly that case:
libtpu importable, no TPU chip on the PCI bus (the check JAX itself makes), no GPU
visible, and neither ``JAX_PLATFORMS`` nor ``jax_platforms`` chosen by the user. Call
it before anything touches a JAX backend.
"""

from __future__ import annotations

import importlib.util

import jax


def _accelerator_attached() -> bool:
  try:
    from jax._src import hardware_utils  # pylint: disable=g-import-not-at-top
  except ImportError:  # another JAX: assume there may be one
    return True
  chips, _ = hardware_utils.num_available_tpu_chips_and_device_id()
  amd = getattr(hardware_utils, "num_available_amd_gpus", lambda stop_at=None: 0)
  return bool(chips or hardware_utils.has_visible_nvidia_gpu() or amd(stop_at=1))


def cpu_unless_accelerator_attached() -> bool:
  """Chooses the CPU backend when only libtpu (no TPU) is present; whether it did."""
  if jax.config.jax_platforms or importlib.util.find_spec("libtpu") is None:
    return False
  if _accelerator_attached():
    return False
  jax.config.update("jax_platforms", "cpu")
  return True
