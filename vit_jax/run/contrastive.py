"""Image-text contrastive losses: SigLIP's sigmoid loss and CLIP's softmax loss.

zimg, ztxt: [B, D] L2-normalised embeddings of B image-text pairs (row i of each is a
pair), global arrays sharded over the mesh's 'data' axis. temperature, bias: scalars (the
models' learned exp(t') and b; CLIP has no bias).

- `sigmoid_loss`: Zhai et al. (2023), eq. 1: every image against every text in the global
  batch as an independent binary problem, positive on the diagonal,
  -1/B sum_ij log sigmoid(z_ij (t <x_i, y_j> + b)) with z_ij = 1 if i == j else -1.
  `sigmoid_loss_chunked` computes the same in the paper's chunked form: inside `shard_map`
  each device scores its images against its own texts, then passes its texts to the next
  device around the ring (`ppermute`) until every block has been seen, so a device holds a
  local-by-local block of logits at a time and no device ever gathers the global batch.
- `softmax_loss`: Radford et al. (2021): the mean of the image->text and text->image
  cross-entropies over the global batch (XLA gathers the texts, as big_vision and
  open_clip do).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from vit_jax.infra.sharding import DATA_AXIS


def _pair_logits(zimg: jax.Array, ztxt: jax.Array, temperature: jax.Array) -> jax.Array:
  return temperature * jnp.einsum("id,jd->ij", zimg, ztxt)  # [Bi, Bt]


def _sigmoid_block(
  zimg: jax.Array, ztxt: jax.Array, temperature: jax.Array, bias: jax.Array, positives: bool
) -> jax.Array:
  """-sum log sigmoid(z * logits) of one block: the pairs on its diagonal are positive
  when ``positives`` (the images' own texts), every pair negative otherwise."""
  logits = _pair_logits(zimg, ztxt, temperature) + bias  # [b, b]
  signs = 2.0 * jnp.eye(*logits.shape, dtype=logits.dtype) - 1.0 if positives else -1.0
  return -jnp.sum(jax.nn.log_sigmoid(signs * logits))


def sigmoid_loss(
  zimg: jax.Array, ztxt: jax.Array, temperature: jax.Array, bias: jax.Array
) -> jax.Array:
  """SigLIP's loss over the global batch, written as one [B, B] block (the reference)."""
  return _sigmoid_block(zimg, ztxt, temperature, bias, positives=True) / zimg.shape[0]


def _shard_map(fn, mesh: Mesh, in_specs, out_specs):
  """`jax.shard_map` where the installed jax has it, else its experimental home."""
  if hasattr(jax, "shard_map"):
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
  from jax.experimental.shard_map import shard_map  # pylint: disable=g-import-not-at-top

  return shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


def sigmoid_loss_chunked(
  zimg: jax.Array, ztxt: jax.Array, temperature: jax.Array, bias: jax.Array, mesh: Mesh
) -> jax.Array:
  """`sigmoid_loss`, with the texts passed around the 'data' ring instead of gathered.

  Each of the n devices on the 'data' axis holds b = B / n pairs; step 0 scores its own
  block (the positives), steps 1..n-1 the blocks of texts received from the previous
  device. Each block is recomputed in the backward pass (`jax.checkpoint`), so what the
  scan keeps is the texts it was passed ([b, D] a step), never a [b, B] block of logits.
  """
  devices = mesh.shape[DATA_AXIS]
  ring = [(k, (k + 1) % devices) for k in range(devices)]
  block = jax.checkpoint(functools.partial(_sigmoid_block, positives=False))

  def local(zimg_k, ztxt_k, t, b):  # [b, D], [b, D], [], []
    own = _sigmoid_block(zimg_k, ztxt_k, t, b, positives=True)

    def step(carry, _):
      texts, total = carry
      texts = jax.lax.ppermute(texts, DATA_AXIS, ring)
      return (texts, total + block(zimg_k, texts, t, b)), None

    (_, total), _ = jax.lax.scan(step, (ztxt_k, own), None, length=devices - 1)
    return jax.lax.psum(total, DATA_AXIS) / (zimg_k.shape[0] * devices)

  pairs = P(DATA_AXIS, None)
  return _shard_map(local, mesh, (pairs, pairs, P(), P()), P())(zimg, ztxt, temperature, bias)


def softmax_loss(zimg: jax.Array, ztxt: jax.Array, temperature: jax.Array) -> jax.Array:
  """CLIP's symmetric cross-entropy over the global batch."""
  logits = _pair_logits(zimg, ztxt, temperature)  # [B, B]
  targets = jnp.arange(logits.shape[0])
  image_to_text = -jnp.take_along_axis(jax.nn.log_softmax(logits, axis=1), targets[:, None], 1)
  text_to_image = -jnp.take_along_axis(jax.nn.log_softmax(logits, axis=0), targets[None, :], 0)
  return (jnp.mean(image_to_text) + jnp.mean(text_to_image)) / 2
