"""BiT ResNet-v2 (Kolesnikov et al., 2020), the paper's ResNet baselines, Flax linen.

Pre-activation bottlenecks with GroupNorm(32) and weight-standardised convolutions: a root
conv 7x7/2 and a 3x3/2 max-pool, four stages (the first unit of stages 2-4 strides by 2 on
its 3x3 conv; a unit whose shape changes projects its shortcut with a 1x1 conv of the
pre-activated input), a final GroupNorm + ReLU, global average pooling and a zero head.

It computes what timm's ``resnetv2_*_bit`` computes (its ``ResNetV2`` with
``stem_type='fixed'`` and ``StdConv2d(eps=1e-8)``): kernels standardised as
``(w - mean) / sqrt(var + 1e-8)`` (the hybrids' root, `resnet.StdConv`, uses
``(w - mean) / (std + 1e-5)`` instead), GroupNorm epsilon 1e-5, symmetric PyTorch padding
(``((s - 1) + (k - 1)) // 2`` each side, not XLA's SAME) and the max-pool on the zero-padded
root output. Parameter names are big_vision's ``bit_paper.py`` (the JAX BiT of the paper):
``root_block/conv_root``, ``block{s}/unit{uu}/{gn1, conv_proj, conv1, gn2, conv2, gn3,
conv3}`` (``unit01``, ``unit02``, ...), ``norm-pre-head`` and ``head``; the norms' scale
and bias are vectors [C].

Logical axis names: a unit's outer channels (its input and output) are `EMBED`, its
bottleneck channels `MLP`, so FSDP splits every kernel and tensor parallelism splits the
bottleneck as a ViT's MLP (conv1 by its outputs, conv3 by its inputs).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.infra import errors
from vit_jax.infra.sharding import EMBED, MLP
from vit_jax.models import heads, layers, resnet
from vit_jax.models.execution import ExecutionOptions, remat_policy

BIT = "bit"  # `model_type` of a BiT config (`variants.py`)
ROOT_WIDTH = 64  # the root conv's output channels at width factor 1
GROUPS = 32
GROUP_NORM_EPSILON = 1e-5  # timm's GroupNormAct
KERNEL_VARIANCE_EPSILON = 1e-8  # timm's BiT StdConv2d: added to the variance
PRE_HEAD_NORM = "norm-pre-head"
ROOT = "root_block"

ROOT_KERNEL = f"{ROOT}/conv_root/kernel"  # [7, 7, C, 64 w]: the width factor w
_UNIT = re.compile(r"^block(\d+)/unit(\d+)/")  # stages and units per stage
FIT_ADVICE = (
  "  Fix: build the BiT with the checkpoint's units per stage and width factor, or load "
  "a checkpoint of this model."
)

Axes = tuple[Optional[str], ...]


def unit_name(index: int) -> str:
  """The name of a stage's ``index``-th unit (0-based): 'unit01', 'unit02', ..."""
  return f"unit{index + 1:02d}"


def _conv(features: int, size: int, stride: int, axes: Axes, name: str, ex: ExecutionOptions):
  pad = (stride - 1 + size - 1) // 2  # PyTorch's symmetric padding, as timm's get_padding
  return resnet.StdConv(
    features,
    (size, size),
    (stride, stride),
    padding=((pad, pad), (pad, pad)),
    use_bias=False,
    variance_epsilon=KERNEL_VARIANCE_EPSILON,
    dtype=ex.dtype,
    param_dtype=ex.param_dtype,
    kernel_init=layers.partitioned(nn.initializers.lecun_normal(), (None, None, *axes)),
    name=name,
  )


def _norm_relu(x: jax.Array, axis: str, name: str, ex: ExecutionOptions) -> jax.Array:
  """GroupNorm(32) then ReLU (timm's GroupNormAct); statistics in float32."""
  x = nn.GroupNorm(
    num_groups=GROUPS,
    epsilon=GROUP_NORM_EPSILON,
    use_fast_variance=False,
    dtype=ex.dtype,
    param_dtype=ex.param_dtype,
    scale_init=layers.partitioned(nn.initializers.ones, (axis,)),
    bias_init=layers.partitioned(nn.initializers.zeros, (axis,)),
    name=name,
  )(x)
  return nn.relu(x)


class PreActBottleneck(nn.Module):
  """GN-ReLU -> 1x1 -> GN-ReLU -> 3x3 (strided) -> GN-ReLU -> 1x1, plus the shortcut:
  the input, or a strided 1x1 projection of the pre-activated input where shapes change."""

  features: int  # bottleneck channels; the unit outputs 4x as many
  strides: int
  execution: ExecutionOptions

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:  # [B, H, W, Cin]
    ex, out = self.execution, 4 * self.features
    y = _norm_relu(x, EMBED, "gn1", ex)
    shortcut = x
    if x.shape[-1] != out or self.strides != 1:
      shortcut = _conv(out, 1, self.strides, (None, EMBED), "conv_proj", ex)(y)
    y = _conv(self.features, 1, 1, (EMBED, MLP), "conv1", ex)(y)  # [B, H, W, F]
    y = _norm_relu(y, MLP, "gn2", ex)
    y = _conv(self.features, 3, self.strides, (None, MLP), "conv2", ex)(y)  # [B, H/s, W/s, F]
    y = _norm_relu(y, MLP, "gn3", ex)
    y = _conv(out, 1, 1, (MLP, EMBED), "conv3", ex)(y)  # [B, H/s, W/s, 4F]
    return shortcut + y


class Stage(nn.Module):
  """``num_units`` bottleneck units; the first one strides by ``first_stride``. With
  ``execution.remat`` each unit recomputes its activations in the backward pass."""

  num_units: int
  features: int
  first_stride: int
  execution: ExecutionOptions

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    ex = self.execution
    unit_cls = PreActBottleneck
    if ex.remat:
      unit_cls = nn.remat(PreActBottleneck, policy=remat_policy(ex.remat_policy))
    for u in range(self.num_units):
      stride = self.first_stride if u == 0 else 1
      x = unit_cls(self.features, stride, ex, name=unit_name(u))(x)
    return x


class RootBlock(nn.Module):
  """conv_root 7x7/2 (padding 3), then a 3x3/2 max-pool of the output zero-padded by 1
  (timm's 'fixed' stem; before any norm, so the zeros can win the max)."""

  width: int
  execution: ExecutionOptions

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:  # [B, H, W, 3]
    x = _conv(self.width, 7, 2, (None, EMBED), "conv_root", self.execution)(x)
    x = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    return nn.max_pool(x, (3, 3), strides=(2, 2), padding="VALID")  # [B, H/4, W/4, w]


class BitResNet(nn.Module):
  """BiT ResNet-v2. Input: [B, H, W, 3] (any size); output: logits [B, K] (the pooled
  features [B, 2048 w] when ``num_classes`` is 0 or None).

  ``input_stride`` and ``grid_hw`` answer as `VisionTransformer`'s do (the last feature
  map's stride and size), so that the run, fine-tuning and the readers treat it alike.
  """

  num_classes: Optional[int]
  units_per_stage: tuple[int, ...]  # (3, 4, 6, 3): R50
  width_factor: int = 1
  head_bias_init: float = 0.0
  execution: ExecutionOptions = ExecutionOptions()

  has_class_token = False  # no prefix tokens, no position table
  num_prefix_tokens = 0

  @property
  def input_stride(self) -> tuple[int, int]:
    """How many input pixels one cell of the last feature map covers along H and W."""
    stride = 4 * 2 ** (len(self.units_per_stage) - 1)
    return stride, stride

  def grid_hw(self, image_hw: tuple[int, int]) -> tuple[int, int]:
    """The last feature map's size: every strided layer pads, so any size is taken."""
    s = self.input_stride[0]
    return -(-image_hw[0] // s), -(-image_hw[1] // s)

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False) -> jax.Array:
    del train  # no dropout, no stochastic depth
    ex = self.execution
    width = ROOT_WIDTH * self.width_factor
    x = RootBlock(width, ex, name=ROOT)(images.astype(ex.dtype))
    for s, num_units in enumerate(self.units_per_stage):
      x = Stage(num_units, width * 2**s, 1 if s == 0 else 2, ex, name=f"block{s + 1}")(x)
    x = _norm_relu(x, EMBED, PRE_HEAD_NORM, ex)  # [B, h, w, 2048 w]
    pooled = jnp.mean(x, axis=(1, 2))  # [B, 2048 w]
    return heads.pooled_logits(pooled, self.num_classes, self.head_bias_init, ex)


def create_bit(
  model_config: Any,
  *,
  num_classes: Optional[int],
  execution: ExecutionOptions,
  **overrides,
) -> BitResNet:
  """A `BitResNet` from checked BiT settings (`vit_jax.models.BitSettings`, which
  `create_model` builds from a config) and ``execution`` (its remat, remat policy and dtype
  with `create_model`'s overrides); ``overrides`` replace module attributes."""
  resnet = model_config.resnet
  return BitResNet(
    **{
      "num_classes": num_classes,
      "units_per_stage": tuple(resnet.num_layers),
      "width_factor": int(resnet.width_factor),
      "head_bias_init": model_config.head_bias_init,
      "execution": execution,
      **overrides,
    }
  )


def architecture_key(model_config: Any) -> tuple:
  """What the parameter shapes fix of a BiT config: units per stage, width factor."""
  return tuple(model_config.resnet.num_layers), model_config.resnet.width_factor


def describe_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
  """What a BiT's parameter shapes say: stages, units per stage, width factor."""
  units: dict[int, int] = {}
  for key in shapes:
    if m := _UNIT.match(key):
      units[int(m.group(1))] = max(units.get(int(m.group(1)), 0), int(m.group(2)))
  stages = sorted(units)
  return {
    "stages": stages,
    "units per stage": tuple(units[s] for s in stages),
    "width factor": shapes[ROOT_KERNEL][-1] / ROOT_WIDTH,
  }


def settings_from_shapes(shapes: Mapping[str, tuple[int, ...]], settings: Any) -> Any:
  """``settings`` (a BiT's `BitSettings`) changed to what the shapes were made for."""
  arch = describe_shapes(shapes)
  stages, width = arch["stages"], arch["width factor"]
  if not stages or stages != list(range(1, len(stages) + 1)) or not width.is_integer():
    raise errors.CheckpointError(
      f"Cannot infer the BiT ResNet from the checkpoint's arrays: stages block{stages} "
      f"(expected block1..blockS) and a root of {ROOT_WIDTH * width:g} channels (64 x a "
      "whole width factor)."
    )
  resnet = dataclasses.replace(
    settings.resnet, num_layers=tuple(arch["units per stage"]), width_factor=int(width)
  )
  return settings.replace(resnet=resnet)


def trained_grid(shapes: Mapping[str, tuple[int, ...]], model_config: Any) -> None:
  """None: a BiT takes any image size (no position table, no token-mixing MLP)."""
  del shapes, model_config
