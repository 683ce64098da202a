"""What one NVIDIA GPU of a training node offers, and the description XLA compiles against.

Each `Chip` is one GPU (one JAX device) of an 8-GPU node (DGX/HGX): dense bf16 and TF32
peaks, HBM size and bandwidth from NVIDIA's datasheets (SXM form factor), NVLink within
the node, and the node's network per GPU (one NIC per GPU in the DGX reference designs).
`target_config` gives the GPU's `GpuTargetConfigProto` in text form (package data in
`gpu_targets/`), what `jax.experimental.topologies` needs to compile for a GPU that is not
there.

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
"""

from __future__ import annotations

import importlib.resources

from vit_jax.plan.chips import Chip

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
) -> Chip:
  """One GPU of an 8-GPU node: one device per chip, the node as a host, a NIC per GPU."""
  network = _BOTH_WAYS * nic_bits / 8
  return Chip(
    name, kind, memory, peak_flops=bf16, hbm_bytes_per_s=hbm_bw, ici_bytes_per_s=nvlink,
    devices_per_chip=1, chips_per_host=GPUS_PER_NODE, cloud_counts_cores=False,
    platform="cuda", interconnect="NVLink", network_bytes_per_s=network, f32_peak_flops=tf32,
  )  # fmt: skip


# The memory is the size the device reports (the description's device_memory_size; for
# the H200, the datasheet's 141 GB), which `target_config` checks against its file.
GPUS: dict[str, Chip] = {
  gpu.name: gpu
  for gpu in (
    _gpu("h100", "NVIDIA H100 80GB HBM3", 84_978_434_048, 989e12, 494.5e12, 3.35e12, 900e9, 400e9),
    _gpu("h200", "NVIDIA H200", 141_000_000_000, 989e12, 494.5e12, 4.8e12, 900e9, 400e9),
    _gpu("a100", "NVIDIA A100-SXM4-80GB", 85_100_068_864, 312e12, 156e12, 2.039e12, 600e9, 200e9),
  )
}


def target_config(gpu: Chip) -> str:
  """The GPU's `GpuTargetConfigProto` text (package data `gpu_targets/<name>.txtpb`)."""
  folder = importlib.resources.files("vit_jax.plan") / "gpu_targets"
  return (folder / f"{gpu.name}.txtpb").read_text()
