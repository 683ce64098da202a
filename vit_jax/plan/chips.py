"""What one Cloud TPU chip offers: memory, peak FLOP/s, bandwidths, chips per host.

(`Chip` describes the GPUs of `vit_jax.plan.gpus` too.)

Figures are Google's published per-chip specifications (the Cloud TPU system architecture
pages, cloud.google.com/tpu/docs/<version>), except the interconnect of v2-v4, which those
pages do not list: it comes from Google's papers on those systems (cited per entry).

A JAX device is one TensorCore on v2 and v3 (two per chip, each with half of the chip's
memory and compute) and one chip on v4 and later (v4 and v5p join their two TensorCores
into one "megacore" device; v5e and v6e have one TensorCore per chip). `Chip.per_device`
divides by `devices_per_chip` accordingly.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One chip generation; every figure is per chip, bytes and FLOP/s as published."""

  name: str  # the Cloud name's prefix: 'v3', 'v5e', ...
  device_kind: str  # what `jax.Device.device_kind` reports for its devices
  hbm_bytes: float
  peak_flops: float  # dense bf16 matrix-unit peak; f32 products run as bf16 passes
  hbm_bytes_per_s: float
  ici_bytes_per_s: float  # bidirectional inter-chip interconnect, all links of the chip
  devices_per_chip: int
  chips_per_host: int  # chips of one host (one JAX process) in a multi-host slice
  cloud_counts_cores: bool  # 'v3-256' counts TensorCores (v2-v4, v5p), 'v5e-16' chips
  # GPUs (`vit_jax.plan.gpus`): the links of ``ici_bytes_per_s`` are NVLink within a node,
  # and collectives between nodes go over the network at ``network_bytes_per_s``
  # (bidirectional, per GPU); f32 products run as TF32 at ``f32_peak_flops``.
  platform: str = "tpu"  # JAX's platform of its devices: 'tpu' or 'cuda'
  interconnect: str = "ICI"
  network_bytes_per_s: Optional[float] = None
  f32_peak_flops: Optional[float] = None

  def per_device(self, value: float) -> float:
    """A per-chip figure shared by the chip's JAX devices."""
    return value / self.devices_per_chip

  def peak_flops_for(self, dtype: str) -> float:
    """One device's dense peak for products computed in ``dtype`` ('float32', 'bfloat16')."""
    peak = self.f32_peak_flops if dtype == "float32" and self.f32_peak_flops else self.peak_flops
    return self.per_device(peak)


CHIPS: dict[str, Chip] = {
  chip.name: chip
  for chip in (
    # cloud.google.com/tpu/docs/v2: 45 TFLOP/s, 16 GiB HBM at 600 GB/s per chip, 2
    # TensorCores. ICI: 4 links of 496 Gbit/s (Jouppi et al., "A Domain-Specific
    # Supercomputer for Training Deep Neural Networks", CACM 2020, Table 3).
    Chip("v2", "TPU v2", 16 * GIB, 45e12, 600e9, 4 * 496e9 / 8, 2, 4, True),
    # cloud.google.com/tpu/docs/v3: 123 TFLOP/s bf16, 32 GiB HBM2 at 900 GB/s per chip,
    # 2 TensorCores. ICI: 4 links of 656 Gbit/s (the same table).
    Chip("v3", "TPU v3", 32 * GIB, 123e12, 900e9, 4 * 656e9 / 8, 2, 4, True),
    # cloud.google.com/tpu/docs/v4: 275 TFLOP/s, 32 GiB HBM2 at 1200 GB/s per chip.
    # ICI: 6 links of 50 GB/s (Jouppi et al., "TPU v4: An Optically Reconfigurable
    # Supercomputer for Machine Learning ...", ISCA 2023).
    Chip("v4", "TPU v4", 32 * GIB, 275e12, 1200e9, 6 * 50e9, 1, 4, True),
    # The HBM that the v5e, v5p and v6e pages give as "16 GB", "95 GB" and "32 GB" is
    # GiB-sized: libtpu's compile-only devices refuse programs above 15.75, 95.74 and
    # 31.25 GiB of HLO temporaries (XLA's RESOURCE_EXHAUSTED message), as a v3 core
    # (16 GiB) does above 15.48 GiB.
    # cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16, 16 GB HBM2 at 819 GB/s, ICI 400
    # GB/s bidirectional per chip; multi-host slices have 4 chips per VM (single-host
    # slices up to 8).
    Chip("v5e", "TPU v5 lite", 16 * GIB, 197e12, 819e9, 400e9, 1, 4, False),
    # cloud.google.com/tpu/docs/v5p: 459 TFLOP/s bf16, 95 GB HBM2e at 2765 GB/s, ICI
    # 1200 GB/s bidirectional per chip, 4 chips per host.
    Chip("v5p", "TPU v5", 96 * GIB, 459e12, 2765e9, 1200e9, 1, 4, True),
    # cloud.google.com/tpu/docs/v6e: 918 TFLOP/s bf16, 32 GB HBM at 1638 GB/s, ICI 800
    # GB/s bidirectional per chip; 4 chips per VM in multi-host slices.
    Chip("v6e", "TPU v6 lite", 32 * GIB, 918e12, 1638e9, 800e9, 1, 4, False),
  )
}
