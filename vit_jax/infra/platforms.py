"""Keeps JAX off the TPU and GPU backends on hosts with their compilers but no accelerator.

With libtpu installed (the `tpu` extra, for `vit_jax.plan`), JAX initialises its TPU
backend in every process that does not name its platforms, and on a host without a TPU
libtpu logs an error about missing TPU workers before JAX falls back to the CPU; JAX's
CUDA plugin (the `gpu-plan` extra) logs a traceback (its CUDA check fails) on a host
without a GPU. `cpu_unless_accelerator_attached()` sets ``jax_platforms='cpu'`` in
exactly that case: libtpu or the plugin importable, no TPU chip on the PCI bus and no
GPU visible (the checks JAX itself makes), and neither ``JAX_PLATFORMS`` nor
``jax_platforms`` chosen by the user. Call it before anything touches a JAX backend.

`quiet_start` is the commands' start (`cli.run_command` calls it first), and a script's or
notebook's to call before its first JAX computation: TensorFlow's C++ log level and oneDNN
set before TensorFlow loads, then the CPU chosen as above. Without it, a script on such a
host prints the CUDA plugin's 20-line "Unable to load cuFFT" / "cuInit(0) failed"
traceback and libtpu's TPU warnings. Importing the package changes nothing (no variable,
no JAX setting): the private JAX checks go through `vit_jax.infra.compat`.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from vit_jax.infra import compat

# The share of each GPU's memory the commands let JAX's allocator take, unless the user
# sets XLA_PYTHON_CLIENT_MEM_FRACTION: JAX's own default (0.75) leaves a quarter of an
# 80 GB GPU unused; the 10% left is for what the allocator does not hold (the CUDA
# context, cuDNN's and NCCL's buffers). Read by the GPU plan as its memory budget.
GPU_MEMORY_FRACTION = 0.9
MEM_FRACTION_VARIABLE = "XLA_PYTHON_CLIENT_MEM_FRACTION"  # JAX's

# TensorFlow imports Keras's optimizers at its own import (to register them for SavedModels,
# ~3 s) and goes on without them when that import fails. Building a tfds dataset never
# uses Keras; Keras still imports normally if asked for later.
_KERAS_EAGER_IMPORTS = ("keras.src.optimizers", "tf_keras.src.optimizers")

# JAX's CUDA plugin modules, by CUDA major version (`jax[cuda13-local]` installs the first).
CUDA_PLUGINS = ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")


def installed(module: str) -> bool:
  """Whether ``module`` can be imported (False too when its parent package is missing, or
  an import hook refuses it)."""
  try:
    return importlib.util.find_spec(module) is not None
  except ImportError:
    return False


def import_tensorflow() -> None:
  """Imports TensorFlow, where installed and not yet imported, without its eager import of
  Keras (`_KERAS_EAGER_IMPORTS`): call it before tfds builds or reads a dataset with it."""
  if "tensorflow" in sys.modules or not installed("tensorflow"):
    return
  blocked = [name for name in _KERAS_EAGER_IMPORTS if name not in sys.modules]
  for name in blocked:
    sys.modules[name] = None  # `import name` raises ImportError, which TensorFlow skips
  try:
    import tensorflow  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import
  finally:
    for name in blocked:
      del sys.modules[name]


def cpu_unless_accelerator_attached() -> bool:
  """Chooses the CPU backend when only accelerator compilers (no TPU or GPU) are present;
  whether it did."""
  import jax  # pylint: disable=g-import-not-at-top  # here: the decode workers never import it

  if jax.config.jax_platforms or not any(map(installed, ("libtpu", *CUDA_PLUGINS))):
    return False
  if compat.accelerator_attached():
    return False
  jax.config.update("jax_platforms", "cpu")
  return True


def quiet_start() -> None:
  """The commands' quiet start, where the user has not chosen: TensorFlow's C++ lines at
  errors only (``TF_CPP_MIN_LOG_LEVEL=2``; ``0`` shows them), oneDNN off (only
  TensorFlow's own kernels use it, and its start-up notice ignores the log level), and
  `cpu_unless_accelerator_attached` unless a JAX backend has started (its platform is
  fixed then). Call it before TensorFlow loads."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
  if not compat.backends_started():
    cpu_unless_accelerator_attached()


def default_gpu_memory_fraction() -> None:
  """Gives JAX's GPU allocator `GPU_MEMORY_FRACTION` of each GPU where the user has not
  chosen (no effect on other platforms). Call it before a JAX backend starts."""
  os.environ.setdefault(MEM_FRACTION_VARIABLE, str(GPU_MEMORY_FRACTION))
