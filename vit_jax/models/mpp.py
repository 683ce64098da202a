"""Masked patch prediction (paper Sec. 4.6, Appendix B.1.2): the ViT encoder, corrupted.

Half of each image's patch embeddings are corrupted: of those, 80% are replaced by a
learnable [mask] embedding, 10% by another patch embedding of the batch and 10% kept.
The class token and the position embeddings are added after the corruption, as in the
paper's pipeline; every output patch token goes through a linear head.

The encoder is a `VisionTransformer` sharing this module's scope, so its parameters
(`embedding`, `cls`, `Transformer/...`) have exactly the supervised model's names and
an MPP checkpoint fine-tunes as it is; only `MPP_PARAMS` are the objective's own.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.infra import errors
from vit_jax.infra.sharding import EMBED
from vit_jax.models.vit import VisionTransformer

CORRUPT_RNG = "corrupt"  # The rng stream that draws the corruption.
MASK_EMBEDDING = "mask_embedding"
HEAD = "mpp_head"
MPP_PARAMS: tuple[str, ...] = (MASK_EMBEDDING, HEAD)  # Dropped when fine-tuning.

# What a corrupted patch becomes (a plan's entries; 0: not corrupted).
MASKED, RANDOM, KEPT = 1, 2, 3


@dataclasses.dataclass(frozen=True)
class Corruption:
  """The share of patches corrupted per image, and how the corrupted ones are split.

  The paper's values (50%; 80/10/10) are configs/mpp.py's defaults.
  """

  rate: float  # of each image's patches (rounded to a whole number, the same for all)
  mask: float  # of the corrupted ones: the [mask] embedding
  random: float  # another patch embedding of the batch; the rest are kept as they are

  def __post_init__(self):
    if not (
      0.0 < self.rate <= 1.0
      and self.mask >= 0
      and self.random >= 0
      and self.mask + self.random <= 1.0
    ):
      raise errors.ConfigError(
        f"{self} must have 0 < rate <= 1 and mask + random <= 1 (both >= 0)."
      )


def corruption_plan(
  rng: jax.Array, batch: int, num_patches: int, corruption: Corruption
) -> tuple[jax.Array, jax.Array]:
  """What happens to each patch: kind int32 [B, N] (0, MASKED, RANDOM or KEPT), source [B, N].

  Exactly round(rate * N) patches of every image are corrupted, chosen uniformly; each
  corrupted patch independently becomes MASKED, RANDOM or KEPT with the given shares.
  A RANDOM patch takes the embedding of patch `source` of the next image in the batch
  (image b takes from b + 1, the last from the first): a random patch of another image,
  found without gathering the whole batch onto every device.
  """
  pick_rng, kind_rng, source_rng = jax.random.split(rng, 3)
  count = round(corruption.rate * num_patches)
  order = jnp.argsort(jax.random.uniform(pick_rng, (batch, num_patches)), axis=1)
  rank = jnp.argsort(order, axis=1)  # Each patch's place in a random order.
  corrupted = rank < count  # [B, N]
  u = jax.random.uniform(kind_rng, (batch, num_patches))
  kind = jnp.where(
    u < corruption.mask, MASKED, jnp.where(u < corruption.mask + corruption.random, RANDOM, KEPT)
  )
  kind = jnp.where(corrupted, kind, 0).astype(jnp.int32)
  source = jax.random.randint(source_rng, (batch, num_patches), 0, num_patches)
  return kind, source


def apply_corruption(
  tokens: jax.Array, kind: jax.Array, source: jax.Array, mask_embedding: jax.Array
) -> jax.Array:
  """Patch embeddings [B, N, D] corrupted as `corruption_plan` says; the rest bit-identical."""
  neighbour = jnp.roll(tokens, -1, axis=0)  # [B, N, D]: image b + 1's patches at row b
  other = jnp.take_along_axis(neighbour, source[..., None], axis=1)  # [B, N, D]
  out = jnp.where((kind == RANDOM)[..., None], other, tokens)
  return jnp.where((kind == MASKED)[..., None], mask_embedding.astype(tokens.dtype), out)


class MaskedPatchPredictor(nn.Module):
  """Input [B, H, W, C] in [-1, 1] -> (predictions [B, N, outputs], corruption kind [B, N]).

  ``encoder``: the supervised model (its head, pooling and representation layer unused).
  ``outputs``: the head's width per patch (set by the target, see
  `vit_jax.run.objectives.masked_patches`).
  """

  encoder: VisionTransformer
  outputs: int
  corruption: Corruption

  def setup(self):
    self.vit = self.encoder.clone(num_classes=None)
    nn.share_scope(self, self.vit)  # The encoder's parameters at the top level.
    ex = self.encoder.execution
    self.mask_embedding = self.param(
      MASK_EMBEDDING,
      nn.with_logical_partitioning(nn.initializers.normal(0.02), (EMBED,)),
      (self.encoder.config.hidden_size,),
      ex.param_dtype,
    )
    self.head = nn.Dense(
      self.outputs,
      dtype=ex.dtype,
      param_dtype=ex.param_dtype,
      name=HEAD,
      kernel_init=nn.with_logical_partitioning(nn.initializers.zeros, (EMBED, None)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (None,)),
    )

  def __call__(self, images: jax.Array, *, train: bool = False) -> tuple[jax.Array, jax.Array]:
    gh, gw = self.vit.grid_hw(images.shape[1:3])
    kind, source = corruption_plan(
      self.make_rng(CORRUPT_RNG), images.shape[0], gh * gw, self.corruption
    )
    tokens = self.vit(
      images,
      train=train,
      pool=False,
      corrupt=lambda x: apply_corruption(x, kind, source, self.mask_embedding),
    )
    num_prefix = tokens.shape[1] - gh * gw  # The class token, when the model has one.
    predictions = self.head(tokens[:, num_prefix:])  # [B, N, outputs]
    return predictions.astype(jnp.float32), kind
