"""MLP-Mixer (Tolstikhin et al., 2021), Flax linen, as the official repository defines it.

Parameter names equal the official checkpoints (`models_mixer.py` of
google-research/vision_transformer): ``stem`` (the patch embedding, a strided conv),
``MixerBlock_{i}/{LayerNorm_0, token_mixing/Dense_{0,1}, LayerNorm_1,
channel_mixing/Dense_{0,1}}``, ``pre_head_layer_norm`` and a zero-initialised ``head``.
Each block is x + TokenMLP(LN(x)^T)^T, then x + ChannelMLP(LN(x)); the output is the
global average of the tokens after the last LayerNorm. The official MLPs use Flax's
``nn.gelu`` (the tanh approximation; timm computes the exact one: ``gelu_approximate``).

The token-mixing MLP acts across the N = (H / p)(W / p) patches, so its weights fix N:
a Mixer runs at the resolution its token-mixing weights were made for.
Logical axis names: the channel MLP as a ViT MLP (`EMBED` -> `MLP` -> `EMBED`), the
token MLP's hidden units `MLP` (tensor parallelism splits both hidden layers).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.infra import errors
from vit_jax.infra.sharding import EMBED, MLP
from vit_jax.models import embeddings, heads, layers, posemb
from vit_jax.models.execution import ExecutionOptions, remat_policy

MIXER = "mixer"  # `model_type` of a Mixer config (`variants.py`); a ViT config has none
# The parameter shapes that describe a Mixer (`describe_shapes`); ``stem`` is its own.
STEM_KERNEL = "stem/kernel"  # [ph, pw, C, D]: patch size, width
_BLOCK = re.compile(r"^MixerBlock_(\d+)/")  # depth
_TOKEN_MLP = "MixerBlock_0/token_mixing/Dense_0/kernel"  # [N, Dt]: patches, token MLP
_CHANNEL_MLP = "MixerBlock_0/channel_mixing/Dense_0/kernel"  # [D, Dc]: channel MLP
FIT_ADVICE = (
  "  Fix: build the Mixer with the checkpoint's architecture (width, depth, token and "
  "channel MLP dims) and its number of patches (the token-mixing MLP fixes it: "
  "config.pp.crop = patches per side x patch size), or load a checkpoint of this model."
)


class MlpBlock(nn.Module):
  """Dense -> GELU -> Dense over the last axis; the official initializers (Flax defaults)."""

  mlp_dim: int
  in_axis: Optional[str]  # logical name of the input (= output) axis
  gelu_approximate: bool
  execution: ExecutionOptions

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    ex = self.execution

    def dense(features: int, axes: tuple[Optional[str], Optional[str]], name: str) -> nn.Dense:
      return nn.Dense(
        features,
        dtype=ex.dtype,
        param_dtype=ex.param_dtype,
        kernel_init=layers.partitioned(nn.initializers.lecun_normal(), axes),
        bias_init=layers.partitioned(nn.initializers.zeros, (axes[1],)),
        name=name,
      )

    y = dense(self.mlp_dim, (self.in_axis, MLP), "Dense_0")(x)  # [..., M]
    y = nn.gelu(y, approximate=self.gelu_approximate)
    return dense(x.shape[-1], (MLP, self.in_axis), "Dense_1")(y)  # [..., in]


def _layer_norm(name: str, execution: ExecutionOptions) -> nn.LayerNorm:
  return layers.layer_norm(name, layers.LAYER_NORM_EPSILON, execution.dtype, execution.param_dtype)


class MixerBlock(nn.Module):
  """Token mixing across patches, then channel mixing, each pre-LayerNorm and residual."""

  tokens_mlp_dim: int
  channels_mlp_dim: int
  gelu_approximate: bool
  execution: ExecutionOptions

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    ex = self.execution
    y = _layer_norm("LayerNorm_0", ex)(x)  # [B, N, D]
    y = jnp.swapaxes(y, 1, 2)  # [B, D, N]
    y = MlpBlock(self.tokens_mlp_dim, None, self.gelu_approximate, ex, name="token_mixing")(y)
    x = x + jnp.swapaxes(y, 1, 2)  # [B, N, D]
    y = _layer_norm("LayerNorm_1", ex)(x)
    y = MlpBlock(self.channels_mlp_dim, EMBED, self.gelu_approximate, ex, name="channel_mixing")(y)
    return x + y


class MlpMixer(nn.Module):
  """MLP-Mixer. Input: [B, H, W, C] in [-1, 1]; output: logits [B, K] (the pooled
  representation [B, D] when ``num_classes`` is 0 or None).

  ``input_stride`` and ``grid_hw`` answer as `VisionTransformer`'s do, so that the
  training run, fine-tuning and the weights readers treat both alike.
  """

  num_classes: Optional[int]
  patch_size: tuple[int, int]
  hidden_dim: int
  num_blocks: int
  tokens_mlp_dim: int
  channels_mlp_dim: int
  gelu_approximate: bool = True  # tanh GELU as the official weights; False: exact (timm)
  head_bias_init: float = 0.0
  execution: ExecutionOptions = ExecutionOptions()

  has_class_token = False  # as `VisionTransformer`'s: no prefix tokens, no position table
  num_prefix_tokens = 0

  @property
  def input_stride(self) -> tuple[int, int]:
    """How many input pixels one token covers along H and W."""
    return tuple(self.patch_size)

  def grid_hw(self, image_hw: tuple[int, int]) -> tuple[int, int]:
    """The token grid for an image size; raises if the size is not a multiple of the patch."""
    (ph, pw), (h, w) = self.patch_size, image_hw
    if h % ph or w % pw:
      raise errors.ConfigError(
        f"Image size {h}x{w} is not a multiple of the patch size {ph}x{pw}: "
        f"resize the images to a multiple of {ph}x{pw}."
      )
    return h // ph, w // pw

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False) -> jax.Array:
    del train  # no dropout: the official Mixer has none
    ex = self.execution
    self.grid_hw(images.shape[1:3])
    x = embeddings.patch_embedding(
      images.astype(ex.dtype),
      self.hidden_dim,
      self.patch_size,
      ex.dtype,
      ex.param_dtype,
      name="stem",
    )  # [B, gh, gw, D]
    b, gh, gw, d = x.shape
    x = x.reshape(b, gh * gw, d)  # [B, N, D]
    block_cls = MixerBlock
    if ex.remat:
      block_cls = nn.remat(MixerBlock, policy=remat_policy(ex.remat_policy))
    for i in range(self.num_blocks):
      x = block_cls(
        self.tokens_mlp_dim,
        self.channels_mlp_dim,
        self.gelu_approximate,
        ex,
        name=f"MixerBlock_{i}",
      )(x)
    x = _layer_norm("pre_head_layer_norm", ex)(x)
    pooled = jnp.mean(x, axis=1)  # [B, D]
    return heads.pooled_logits(pooled, self.num_classes, self.head_bias_init, ex)


def create_mixer(
  model_config: Any,
  *,
  num_classes: Optional[int],
  execution: ExecutionOptions,
  **overrides,
) -> MlpMixer:
  """An `MlpMixer` from checked Mixer settings (`vit_jax.models.MixerSettings`, which
  `create_model` builds from a config) and ``execution`` (its remat, remat policy and dtype
  with `create_model`'s overrides); ``overrides`` replace module attributes."""
  cfg = model_config
  attributes = dict(
    num_classes=num_classes,
    patch_size=tuple(cfg.patches.size),
    hidden_dim=cfg.hidden_dim,
    num_blocks=cfg.num_blocks,
    tokens_mlp_dim=cfg.tokens_mlp_dim,
    channels_mlp_dim=cfg.channels_mlp_dim,
    gelu_approximate=cfg.gelu_approximate,
    head_bias_init=cfg.head_bias_init,
    execution=execution,
  )
  attributes.update(overrides)
  return MlpMixer(**attributes)


def flops_per_image(
  model_config: ml_collections.ConfigDict, image_size: int, num_classes: int, *, train: bool
) -> float:
  """FLOPs of a Mixer's matrix products for one image: 2 per multiply-add of the stem, the
  token and channel MLPs and the head; a train step is 3x the forward pass."""
  cfg = model_config
  ph, pw = cfg.patches.size
  n, d = (image_size // ph) * (image_size // pw), cfg.hidden_dim
  macs = n * ph * pw * 3 * d  # stem
  macs += cfg.num_blocks * (2 * d * n * cfg.tokens_mlp_dim + 2 * n * d * cfg.channels_mlp_dim)
  macs += d * (num_classes or 0)
  return 2.0 * macs * (3 if train else 1)


def activation_bytes(
  model_config: ml_collections.ConfigDict,
  image_size: int,
  images: int,
  compiler_rematerializes: bool = False,
) -> int:
  """A lower bound of the activations a Mixer's train step keeps for its backward pass
  (as `step_cost.vit_activation_bytes`): each block's input [B, N, D], and without remat
  the token MLP's hidden units [B, D, Dt] and the channel MLP's [B, N, Dc]."""
  cfg = model_config
  ph, pw = cfg.patches.size
  n, d = (image_size // ph) * (image_size // pw), cfg.hidden_dim
  per_block = images * n * d
  if not (cfg.remat or compiler_rematerializes):
    per_block += images * (d * cfg.tokens_mlp_dim + n * cfg.channels_mlp_dim)
  return per_block * cfg.num_blocks * jnp.dtype(cfg.dtype).itemsize


def architecture_key(model_config: Any) -> tuple:
  """What the parameter shapes fix of a Mixer config: two configs with the same key load
  the same checkpoints."""
  fields = ("hidden_dim", "num_blocks", "tokens_mlp_dim", "channels_mlp_dim")
  return (tuple(model_config.patches.size), *(getattr(model_config, f) for f in fields))


def describe_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
  """What a Mixer's parameter shapes say: patch size, input channels, width, depth,
  patches, token and channel MLP dims (None where they do not say it)."""
  kernel = shapes[STEM_KERNEL]
  tokens, channels = shapes.get(_TOKEN_MLP), shapes.get(_CHANNEL_MLP)
  return {
    "patch size": kernel[:2],
    "input channels": kernel[2],
    "width": kernel[3],
    "depth": len({m.group(1) for k in shapes if (m := _BLOCK.match(k))}) or None,
    "patches": tokens[0] if tokens else None,
    "token MLP dim": tokens[1] if tokens else None,
    "channel MLP dim": channels[1] if channels else None,
  }


def settings_from_shapes(shapes: Mapping[str, tuple[int, ...]], settings: Any) -> Any:
  """``settings`` (a Mixer's `MixerSettings`) changed to what the shapes were made for."""
  arch = describe_shapes(shapes)
  missing = [name for name, value in arch.items() if value is None]
  if missing:
    raise errors.CheckpointError(
      "Cannot infer the Mixer architecture from the checkpoint's arrays: no "
      + ", ".join(missing)
      + f" (from MixerBlock_{{i}}, {_TOKEN_MLP} and {_CHANNEL_MLP})."
    )
  return settings.replace(
    patches=dataclasses.replace(settings.patches, size=tuple(arch["patch size"])),
    hidden_dim=arch["width"],
    num_blocks=arch["depth"],
    tokens_mlp_dim=arch["token MLP dim"],
    channels_mlp_dim=arch["channel MLP dim"],
  )


def trained_grid(shapes: Mapping[str, tuple[int, ...]], model_config: Any) -> Optional[tuple]:
  """The token grid the token-mixing MLP was made for (it fixes the number of patches)."""
  del model_config
  tokens = shapes.get(_TOKEN_MLP)
  if tokens is None:
    return None
  return posemb.square_grid(tokens[0], "pass the image size (--resolution)")
