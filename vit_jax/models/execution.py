"""How a model runs, never what it computes in evaluation: `ExecutionOptions`, declared
once and passed down every family's modules as one attribute, and the remat policy.

A leaf of `vit_jax.models`: the layers, heads, attention and every family import it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from vit_jax.infra import errors

EINSUM = "einsum"  # `ExecutionOptions.attention_impl` of the ViT's own einsum attention
CUDNN = "cudnn"  # cuDNN's fused attention (`jax.nn.dot_product_attention` on a GPU)
# `ExecutionOptions.attention_impl` values: None or EINSUM (the einsum attention), or an
# ``implementation`` of `jax.nn.dot_product_attention`.
ATTENTION_IMPLS: tuple[Optional[str], ...] = (None, EINSUM, "xla", CUDNN)
# A config's "unset" for ``config.model.attention_impl`` and ``config.model.dtype``: a run
# takes its backend's choice (`models.backend_defaults.choose`); a model built outside a
# run computes an unset dtype in `UNSET_DTYPE` and an unset attention as EINSUM.
UNSET = None
UNSET_DTYPE = "float32"


@dataclasses.dataclass(frozen=True)
class ExecutionOptions:
  """How the model runs. None of them changes the parameters or the function computed in
  evaluation; ``scan`` stores the blocks' parameters stacked over a leading layer axis."""

  dropout_rate: float = 0.0  # on the embeddings, the attention output and the MLP
  attention_dropout_rate: float = 0.0  # on the attention weights
  # None or EINSUM: the einsum attention; else `jax.nn.dot_product_attention`'s
  # implementation ('xla', 'cudnn'). See `attention.MultiHeadDotProductAttention`.
  attention_impl: Optional[str] = None
  scan: bool = False  # the encoder blocks as one `nn.scan` (faster to compile)
  remat: bool = False  # recompute each block's activations in the backward pass
  remat_policy: Optional[str] = None  # a name in `jax.checkpoint_policies`
  # Stochastic depth: the last block's drop-path rate; rates grow linearly from 0 at the
  # first block (`layers.drop_path_rates`). Training only, like dropout.
  stoch_depth: float = 0.0
  dtype: jnp.dtype = jnp.float32  # computation
  param_dtype: jnp.dtype = jnp.float32  # storage


EXECUTION_FIELDS = frozenset(f.name for f in dataclasses.fields(ExecutionOptions))


def remat_policy(name: Optional[str]) -> Optional[Callable[..., bool]]:
  """The `jax.checkpoint_policies` entry ``name`` names (None: JAX's default, save nothing
  but the block's inputs)."""
  if name is None:
    return None
  policy = getattr(jax.checkpoint_policies, name, None) if name[:1] != "_" else None
  if not callable(policy):
    raise errors.ConfigError(
      f"Unknown config.model.remat_policy={name!r}: use a name from "
      "jax.checkpoint_policies, e.g. 'nothing_saveable', or None."
    )
  return policy


def compute_dtype(name: Optional[str]) -> jnp.dtype:
  """The computation dtype a settings' ``dtype`` names (`UNSET`: `UNSET_DTYPE`)."""
  return jnp.dtype(UNSET_DTYPE if name is UNSET else name)


def check_attention_impl(impl: Optional[str]) -> None:
  if impl not in ATTENTION_IMPLS:
    raise errors.ConfigError(
      f"Unknown config.model.attention_impl={impl!r}; choose one of {ATTENTION_IMPLS}."
    )
