"""Cloud TPU slices by name, and their compile-only devices on a host without a TPU.

`parse('v3-256')` or `parse('v3:8x16')` gives a `Topology`; `Topology.devices()` asks
libtpu (installed by the `tpu` extra) for that slice's devices through
`jax.experimental.topologies`: programs compile for them, nothing runs.

Cloud names count TensorCores for v2, v3, v4 and v5p (`v3-256`: 128 chips of 2 cores)
and chips for v5e and v6e (`v5litepod-16`: 16 chips). The `vN:AxB[xC]` form gives the
chip grid itself, as libtpu and GKE spell it. GPU nodes (`h100x8`) are
`vit_jax.plan.gpu_topology`'s; `parse` gives either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
import re
import sys
import tempfile
from typing import Any, Iterator, Union

import jax

from vit_jax.infra import errors
from vit_jax.infra.hardware import CHIPS, Chip
from vit_jax.plan import gpu_topology
from vit_jax.run import memory_fit

# Cloud name prefix -> chip generation; libtpu's name of each generation.
CLOUD_PREFIXES: dict[str, str] = {
  "v2": "v2",
  "v3": "v3",
  "v4": "v4",
  "v5p": "v5p",
  "v5e": "v5e",
  "v5litepod": "v5e",
  "v6e": "v6e",
}
GRID_DIMS: dict[str, int] = {"v2": 2, "v3": 2, "v4": 3, "v5p": 3, "v5e": 2, "v6e": 2}
MEGACORE = ("v4", "v5p")  # two TensorCores as one JAX device
VALID_FORMS = (
  "a Cloud name (v2-8, v3-8 ... v3-2048, v4-32, v5p-128: TensorCores; v5litepod-16 or "
  "v5e-16, v6e-64: chips) or a chip grid vN:AxB[xC] (v3:8x16, v4:2x2x4, v5e:4x4, "
  "v5p:4x4x4, v6e:8x8); or " + gpu_topology.VALID_FORMS
)
_CLOUD = re.compile(r"^(v[0-9a-z]+)-(\d+)$")
_GRID = re.compile(r"^(v[0-9a-z]+):(\d+(?:x\d+){1,2})$")


@dataclasses.dataclass(frozen=True)
class Topology:
  """A TPU slice: its chip, chip grid, devices and hosts."""

  name: str  # as the user gave it
  chip: Chip
  grid: tuple[int, ...]  # chips along each axis of the interconnect

  @property
  def chips(self) -> int:
    return math.prod(self.grid)

  @property
  def num_devices(self) -> int:
    return self.chips * self.chip.devices_per_chip

  @property
  def libtpu_name(self) -> str:
    return f"{self.chip.name}:{'x'.join(map(str, self.grid))}"

  slice_name = libtpu_name

  @property
  def device_memory_bytes(self) -> float:
    """One device's share of the chip's HBM."""
    return self.chip.per_device(self.chip.hbm_bytes)

  memory_note = ""  # what `device_memory_bytes` is, where not the device's whole HBM
  # The share of it kept free: XLA's analysis omits the runtime's own buffers (the same
  # headroom as accum_steps='auto' leaves).
  headroom = memory_fit.HEADROOM
  node_size = None  # every collective goes over ICI (see `hlo.totals`)

  @property
  def chips_per_host(self) -> tuple[int, int, int]:
    """The chip grid of one host (one JAX process), as libtpu takes it.

    Slices of fewer than 4 chips, and v5e and v6e slices of up to 8, are one host; every
    other slice has hosts of 2x2 chips.
    """
    if self.chips < 4 or (not self.chip.cloud_counts_cores and self.chips <= 8):
      return (*self.grid, 1, 1)[:3]  # type: ignore[return-value]
    return (2, 2, 1)

  @property
  def num_processes(self) -> int:
    return max(1, self.chips // math.prod(self.chips_per_host))

  def devices(self) -> list[Any]:
    """The slice's compile-only devices (needs libtpu; see `require_libtpu`)."""
    require_libtpu()
    from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

    kwargs: dict[str, Any] = dict(chips_per_host_bounds=self.chips_per_host)
    if self.chip.name in MEGACORE:
      kwargs["chip_config_name"] = "megacore"
    # libtpu lets one process per host load it (a lock in /tmp) unless told otherwise:
    # planning holds no TPU, so several plans, or a plan beside a run, may load it.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    with _libtpu_log_captured():
      description = topologies.get_topology_desc(
        topology_name=self.libtpu_name, platform="tpu", **kwargs
      )
    return list(description.devices)


@contextlib.contextmanager
def _libtpu_log_captured() -> Iterator[None]:
  """Keeps what libtpu writes to stderr while it loads, unless the call fails.

  Off a TPU VM, libtpu logs that it found no TPU workers (harmless: planning compiles
  only). Its C++ logging writes to file descriptor 2, so the descriptor is redirected to a
  temporary file and its text re-emitted only with an error.
  """
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as log:
    os.dup2(log.fileno(), 2)
    try:
      yield
    except BaseException:
      os.dup2(saved, 2)
      log.seek(0)
      sys.stderr.write(log.read().decode(errors="replace"))
      raise
    finally:
      os.dup2(saved, 2)
      os.close(saved)


def require_libtpu() -> None:
  """Raises a `UserError` with the install line when libtpu is not installed."""
  if importlib.util.find_spec("libtpu") is None:
    raise errors.UserError(
      "Planning for a TPU needs libtpu (the TPU compiler), which is not installed: "
      f'pip install "jax[tpu]=={jax.__version__}" (or pip install -e ".[tpu]" in this '
      "repository)."
    )


def _near_square_grid(chips: int, dims: int) -> tuple[int, ...]:
  """Cloud's grid for a power-of-two chip count: v3-256 -> 8x16, v4-32 -> 2x2x4."""
  if dims == 2:
    x = 2 ** (int(math.log2(chips)) // 2)
    return (x, chips // x)
  if chips < 4:
    return (chips, 1, 1) if chips > 1 else (1, 1, 1)
  grid = [2, 2, 1]
  while math.prod(grid) < chips:  # double the last of the smallest axes
    smallest = min(grid)
    grid[max(i for i, g in enumerate(grid) if g == smallest)] *= 2
  return tuple(grid)


def _unknown(name: str, why: str) -> errors.UserError:
  return errors.UserError(f"--topology={name}: {why}. Valid forms: {VALID_FORMS}.")


AnyTopology = Union[Topology, gpu_topology.GpuTopology]


def parse(name: str) -> AnyTopology:
  """The `Topology` a Cloud name (`v3-256`) or a chip grid (`v3:8x16`) denotes, or the
  `gpu_topology.GpuTopology` of a GPU name (`h100x8`)."""
  gpu = gpu_topology.parse(name)
  if gpu is not None:
    return gpu
  text = name.strip().lower()
  cloud, grid = _CLOUD.match(text), _GRID.match(text)
  match = cloud or grid
  if match is None:
    raise _unknown(name, "not a TPU slice name")
  prefix = match.group(1)
  generation = CLOUD_PREFIXES.get(prefix)
  if generation is None:
    raise _unknown(name, f"unknown TPU version {prefix!r}")
  chip = CHIPS[generation]
  dims = GRID_DIMS[generation]
  if grid:
    shape = tuple(int(n) for n in match.group(2).split("x"))
    if len(shape) != dims or min(shape) < 1:
      raise _unknown(name, f"a {generation} grid has {dims} positive sizes")
    return Topology(name, chip, shape)
  count = int(match.group(2))
  chips = count // 2 if chip.cloud_counts_cores else count
  if chip.cloud_counts_cores and count % 2:
    raise _unknown(name, f"{prefix} names count TensorCores, an even number")
  if chips < 1 or chips & (chips - 1):
    raise _unknown(
      name, f"{chips} chips is not a power of two: give the grid as {generation}:AxB[xC]"
    )
  return Topology(name, chip, _near_square_grid(chips, dims))


def prepare_environment(target: AnyTopology) -> None:
  """Compile on the CPU backend: planning runs nothing, and a TPU of this host stays free."""
  if isinstance(target, gpu_topology.GpuTopology):
    gpu_topology.prepare_environment()
  else:
    jax.config.update("jax_platforms", "cpu")
