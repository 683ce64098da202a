"""NVIDIA GPU nodes by name, and their compile-only devices on a host without a GPU.

`parse('h100x8')` (one node of 8 H100s) or `parse('h100x8x4')` (4 such nodes) gives a
`GpuTopology`; `GpuTopology.devices()` asks JAX's CUDA plugin (installed by the `gpu-plan`
extra) for those GPUs through `jax.experimental.topologies`, with the GPU's target
description (`vit_jax.plan.gpus`) standing in for the missing hardware: programs compile
for them, nothing runs.

The plugin's topology string is ``<partitions>x<nodes>x<GPUs per node>``; each node is one
JAX process (its ``process_index``), as a launcher running one process per node makes it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Optional

import jax

from vit_jax.infra import errors, hardware, platforms
from vit_jax.infra.hardware import Chip
from vit_jax.plan import gpus

VALID_FORMS = (
  f"a GPU node <gpu>x<GPUs per node> or nodes <gpu>x<GPUs per node>x<nodes> with <gpu> one "
  f"of {', '.join(hardware.GPUS)} (h100x8, h200x8, a100x8, h100x8x4: 4 nodes of 8 H100s)"
)
_GPU_NAME = re.compile(r"^([a-z]\d+)x(\d+)(?:x(\d+))?$")
# jaxlib 0.10's XLA:GPU fails to pick Triton tiles for some of the model's matrix products
# ("Couldn't find output tile sizes"); with Triton GEMMs off they go to cuBLAS. Given to
# each compile of the plan, and as XLA_FLAGS to the compiles of accum_steps='auto'.
COMPILER_OPTIONS: dict[str, Any] = {"xla_gpu_enable_triton_gemm": False}
# The share of a GPU's memory JAX's allocator takes in the planned run: the variable where
# set, else what the commands set (`platforms.GPU_MEMORY_FRACTION`).
MEM_FRACTION_VARIABLE = platforms.MEM_FRACTION_VARIABLE
DEFAULT_MEM_FRACTION = platforms.GPU_MEMORY_FRACTION
# What --suggest offers beside it: 5% of the GPU left outside the allocator.
LARGER_MEM_FRACTION = 0.95


@dataclasses.dataclass(frozen=True)
class GpuTopology:
  """Nodes of GPUs on NVLink, joined by the network."""

  name: str  # as the user gave it
  chip: Chip  # one GPU
  gpus_per_node: int
  nodes: int

  @property
  def chips(self) -> int:
    return self.gpus_per_node * self.nodes

  num_devices = chips

  @property
  def slice_name(self) -> str:
    """The CUDA plugin's topology string."""
    return f"1x{self.nodes}x{self.gpus_per_node}"

  @property
  def num_processes(self) -> int:
    return self.nodes

  @property
  def node_size(self) -> Optional[int]:
    """GPUs per node where collectives may cross the network (see `hlo.totals`)."""
    return self.gpus_per_node if self.nodes > 1 else None

  @property
  def memory_fraction(self) -> float:
    """The share of each GPU's memory that JAX's allocator will have in the planned run."""
    text = os.environ.get(MEM_FRACTION_VARIABLE)
    try:
      return float(text) if text else DEFAULT_MEM_FRACTION
    except ValueError:
      raise errors.ConfigError(
        f"{MEM_FRACTION_VARIABLE}={text!r} is not a number: give the share of GPU memory JAX "
        f"may use, e.g. {DEFAULT_MEM_FRACTION}."
      ) from None

  @property
  def device_memory_bytes(self) -> float:
    """What one device's steps may use: JAX's share of the GPU's memory."""
    return self.chip.hbm_bytes * self.memory_fraction

  # The budget is the whole allocator's share: the GPU memory outside it is the headroom.
  headroom = 0.0

  @property
  def memory_note(self) -> str:
    return (
      f"{self.memory_fraction:.0%} of the GPU's {self.chip.hbm_bytes / 2**30:.2f} GiB: "
      f"{MEM_FRACTION_VARIABLE}, the commands' default {DEFAULT_MEM_FRACTION}"
    )

  def devices(self) -> list[Any]:
    """The GPUs as compile-only devices (needs the CUDA plugin; see `require_cuda_plugin`)."""
    require_cuda_plugin()
    from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

    description = topologies.get_topology_desc(
      platform="cuda", topology=self.slice_name, target_config=gpus.target_config(self.chip)
    )
    return list(description.devices)


def require_cuda_plugin() -> None:
  """Raises a `UserError` with the install line when JAX's CUDA plugin is not installed."""
  if not any(map(platforms.installed, platforms.CUDA_PLUGINS)):
    raise errors.UserError(
      "Planning for a GPU needs JAX's CUDA plugin (the GPU compiler), which is not "
      f'installed: pip install "jax[cuda13-local]=={jax.__version__}" nvidia-cudnn-cu13 '
      '(or pip install -e ".[gpu-plan]" in this repository).'
    )


def parse(name: str) -> Optional[GpuTopology]:
  """The `GpuTopology` that ``name`` denotes (``h100x8``, ``h100x8x4``); None for another form."""
  match = _GPU_NAME.match(name.strip().lower())
  if match is None or match.group(1) not in hardware.GPUS:
    return None
  per_node, nodes = int(match.group(2)), int(match.group(3) or 1)
  if not 1 <= per_node <= hardware.GPUS_PER_NODE or nodes < 1:
    raise errors.UserError(
      f"--topology={name}: a node has 1 to {hardware.GPUS_PER_NODE} GPUs and there is at least "
      f"one node. Valid forms: {VALID_FORMS}."
    )
  return GpuTopology(name, hardware.GPUS[match.group(1)], per_node, nodes)


def prepare_environment() -> None:
  """Compile on the CPU backend with the GPU compiler's flags; set before JAX's backends start.

  The CUDA plugin initialises only when ``jax_platforms`` leaves CUDA out (on a host with no
  GPU it otherwise fails), and XLA reads ``XLA_FLAGS`` once, when its first backend starts.
  """
  jax.config.update("jax_platforms", "cpu")
  flags = os.environ.get("XLA_FLAGS", "")
  missing = [f"--{k}={str(v).lower()}" for k, v in COMPILER_OPTIONS.items() if k not in flags]
  if missing:
    os.environ["XLA_FLAGS"] = " ".join([flags, *missing]).strip()
