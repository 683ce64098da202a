"""What a compiled step costs and what the device can do: FLOPs, memory, peak, MFU.

The benchmark (`benchmarks/throughput.py`), the training run's MFU and the memory-fitted
accumulation (`vit_jax.run.memory_fit`) all read a step's cost from here:

- `compiled_flops`, `compiled_bytes_accessed`: XLA's cost analysis of a compiled step,
  the FLOPs and memory traffic of one device's program. XLA counts the body of a loop (a
  scanned encoder, gradient accumulation) once, whatever its trip count; `has_loops` says
  when that happened.
- `vit_flops_per_image`: the analytic count of a ViT's (plain or hybrid) or an
  MLP-Mixer's matrix products and convolutions, a check on the above and the count for
  programs with loops; `resnet_flops_per_image` the same for a ResNet (the hybrids' root,
  BiT).
- `peak_bytes`: the device memory a compiled step needs, from XLA's memory analysis.
- `peak_flops`: the device's dense peak for a compute dtype (a table of published figures;
  on a CPU, a measured f32 matrix product).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax.models import bit, mixer
from vit_jax.models import posemb as posemb_lib
from vit_jax.models.settings import Settings, model_settings

# Dense (no sparsity) peak TFLOP/s per JAX device from the vendors' data sheets, by compute
# dtype. A device is a chip everywhere except TPU v2/v3, whose chips hold two TensorCores
# that JAX exposes as two devices: their entries are half the chip's (v3: 123 per chip).
# f32 matrix products run as TF32 on NVIDIA GPUs and as bf16 passes on TPUs at JAX's default
# precision, so their f32 entries are those rates. Keys are matched as lower-case substrings
# of `jax.Device.device_kind`, first match wins (so 'h100 pcie' precedes 'h100').
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
  ("tpu v2", {"bfloat16": 22.5, "float32": 22.5}),  # 45 per chip
  ("tpu v3", {"bfloat16": 61.5, "float32": 61.5}),  # 123 per chip
  ("tpu v4", {"bfloat16": 275.0, "float32": 275.0}),
  ("tpu v5 lite", {"bfloat16": 197.0, "float32": 197.0}),  # v5e
  ("tpu v5e", {"bfloat16": 197.0, "float32": 197.0}),
  ("tpu v5p", {"bfloat16": 459.0, "float32": 459.0}),
  ("tpu v5", {"bfloat16": 459.0, "float32": 459.0}),  # v5p reports 'TPU v5'
  ("tpu v6 lite", {"bfloat16": 918.0, "float32": 918.0}),  # v6e (Trillium)
  ("tpu v6e", {"bfloat16": 918.0, "float32": 918.0}),
  ("a100", {"bfloat16": 312.0, "float16": 312.0, "float32": 156.0}),
  ("h100 pcie", {"bfloat16": 756.0, "float16": 756.0, "float32": 378.0}),
  ("h100", {"bfloat16": 989.0, "float16": 989.0, "float32": 494.5}),  # SXM
  ("h200", {"bfloat16": 989.0, "float16": 989.0, "float32": 494.5}),
  ("l4", {"bfloat16": 121.0, "float16": 121.0, "float32": 60.0}),
)
# The CPU's peak is measured: an f32 product of two square matrices of this size.
CPU_MATMUL_SIZE = 2048


def _cost(compiled: jax.stages.Compiled, key: str) -> float:
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # older JAX: one dict per program
    analysis = analysis[0] if analysis else {}
  return float((analysis or {}).get(key, 0.0))


def compiled_flops(compiled: jax.stages.Compiled) -> float:
  """FLOPs of one device's program, from XLA's cost analysis (0 when it gives none)."""
  return _cost(compiled, "flops")


def compiled_bytes_accessed(compiled: jax.stages.Compiled) -> float:
  """Bytes one device's program reads and writes by XLA's cost analysis (0 when none).

  Independent of the machine's load, unlike a timing: what a change of formulation (an
  attention layout, a fusion) saves in memory traffic. Loop bodies count once, as FLOPs.
  """
  return _cost(compiled, "bytes accessed")


def has_loops(compiled: jax.stages.Compiled) -> bool:
  """Whether the program has a while loop, whose body XLA's cost analysis counts once."""
  return " while(" in compiled.as_text()


def peak_bytes(compiled: jax.stages.Compiled) -> int:
  """Device memory one device needs for the step: arguments, outputs, temporaries, code.

  XLA's temporaries are one allocation sized for their peak; donated arguments (aliases)
  are not counted twice. (The analysis's own `peak_memory_in_bytes` leaves temporaries
  out on the CPU.)
  """
  stats = compiled.memory_analysis()
  if stats is None:
    return 0
  return int(
    stats.argument_size_in_bytes
    + stats.output_size_in_bytes
    - stats.alias_size_in_bytes
    + stats.temp_size_in_bytes
    + stats.generated_code_size_in_bytes
  )


# A forward multiply-add is 2 FLOPs; a train step is 3 forward passes' worth (the backward
# pass computes two products, for the input and for the weights, per forward one).
_FLOPS_PER_MAC = 2.0
_TRAIN_FACTOR = 3


def _flops(macs: float, train: bool) -> float:
  return _FLOPS_PER_MAC * macs * (_TRAIN_FACTOR if train else 1)


def _same_out(size: int, stride: int) -> int:
  """The output size of a SAME-padded convolution or pooling."""
  return -(-size // stride)


def resnet_macs(
  units_per_stage: Sequence[int],
  width_factor: float,
  image_size: int,
  stride_in_reduction: bool = False,
) -> tuple[int, int, int]:
  """Multiply-adds of a ResNet body for one square image: (MACs, output size, channels).

  The root conv (7x7, stride 2, 64 x width channels; the max-pool after it halves the map
  and has no products) and per bottleneck unit the 1x1 reduction, the 3x3 conv (strided
  in the first unit of every stage but the first), the 1x1 expansion to 4x its width and
  the 1x1 projection of the shortcut where the shape changes: the convolutions of
  `models/resnet.py` (ResNet-v1.5) and of BiT's pre-activation ResNet-v2, which differ in
  where the norms sit, not in their convolutions. Norms, ReLUs and weight
  standardisation are elementwise and not counted. ``stride_in_reduction``: the stride
  in the 1x1 reduction instead (the original ResNet-v1), only to compare published counts.
  """
  width = int(64 * width_factor)
  size = _same_out(image_size, 2)
  macs = size * size * 7 * 7 * 3 * width  # root conv, [size, size, width]
  size = _same_out(size, 2)  # max-pool
  channels = width
  for stage, units in enumerate(units_per_stage):
    features = width * 2**stage
    for unit in range(units):
      stride = 2 if stage > 0 and unit == 0 else 1
      out = _same_out(size, stride)
      reduced = out if stride_in_reduction else size
      macs += reduced * reduced * channels * features  # conv1, 1x1 (at the input's size)
      macs += out * out * 9 * features * features  # conv2, 3x3, strided
      macs += out * out * features * 4 * features  # conv3, 1x1 expansion
      if channels != 4 * features or stride != 1:
        macs += out * out * channels * 4 * features  # conv_proj, 1x1 (strided)
      size, channels = out, 4 * features
  return macs, size, channels


def resnet_flops_per_image(
  num_layers: Sequence[int],
  width_factor: float,
  image_size: int,
  num_classes: int,
  *,
  train: bool,
) -> float:
  """FLOPs of a ResNet classifier for one square image: `resnet_macs`' convolutions
  (``num_layers``: units per stage, e.g. (3, 4, 6, 3) for R50) plus the linear head on
  the globally pooled features (``num_classes`` 0: none); 3x forward for ``train``."""
  macs, _, channels = resnet_macs(num_layers, width_factor, image_size)
  return _flops(macs + channels * (num_classes or 0), train)


def vit_flops_per_image(
  model_config: Settings | ml_collections.ConfigDict,
  image_size: int,
  num_classes: int,
  *,
  train: bool,
) -> Optional[float]:
  """FLOPs of a ViT's matrix products for one image, a hybrid's ResNet root included.

  Counts 2 FLOPs per multiply-add of the patch embedding, the attention projections, the
  two attention products, the MLP, the pre-logits and the head; a hybrid adds its
  ResNet root's convolutions (`resnet_macs`) and embeds its feature map's channels. A
  train step is 3x the forward pass (the backward pass computes two products per forward
  one). Recomputation (remat) is not counted: this is the model's count that MFU is
  defined on.
  """
  cfg = model_settings(model_config)
  if mixer.is_mixer(cfg):
    return mixer.flops_per_image(cfg, image_size, num_classes, train=train)
  if bit.is_bit(cfg):
    r = cfg.resnet
    return resnet_flops_per_image(
      r.num_layers, r.width_factor, image_size, num_classes, train=train
    )
  if cfg.axial or cfg.posemb == posemb_lib.RELATIVE:
    return axial_or_relative_flops_per_image(cfg, image_size, num_classes, train=train)
  ph, pw = cfg.patches.size
  d, t = cfg.hidden_size, cfg.transformer
  macs, grid, channels = 0, image_size, 3
  if cfg.resnet is not None:  # the patches are cut from the root's feature map
    macs, grid, channels = resnet_macs(cfg.resnet.num_layers, cfg.resnet.width_factor, image_size)
  patches = (grid // ph) * (grid // pw)
  n = patches + cfg.num_prefix_tokens
  macs += patches * ph * pw * channels * d  # patch embedding
  per_layer = n * 4 * d * d + 2 * n * n * d + 2 * n * d * t.mlp_dim  # [N, D] tokens
  macs += t.num_layers * per_layer
  width = d
  if cfg.representation_size:
    macs += d * cfg.representation_size
    width = cfg.representation_size
  macs += width * (num_classes or 0)
  return _flops(macs, train)


def axial_or_relative_flops_per_image(
  model_config: Settings, image_size: int, num_classes: int, *, train: bool
) -> Optional[float]:
  """`vit_flops_per_image` of an Axial-ViT or a ViT with relative position embeddings,
  with the same conventions (2 per multiply-add, train = 3x forward).

  From the plain ViT's count of the same sizes: an Axial-ViT block (paper Appendix D.6)
  has two attentions and two MLPs over the N = gh x gw patches, each attention's products
  along a row (gw keys) or a column (gh keys) instead of all N tokens; relative attention
  (Appendix D.4) adds each query's product with the O embeddings of its layer's table
  (`posemb.RelativePositions`: 2 x sequence - 1 offsets, + 3 rows for a prefix).
  """
  cfg = model_config
  plain = vit_flops_per_image(
    cfg.replace(axial=False, posemb="learn"), image_size, num_classes, train=False
  )
  if plain is None:
    return None
  ph, pw = cfg.patches.size
  gh, gw = image_size // ph, image_size // pw
  d, t = cfg.hidden_size, cfg.transformer
  n = gh * gw
  prefix = cfg.num_prefix_tokens  # an Axial-ViT has none
  relative = cfg.posemb == posemb_lib.RELATIVE
  if cfg.axial:
    # Minus the plain layer's global products; plus a second projection + MLP set, the
    # row and column products and the per-axis offset tables.
    per_layer = n * 4 * d * d + 2 * n * d * t.mlp_dim - 2 * n * n * d + 2 * n * (gw + gh) * d
    if relative:
      per_layer += n * (2 * gw - 1) * d + n * (2 * gh - 1) * d
  else:
    tokens = n + prefix
    offsets = posemb_lib.RelativePositions(n, prefix).num_offsets
    per_layer = tokens * offsets * d
  return (plain + 2.0 * t.num_layers * per_layer) * (3 if train else 1)


def vit_activation_bytes(
  model_config: Settings | ml_collections.ConfigDict,
  image_size: int,
  images: int,
  compiler_rematerializes: bool = False,
) -> Optional[int]:
  """A lower bound of the activations a plain ViT's train step keeps for its backward pass,
  for ``images`` images on one device (None for a ResNet hybrid).

  Per layer: the block's input [B, N, D], and without remat the attention weights
  [B, H, N, N] and the MLP's hidden units [B, N, mlp], in the compute dtype. XLA's TPU and
  GPU compilers rematerialize on their own when a program exceeds the device
  (``compiler_rematerializes``), so there only the block inputs are certain to stay.
  Used to refuse a resolution or batch that cannot fit before anything is compiled.
  """
  cfg = model_settings(model_config)
  if mixer.is_mixer(cfg):
    return mixer.activation_bytes(cfg, image_size, images, compiler_rematerializes)
  if bit.is_bit(cfg):
    return None  # no bound for a BiT ResNet's feature maps yet
  if cfg.axial:
    return axial_activation_bytes(cfg, image_size, images, compiler_rematerializes)
  if cfg.resnet is not None:
    return None
  ph, pw = cfg.patches.size
  t = cfg.transformer
  n = (image_size // ph) * (image_size // pw) + cfg.num_prefix_tokens
  per_layer = images * n * cfg.hidden_size
  if not (cfg.remat or compiler_rematerializes):
    per_layer += images * (t.num_heads * n * n + n * t.mlp_dim)
  return per_layer * t.num_layers * np.dtype(cfg.dtype).itemsize


def axial_activation_bytes(
  model_config: Settings, image_size: int, images: int, compiler_rematerializes: bool = False
) -> int:
  """`vit_activation_bytes` of an Axial-ViT: per block the inputs of its row and column
  halves, 2 x [B, N, D], and without remat the row and column attention weights
  [B, H, N, gw] and [B, H, N, gh] and both MLPs' hidden units, 2 x [B, N, mlp]."""
  cfg = model_config
  ph, pw = cfg.patches.size
  gh, gw = image_size // ph, image_size // pw
  t, n = cfg.transformer, gh * gw
  per_layer = 2 * images * n * cfg.hidden_size
  if not (cfg.remat or compiler_rematerializes):
    per_layer += images * (t.num_heads * n * (gw + gh) + 2 * n * t.mlp_dim)
  return per_layer * t.num_layers * np.dtype(cfg.dtype).itemsize


@functools.cache
def measured_cpu_peak_flops(size: int = CPU_MATMUL_SIZE, repeats: int = 5) -> float:
  """FLOP/s of XLA's f32 [size, size] x [size, size] product on the CPU, best of ``repeats``."""
  a = jax.device_put(np.ones((size, size), np.float32), jax.devices("cpu")[0])
  matmul = jax.jit(jnp.matmul)
  matmul(a, a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, a).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2.0 * size**3 / best


def peak_flops(device: Any, dtype: Any = jnp.float32) -> Optional[float]:
  """The dense peak FLOP/s of one ``device`` for ``dtype`` compute; None when unknown.

  A CPU's is measured (f32, whatever ``dtype``: it has no faster matrix unit that XLA uses).
  """
  if device.platform == "cpu":
    return measured_cpu_peak_flops()
  kind = device.device_kind.lower()
  name = np.dtype(dtype).name
  for key, peaks in PEAK_TFLOPS:
    if key in kind:
      return peaks[name] * 1e12 if name in peaks else None
  return None


def peak_source(device: Any, dtype: Any = jnp.float32) -> str:
  """What `peak_flops` of ``device`` is, for the log: measured (a CPU) or published."""
  if device.platform == "cpu":
    n = CPU_MATMUL_SIZE
    return f"the CPU's peak, measured at start: XLA's f32 {n}x{n} matrix product"
  return f"the published {np.dtype(dtype).name} peak of one {device.device_kind}"


def format_flops_rate(flops_per_s: float) -> str:
  """1.2e11 -> '120 GFLOP/s'; 9.89e14 -> '989 TFLOP/s'."""
  if flops_per_s >= 1e12:
    return f"{flops_per_s / 1e12:.4g} TFLOP/s"
  return f"{flops_per_s / 1e9:.4g} GFLOP/s"


def step_flops(
  compiled: jax.stages.Compiled, num_devices: int, analytic: Optional[float]
) -> tuple[Optional[float], str]:
  """FLOPs of one step over all devices and their source: 'xla', 'analytic' or 'none'.

  XLA's count (one device's program times the devices) unless the program loops, where it
  would count each loop body once; then the ``analytic`` count, when there is one.
  """
  if not has_loops(compiled):
    return compiled_flops(compiled) * num_devices, "xla"
  return analytic, "analytic" if analytic else "none"
