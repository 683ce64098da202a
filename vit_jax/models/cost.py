"""The analytic cost of the ViT and ResNet families: FLOPs of one image's matrix products
and convolutions, and a lower bound of the activations a train step keeps.

A check on XLA's count of a compiled step, and the count for programs with loops (a
scanned encoder, accumulation), whose bodies XLA counts once (`vit_jax.run.step_cost`);
MFU is defined on it. The MLP-Mixer's counts sit beside it in `models/mixer.py`; the
family registry (`models/families.py`) names each family's.
"""

from __future__ import annotations

from typing import Optional, Sequence

from vit_jax.models import execution, heads, options
from vit_jax.models import posemb as posemb_lib
from vit_jax.models.settings import BitSettings, ModelSettings

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


def bit_flops_per_image(
  model_config: BitSettings, image_size: int, num_classes: int, *, train: bool
) -> float:
  """`resnet_flops_per_image` of a BiT ResNet's settings."""
  r = model_config.resnet
  return resnet_flops_per_image(r.num_layers, r.width_factor, image_size, num_classes, train=train)


def bit_activation_bytes(
  model_config: BitSettings, image_size: int, images: int, compiler_rematerializes: bool = False
) -> None:
  """No bound for a BiT ResNet's feature maps yet: the run checks the compiled step only."""
  del model_config, image_size, images, compiler_rematerializes


def encoder_block_macs(tokens: int, width: int, mlp_dim: int, mlp_products: int = 2) -> int:
  """Multiply-adds of one encoder block on [N, D] tokens: the q/k/v and output
  projections (4 N D^2), the logits and the weighted values (2 N^2 D) and the MLP's
  ``mlp_products`` [D, M] products (2; a SwiGLU's gate, value and output: 3). Norms,
  RoPE, LayerScale and activations are elementwise and not counted."""
  n, d = tokens, width
  return n * 4 * d * d + 2 * n * n * d + mlp_products * n * d * mlp_dim


def map_head_macs(tokens: int, width: int, mlp_dim: int) -> int:
  """Multiply-adds of a MAP head (`heads.MAPHead`) pooling [N, D] tokens into one: the
  probe's query and the output projection (2 D^2), the keys and values of every token
  (2 N D^2), the probe's logits and weighted values (2 N D) and the MLP on the pooled
  token (2 D M)."""
  n, d = tokens, width
  return 2 * d * d + 2 * n * d * d + 2 * n * d + 2 * d * mlp_dim


def vit_flops_per_image(
  model_config: ModelSettings,
  image_size: int,
  num_classes: int,
  *,
  train: bool,
  num_patches: Optional[int] = None,
) -> Optional[float]:
  """FLOPs of a ViT's matrix products for one image, a hybrid's ResNet root included;
  ``num_patches``: a NaFlex budget's patches, padding included, in place of the square
  ``image_size``'s.

  Counts 2 FLOPs per multiply-add of the patch embedding, the attention projections, the
  two attention products, the MLP (a SwiGLU's three products), a MAP head
  (`map_head_macs`), the pre-logits and the head; a hybrid adds its ResNet root's
  convolutions (`resnet_macs`) and embeds its feature map's channels. A train step is 3x
  the forward pass (the backward pass computes two products per forward one).
  Recomputation (remat) is not counted: this is the model's count that MFU is defined on.
  """
  cfg = model_config
  if cfg.axial or cfg.posemb == posemb_lib.RELATIVE:
    return axial_or_relative_flops_per_image(cfg, image_size, num_classes, train=train)
  ph, pw = cfg.patches.size
  d, t = cfg.hidden_size, cfg.transformer
  macs, grid, channels = 0, image_size, 3
  if cfg.resnet is not None:  # the patches are cut from the root's feature map
    macs, grid, channels = resnet_macs(cfg.resnet.num_layers, cfg.resnet.width_factor, image_size)
  patches = num_patches or (grid // ph) * (grid // pw)
  n = patches + cfg.num_prefix_tokens
  macs += patches * ph * pw * channels * d  # patch embedding
  # A SwiGLU's MLP has three [D, M] products (gate, value, out), the paper's MLP two.
  mlp_products = 2 if cfg.mlp == options.MLP else 3
  macs += t.num_layers * encoder_block_macs(n, d, t.mlp_dim, mlp_products)
  if cfg.classifier == heads.MAP:  # the probe attends to the patches (PE's: every token)
    pooled = n if cfg.map_include_prefix else patches
    macs += map_head_macs(pooled, d, cfg.map_mlp_dim or t.mlp_dim)
  width = d
  if cfg.representation_size:
    macs += d * cfg.representation_size
    width = cfg.representation_size
  macs += width * (num_classes or 0)
  return _flops(macs, train)


def axial_or_relative_flops_per_image(
  model_config: ModelSettings, image_size: int, num_classes: int, *, train: bool
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
  model_config: ModelSettings,
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
  cfg = model_config
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
  return per_layer * t.num_layers * execution.compute_dtype(cfg.dtype).itemsize


def axial_activation_bytes(
  model_config: ModelSettings, image_size: int, images: int, compiler_rematerializes: bool = False
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
  return per_layer * t.num_layers * execution.compute_dtype(cfg.dtype).itemsize
