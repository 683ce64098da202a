"""What each accelerator offers, from its vendor's published figures: one table that the
run's MFU (`vit_jax.run.step_cost`) and the plan (`vit_jax.plan`) both read.

A `Chip` is one Cloud TPU chip generation or one NVIDIA GPU: memory, dense peak FLOP/s,
bandwidths, chips per host. `chip_for_device_kind` finds the chip of a `jax.Device`.

TPUs: Google's published per-chip specifications (the Cloud TPU system architecture pages,
cloud.google.com/tpu/docs/<version>), except the interconnect of v2-v4, which those pages
do not list: it comes from Google's papers on those systems (cited per entry). A JAX
device is one TensorCore on v2 and v3 (two per chip, each with half of the chip's memory
and compute) and one chip on v4 and later (v4 and v5p join their two TensorCores into one
"megacore" device; v5e and v6e have one TensorCore per chip). `Chip.per_device` divides by
`devices_per_chip` accordingly.

GPUs: each is one GPU (one JAX device) of an 8-GPU node (DGX/HGX): dense bf16 and TF32
peaks, HBM size and bandwidth from NVIDIA's datasheets (SXM form factor), NVLink within
the node, and the node's network per GPU (one NIC per GPU in the DGX reference designs).
Sources (per-GPU figures; the datasheets' dense numbers, not the 2x "with sparsity" ones):
- NVIDIA H100 Tensor Core GPU datasheet, SXM: 989 TFLOP/s bf16, 494.5 TFLOP/s TF32, 80 GB
  HBM3 at 3.35 TB/s, NVLink 900 GB/s (bidirectional, 18 links of 50 GB/s).
- NVIDIA H200 Tensor Core GPU datasheet, SXM: the same compute as the H100 SXM; 141 GB
  HBM3e at 4.8 TB/s; NVLink 900 GB/s.
- NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM: 312 TFLOP/s bf16, 156 TFLOP/s TF32,
  80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s (12 links of 50 GB/s).
- Between nodes: DGX H100 and DGX H200 have eight single-port ConnectX-7 adapters, up to
  400 Gb/s InfiniBand each (NVIDIA DGX BasePOD reference architecture, "Core
  Components"); DGX A100 has eight single-port ConnectX-6 at 200 Gb/s HDR InfiniBand
  (NVIDIA DGX A100 datasheet). Per GPU: 50 GB/s (H100, H200) or 25 GB/s (A100) each way.
- NVIDIA H100 PCIe and L4 (`MFU_ONLY_GPUS`: the run's MFU, no plan): the H100 PCIe
  datasheet, 756 TFLOP/s bf16, 378 TFLOP/s TF32, 80 GB HBM2e at 2 TB/s, NVLink bridge
  600 GB/s; the L4 datasheet, 121 TFLOP/s bf16, 60 TFLOP/s TF32, 24 GB GDDR6 at 300 GB/s,
  PCIe Gen4 x16 (64 GB/s) and no NVLink.
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
  # GPUs (`GPUS`): the links of ``ici_bytes_per_s`` are NVLink within a node,
  # and collectives between nodes go over the network at ``network_bytes_per_s``
  # (bidirectional, per GPU); f32 products run as TF32 at ``f32_peak_flops``.
  platform: str = "tpu"  # JAX's platform of its devices: 'tpu' or 'cuda'
  interconnect: str = "ICI"
  network_bytes_per_s: Optional[float] = None
  f32_peak_flops: Optional[float] = None
  # Lower-case parts of `jax.Device.device_kind` that name it (none: its ``device_kind``).
  kind_keys: tuple[str, ...] = ()

  def per_device(self, value: float) -> float:
    """A per-chip figure shared by the chip's JAX devices."""
    return value / self.devices_per_chip

  def peak_flops_for(self, dtype: str) -> float:
    """One device's dense peak for products computed in ``dtype`` ('float32', 'bfloat16')."""
    peak = self.f32_peak_flops if dtype == "float32" and self.f32_peak_flops else self.peak_flops
    return self.per_device(peak)

  def published_peak_flops(self, dtype: str) -> Optional[float]:
    """`peak_flops_for` where the vendor publishes a rate for ``dtype`` (bf16 and f32, and
    f16 on GPUs), else None."""
    published = (
      ("bfloat16", "float32", "float16") if self.platform == "cuda" else ("bfloat16", "float32")
    )
    return self.peak_flops_for(dtype) if dtype in published else None


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
    Chip(
      "v5e",
      "TPU v5 lite",
      16 * GIB,
      197e12,
      819e9,
      400e9,
      1,
      4,
      False,
      kind_keys=("tpu v5 lite", "tpu v5e"),
    ),
    # cloud.google.com/tpu/docs/v5p: 459 TFLOP/s bf16, 95 GB HBM2e at 2765 GB/s, ICI
    # 1200 GB/s bidirectional per chip, 4 chips per host.
    Chip(
      "v5p", "TPU v5", 96 * GIB, 459e12, 2765e9, 1200e9, 1, 4, True, kind_keys=("tpu v5p", "tpu v5")
    ),
    # cloud.google.com/tpu/docs/v6e: 918 TFLOP/s bf16, 32 GB HBM at 1638 GB/s, ICI 800
    # GB/s bidirectional per chip; 4 chips per VM in multi-host slices.
    Chip(
      "v6e",
      "TPU v6 lite",
      32 * GIB,
      918e12,
      1638e9,
      800e9,
      1,
      4,
      False,
      kind_keys=("tpu v6 lite", "tpu v6e"),
    ),
  )
}


GPUS_PER_NODE = 8  # the DGX/HGX node: 8 GPUs on NVLink switches
_BOTH_WAYS = 2  # bidirectional bandwidth, as ICI and NVLink are quoted


def _gpu(
  name: str,
  kind: str,
  memory: int,
  bf16: float,
  tf32: float,
  hbm_bw: float,
  nvlink: float,
  nic_bits: float,
  kind_key: str,
) -> Chip:
  """One GPU of an 8-GPU node: one device per chip, the node as a host, a NIC per GPU."""
  network = _BOTH_WAYS * nic_bits / 8
  return Chip(
    name, kind, memory, peak_flops=bf16, hbm_bytes_per_s=hbm_bw, ici_bytes_per_s=nvlink,
    devices_per_chip=1, chips_per_host=GPUS_PER_NODE, cloud_counts_cores=False,
    platform="cuda", interconnect="NVLink", network_bytes_per_s=network, f32_peak_flops=tf32,
    kind_keys=(kind_key,),
  )  # fmt: skip


# The memory is the size the device reports (the description's device_memory_size; for
# the H200, the datasheet's 141 GB), which `target_config` checks against its file.
GPUS: dict[str, Chip] = {
  gpu.name: gpu
  for gpu in (
    _gpu(
      "h100",
      "NVIDIA H100 80GB HBM3",
      84_978_434_048,
      989e12,
      494.5e12,
      3.35e12,
      900e9,
      400e9,
      "h100",
    ),
    _gpu("h200", "NVIDIA H200", 141_000_000_000, 989e12, 494.5e12, 4.8e12, 900e9, 400e9, "h200"),
    _gpu(
      "a100",
      "NVIDIA A100-SXM4-80GB",
      85_100_068_864,
      312e12,
      156e12,
      2.039e12,
      600e9,
      200e9,
      "a100",
    ),
  )
}
# GPUs the run's MFU knows and the plan does not compile for (no target description).
MFU_ONLY_GPUS: dict[str, Chip] = {
  gpu.name: gpu
  for gpu in (
    Chip("h100-pcie", "NVIDIA H100 PCIe", 80e9, 756e12, 2.0e12, 600e9, 1, GPUS_PER_NODE, False,
         platform="cuda", interconnect="NVLink", f32_peak_flops=378e12,
         kind_keys=("h100 pcie",)),
    Chip("l4", "NVIDIA L4", 24e9, 121e12, 300e9, 64e9, 1, GPUS_PER_NODE, False,
         platform="cuda", interconnect="PCIe", f32_peak_flops=60e12),
  )
}  # fmt: skip


def chip_for_device_kind(device_kind: str) -> Optional[Chip]:
  """The chip whose key is part of a `jax.Device.device_kind` (the longest key wins:
  'h100 pcie' before 'h100', 'tpu v5 lite' before 'tpu v5'); None when none is."""
  kind = device_kind.lower()
  keyed = [
    (key, chip)
    for chip in (*CHIPS.values(), *GPUS.values(), *MFU_ONLY_GPUS.values())
    for key in chip.kind_keys or (chip.device_kind.lower(),)
  ]
  for key, chip in sorted(keyed, key=lambda pair: -len(pair[0])):
    if key in kind:
      return chip
  return None
