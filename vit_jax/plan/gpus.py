"""The description XLA compiles against for a GPU that is not there.

`target_config` gives a GPU's `GpuTargetConfigProto` in text form (package data in
`gpu_targets/`), what `jax.experimental.topologies` needs to compile for it; the GPUs
themselves (`GPUS`: memory, peaks, NVLink, network) are `vit_jax.infra.hardware`'s.
"""

from __future__ import annotations

import importlib.resources

from vit_jax.infra.hardware import Chip


def target_config(gpu: Chip) -> str:
  """The GPU's `GpuTargetConfigProto` text (package data `gpu_targets/<name>.txtpb`)."""
  folder = importlib.resources.files("vit_jax.plan") / "gpu_targets"
  return (folder / f"{gpu.name}.txtpb").read_text()
