"""The Vision Transformer (Dosovitskiy et al., 2021), Flax linen.

Parameter names equal the official checkpoints (docs/checkpoint_format.md), so an official `.npz`
loads without renaming. Every parameter carries logical axis names (`EMBED`, `MLP`,
`HEADS`, `KV`, `LAYERS` of `vit_jax.infra.sharding`), which that module maps onto mesh axes.

Inspection: apply with ``mutable=['intermediates']`` and every block sows
``attention_weights`` [B, H, N, N] and its output ``tokens`` [B, N, D]; with
``scan=True`` these come stacked over a leading layer axis.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.infra import errors
from vit_jax.infra.sharding import LAYERS
from vit_jax.models import embeddings, heads, layers, naflex, options
from vit_jax.models import posemb as posemb_lib
from vit_jax.models import rope as rope_lib
from vit_jax.models.attention import MultiHeadDotProductAttention
from vit_jax.models.execution import ExecutionOptions, remat_policy
from vit_jax.models.layers import DropPath, MlpBlock, drop_path_rates
from vit_jax.models.naflex import NaFlexPatches
from vit_jax.models.resnet import resnet_root
from vit_jax.models.settings import ModelSettings
from vit_jax.models.swiglu import SwiGLU

SCANNED_BLOCK = "encoderblock"  # the scanned encoder's blocks, stacked over a layer axis


class Encoder1DBlock(nn.Module):
  """Pre-LayerNorm block: x + MSA(LN(x)), then x + MLP(LN(x)).

  With ``config.layer_scale_init`` each branch is scaled by a learned per-channel
  LayerScale before the residual sum (timm's ``ls1``/``ls2``; DINOv2). Returns
  ``(x, None)`` so that the same class serves as the body of `nn.scan`.
  """

  config: ModelSettings
  execution: ExecutionOptions = ExecutionOptions()
  relative: Optional[posemb_lib.RelativePositions] = None  # relative position embeddings
  rotary: Optional[rope_lib.RotaryPositions] = None  # rotary embeddings of q and k

  def _mlp(self) -> nn.Module:
    """The block's MLP, ``MlpBlock_3``: the paper's, or a SwiGLU (`options.MLP_KINDS`)."""
    cfg, ex = self.config, self.execution
    if cfg.mlp == options.MLP:
      return MlpBlock(
        cfg.transformer.mlp_dim, cfg.gelu_approximate, ex, cfg.activation, name="MlpBlock_3"
      )
    return SwiGLU(
      cfg.transformer.mlp_dim,
      ex,
      fused=cfg.mlp == options.SWIGLU_FUSED,
      inner_norm=cfg.mlp_norm,
      layer_norm_epsilon=cfg.layer_norm_epsilon,
      name="MlpBlock_3",
    )

  def _scaled(self, y: jax.Array, name: str) -> jax.Array:
    init = self.config.layer_scale_init
    if init is None:
      return y
    return layers.LayerScale(init, self.execution.param_dtype, name=name)(y)

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    deterministic: bool,
    drop_path: float | jax.Array = 0.0,
    mask: Optional[jax.Array] = None,
    lengths: Optional[jax.Array] = None,
  ) -> tuple[jax.Array, None]:
    """``drop_path``: this block's stochastic-depth rate (`DropPath`), on each branch;
    ``mask`` and ``lengths``: the attention's (`MultiHeadDotProductAttention`)."""
    cfg, ex = self.config, self.execution
    norm = lambda name: layers.layer_norm(name, cfg.layer_norm_epsilon, ex.dtype, ex.param_dtype)
    y = norm("LayerNorm_0")(x)
    attention = MultiHeadDotProductAttention(
      cfg.transformer.num_heads,
      ex,
      self.relative,
      self.rotary,
      cfg.qkv_bias,
      cfg.layer_norm_epsilon if cfg.attention_norm else None,
      name="MultiHeadDotProductAttention_1",
    )
    y = attention(y, deterministic, mask, lengths)
    y = nn.Dropout(ex.dropout_rate)(y, deterministic=deterministic)
    # As timm's: x + drop_path(ls(branch)).
    y = self._scaled(y, "LayerScale_attention")
    x = x + DropPath(name="drop_path_attention")(y, drop_path, deterministic)  # [B, ..., N, D]
    y = norm("LayerNorm_2")(x)
    y = self._scaled(self._mlp()(y, deterministic), "LayerScale_mlp")
    x = x + DropPath(name="drop_path_mlp")(y, drop_path, deterministic)
    self.sow("intermediates", "tokens", x)
    return x, None


class AxialEncoderBlock(Encoder1DBlock):
  """The Axial-ViT's block (paper Appendix D.6) on the patches kept as a grid: a row block
  (self-attention along each row of the grid, then an MLP) followed by a column block
  (self-attention along each column, then an MLP).

  Each half is an `Encoder1DBlock` (parameters ``row/...`` and ``column/...``), pre-LN as
  the ViT's: x + MSA(LN(x)), then x + MLP(LN(x)); four LayerNorms and four residuals per
  block, each around one sub-block. Its fields are the ViT block's plus ``grid_hw``; with
  ``relative`` set, each attention learns the offsets along its own axis (2 gw - 1 for a
  row, 2 gh - 1 for a column). Takes and returns [B, N, D] (no prefix tokens), as the
  ViT block, so that the encoder's loop, scan and remat are the same.
  """

  grid_hw: tuple[int, int] = (1, 1)  # (gh, gw); the encoder sets the model's

  @nn.compact
  def __call__(
    self, x: jax.Array, deterministic: bool, drop_path: float | jax.Array = 0.0
  ) -> tuple[jax.Array, None]:
    b, n, d = x.shape
    gh, gw = self.grid_hw
    if n != gh * gw:
      raise errors.ConfigError(f"{n} tokens are not a {gh}x{gw} grid: Axial-ViT has no prefix.")

    def half(length: int, name: str) -> Encoder1DBlock:
      relative = None if self.relative is None else posemb_lib.RelativePositions(length)
      return Encoder1DBlock(self.config, self.execution, relative, name=name)

    grid = x.reshape(b, gh, gw, d)  # [B, gh, gw, D]: a row is a sequence of gw patches
    grid, _ = half(gw, "row")(grid, deterministic, drop_path)
    columns = jnp.swapaxes(grid, 1, 2)  # [B, gw, gh, D]: a column is a sequence of gh
    columns, _ = half(gh, "column")(columns, deterministic, drop_path)
    return jnp.swapaxes(columns, 1, 2).reshape(b, n, d), None  # [B, N, D]


class Encoder(nn.Module):
  """Position embeddings, the blocks (a Python loop or `nn.scan`), final LayerNorm.

  From ``config``: ``posemb_patches_only``, the position embeddings cover the patches, not
  the prefix tokens (timm's ``no_embed_class``); ``norm_pre``, a LayerNorm ``norm_pre``
  before the blocks (CLIP's); ``fc_norm``, no ``encoder_norm`` (the head normalises after
  pooling); ``final_norm`` False, no ``encoder_norm`` and no norm after pooling either;
  ``axial``, `AxialEncoderBlock`s on the grid (no prefix tokens).
  """

  config: ModelSettings
  grid_hw: tuple[int, int]
  num_prefix: int
  execution: ExecutionOptions = ExecutionOptions()

  @nn.compact
  def __call__(
    self, x: jax.Array, *, train: bool, patches: Optional[NaFlexPatches] = None
  ) -> jax.Array:
    """``patches``: x holds NaFlex tokens (`naflex`): each image's positions resampled
    from the table of ``grid_hw`` and its padding masked out of attention."""
    cfg, ex = self.config, self.execution
    num_layers = cfg.transformer.num_layers
    deterministic = not train
    norm = lambda name: layers.layer_norm(name, cfg.layer_norm_epsilon, ex.dtype, ex.param_dtype)
    x = posemb_lib.AddPositionEmbs(
      cfg.posemb,
      self.grid_hw,
      self.num_prefix,
      param_dtype=ex.param_dtype,
      embed_prefix=not cfg.posemb_patches_only,
      table_grid=cfg.posemb_grid,
      resample=cfg.table_resample(),
      name="posembed_input",
    )(x, patches)
    x = nn.Dropout(ex.dropout_rate)(x, deterministic=deterministic)
    if cfg.norm_pre:
      x = norm("norm_pre")(x)

    rates = drop_path_rates(num_layers, ex.stoch_depth)
    # With stochastic depth off the blocks get no rate: the model of before, bit for bit.
    drop_path = () if deterministic or not ex.stoch_depth else (rates,)
    # NaFlex tokens' attention mask [B, 1, P + N, P + N] and valid lengths [B] (the
    # patches of an image come first, its padding after: a fused kernel's padding mask).
    masks: tuple[jax.Array, ...] = ()
    if patches is not None:
      prefix = jnp.ones((x.shape[0], self.num_prefix), bool)
      valid = jnp.concatenate([prefix, patches.mask], axis=1)  # [B, P + N]
      masks = ((valid[:, :, None] & valid[:, None, :])[:, None], valid.sum(-1, dtype=jnp.int32))
      drop_path = drop_path or ([0.0] * num_layers,)  # the mask comes after the rate
    block_cls = AxialEncoderBlock if cfg.axial else Encoder1DBlock
    if ex.remat:
      # Argument 2 (`deterministic`, counting self) is a Python bool: static; so is 3, the
      # drop-path rate, in the loop (under scan it is a scanned array).
      static = (2,) if ex.scan or not drop_path else (2, 3)
      block_cls = nn.remat(
        block_cls,
        prevent_cse=not ex.scan,
        static_argnums=static,
        policy=remat_policy(ex.remat_policy),
      )
    block_kwargs: dict[str, Any] = dict(config=cfg, execution=ex)
    if cfg.posemb == posemb_lib.RELATIVE:
      gh, gw = self.grid_hw
      block_kwargs["relative"] = posemb_lib.RelativePositions(gh * gw, self.num_prefix)
    rotary = cfg.rotary()
    if rotary is not None:  # the tables follow the grid: no resize at another resolution
      block_kwargs["rotary"] = rope_lib.RotaryPositions(rotary, self.grid_hw, self.num_prefix)
    if cfg.axial:
      block_kwargs["grid_hw"] = self.grid_hw
    if ex.scan:
      scanned = nn.scan(
        block_cls,
        variable_axes={"params": 0, "intermediates": 0},
        split_rngs={"params": True, "dropout": True},
        # the rates: one per layer; the mask: every layer's
        in_axes=(nn.broadcast,) + (0,) * len(drop_path) + (nn.broadcast,) * len(masks),
        length=num_layers,
        metadata_params={nn.PARTITION_NAME: LAYERS},
      )
      scanned_rates = tuple(jnp.asarray(r, jnp.float32) for r in drop_path)  # [L]
      x, _ = scanned(name=SCANNED_BLOCK, **block_kwargs)(x, deterministic, *scanned_rates, *masks)
    else:
      for i in range(num_layers):
        layer_rate = tuple(r[i] for r in drop_path)
        x, _ = block_cls(name=f"encoderblock_{i}", **block_kwargs)(
          x, deterministic, *layer_rate, *masks
        )
    return x if cfg.fc_norm or not cfg.final_norm else norm("encoder_norm")(x)


class VisionTransformer(nn.Module):
  """ViT and its ResNet hybrids. Input: [B, H, W, C] in [-1, 1]; output: logits [B, K].

  ``config`` (`ModelSettings`) is what it computes, ``execution`` how it runs. With
  ``classifier='unpooled'`` the output keeps every token, [B, N, K or D]; with
  ``num_classes`` 0 or None there is no head and the output is the representation.
  Masked patch prediction (`vit_jax.models.mpp`) passes ``corrupt``, applied to the patch
  embeddings [B, N, D] before the prefix tokens and the position embeddings, and
  ``pool=False``: the output is then every token after the encoder, [B, P + N, D].

  Instead of images it takes `NaFlexPatches` (each image at its own grid, padded to a
  sequence budget: `vit_jax.models.naflex`), or the input pipeline's packing of them,
  float32 [B, N, P * P * C + 3] (`NaFlexPatches.unpack`); the learned table's grid is then
  ``config.posemb_grid``, or the square one that parameters that exist already say.
  """

  config: ModelSettings
  num_classes: Optional[int]
  execution: ExecutionOptions = ExecutionOptions()

  @property
  def input_stride(self) -> tuple[int, int]:
    """How many input pixels one token covers along H and W."""
    resnet, (ph, pw) = self.config.resnet, self.config.patches.size
    root = 1 if resnet is None else 4 * 2 ** max(len(resnet.num_layers) - 1, 0)
    return root * ph, root * pw

  @property
  def has_class_token(self) -> bool:
    return self.num_prefix_tokens > self.config.num_registers

  @property
  def num_prefix_tokens(self) -> int:
    """Tokens before the patches: the class token and the registers."""
    return self.config.num_prefix_tokens

  def grid_hw(self, image_hw: tuple[int, int]) -> tuple[int, int]:
    """The token grid for an image size; raises if the size is not a multiple of the patch."""
    sh, sw = self.input_stride
    h, w = image_hw
    if h % sh or w % sw:
      hybrid = self.config.resnet is not None
      what = "patch size times the ResNet stride" if hybrid else "patch size"
      raise errors.ConfigError(
        f"Image size {h}x{w} is not a multiple of the {what} {sh}x{sw}: give the model "
        f"images whose sides are multiples of it (a run's config.pp.crop, a command's "
        f"--resolution)."
      )
    return h // sh, w // sw

  def _naflex_tokens(self, patches: NaFlexPatches) -> tuple[jax.Array, tuple[int, int]]:
    """NaFlex patches [B, N, ph * pw * C] embedded by the square path's kernel [B, N, D],
    and the position table's grid."""
    cfg, ex = self.config, self.execution
    naflex.check_model(cfg)
    b, n, k = patches.patches.shape
    ph, pw = cfg.patches.size
    pixels = patches.patches.astype(ex.dtype).reshape(b * n, ph, pw, k // (ph * pw))
    x = embeddings.patch_embedding(
      pixels, cfg.hidden_size, cfg.patches.size, ex.dtype, ex.param_dtype, use_bias=cfg.patch_bias
    )  # [B * N, 1, 1, D]
    grid = cfg.posemb_grid
    if grid is None and self.has_variable("params", "Transformer"):
      table = self.variables["params"]["Transformer"]["posembed_input"]["pos_embedding"]
      rows = nn.unbox(table).shape[1]
      patch_rows = rows - (0 if cfg.posemb_patches_only else self.num_prefix_tokens)
      side = math.isqrt(patch_rows)
      grid = (side, side) if side * side == patch_rows else None
    if grid is None:
      raise errors.ConfigError(
        "NaFlex inputs to a new model or to a table that is not square: give "
        "config.model.posemb_grid, the learned table's (rows, columns)."
      )
    return x.reshape(b, n, cfg.hidden_size), grid

  @nn.compact
  def __call__(
    self,
    images: jax.Array | NaFlexPatches,
    *,
    train: bool = False,
    corrupt: Optional[Callable[[jax.Array], jax.Array]] = None,
    pool: bool = True,
  ) -> jax.Array:
    cfg, ex = self.config, self.execution
    if not isinstance(images, NaFlexPatches) and images.ndim == 3:  # the pipeline's packing
      images = NaFlexPatches.unpack(images)
    patches = images if isinstance(images, NaFlexPatches) else None
    if patches is not None:
      x, grid_hw = self._naflex_tokens(patches)  # [B, N, D]
    else:
      x, grid_hw = self._square_tokens(images)  # [B, N, D]
    if corrupt is not None:
      x = corrupt(x)
    x = embeddings.prepend_prefix_tokens(
      self, x, self.has_class_token, cfg.num_registers, ex.param_dtype
    )  # [B, P + N, D]
    encoder = Encoder(cfg, grid_hw, self.num_prefix_tokens, ex, name="Transformer")
    x = encoder(x, train=train, patches=patches)  # [B, P + N, D]
    if not pool:
      return x.astype(jnp.float32)
    return self._pooled(x, None if patches is None else patches.mask)

  def _square_tokens(self, images: jax.Array) -> tuple[jax.Array, tuple[int, int]]:
    """Images [B, H, W, C] -> their patches embedded [B, N, D], and the grid (gh, gw)."""
    cfg, ex = self.config, self.execution
    grid_hw = self.grid_hw(images.shape[1:3])
    x = images.astype(ex.dtype)  # [B, H, W, C]
    if cfg.resnet is not None:
      r = cfg.resnet
      x = resnet_root(
        x, r.num_layers, r.width_factor, dtype=ex.dtype, param_dtype=ex.param_dtype
      )  # [B, H/s, W/s, C']
    x = embeddings.patch_embedding(
      x, cfg.hidden_size, cfg.patches.size, ex.dtype, ex.param_dtype, use_bias=cfg.patch_bias
    )  # [B, gh, gw, D]
    b, gh, gw, d = x.shape
    assert (gh, gw) == grid_hw, ((gh, gw), grid_hw)
    return x.reshape(b, gh * gw, d), grid_hw  # [B, N, D]

  def _pooled(self, x: jax.Array, mask: Optional[jax.Array]) -> jax.Array:
    """Tokens [B, P + N, D] -> the head's output; ``mask`` [B, N]: the real patches."""
    cfg, ex = self.config, self.execution
    map_head = None
    if cfg.classifier == heads.MAP:
      t = cfg.transformer
      map_head = heads.MAPHead(
        cfg.map_num_heads or t.num_heads,
        cfg.map_mlp_dim or t.mlp_dim,
        cfg.gelu_approximate,
        cfg.activation,
        cfg.layer_norm_epsilon,
        ex,
        name=heads.MAP_HEAD,
      )
    # Perception Encoder's probe attends to every token (timm's Eva), big_vision's and
    # timm's ViT's to the patches.
    skipped = 0 if cfg.classifier == heads.MAP and cfg.map_include_prefix else None
    x = heads.pool(x, cfg.classifier, self.num_prefix_tokens, map_head, skipped, mask)  # [B, D]
    if cfg.fc_norm:
      x = layers.layer_norm(heads.FC_NORM, cfg.layer_norm_epsilon, ex.dtype, ex.param_dtype)(x)
    if cfg.representation_size is not None:
      x = heads.representation(x, cfg.representation_size, ex.dtype, ex.param_dtype)
    if self.num_classes:
      x = heads.linear_head(x, self.num_classes, cfg.head_bias_init, ex.dtype, ex.param_dtype)
    return x.astype(jnp.float32)


def create_vit(
  settings: ModelSettings,
  *,
  num_classes: Optional[int],
  execution: ExecutionOptions,
  **overrides: Any,
) -> VisionTransformer:
  """A `VisionTransformer` from checked settings and how it runs; ``overrides`` replace
  top-level fields of the settings (``classifier="gap"``), checked again."""
  config = settings.replace(**overrides) if overrides else settings
  return VisionTransformer(config, num_classes, execution)
