"""The optax optimizer and learning-rate schedule of an experiment config.

    tx, schedule = make_optimizer(config)

Reads ``config.total_steps``, ``config.lr.{base, warmup_steps, decay, end}`` and
``config.optim.{name, momentum, momentum_dtype, b1, b2, eps, weight_decay,
decay_all_params, grad_clip_norm}``: every key is read as given, the defaults are
`configs/common.py`'s alone.

The chain is: clip the global gradient norm -> the optimizer's direction (SGD momentum, or
Adam moments) -> add ``weight_decay * param`` on the masked leaves -> scale by ``-lr(step)``.
Weight decay is therefore decoupled from the gradient statistics (AdamW, Loshchilov &
Hutter) and, as in `optax.adamw`, scaled by the learning rate: the decay term sits before
the learning-rate scaling, not after (after it would be added unscaled and with the wrong
sign).

`tx.init` works on plain arrays and on `nn.LogicallyPartitioned` boxes: optax maps over the
boxes' contents, so the moment buffers keep the boxes and `sharding.state_shardings` can
shard them like the parameters.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from vit_jax import errors

OPTIMIZERS: tuple[str, ...] = ("sgd", "adam", "adamw")
DECAYS: tuple[str, ...] = ("cosine", "linear", "constant")
MOMENTUM_DTYPES: tuple[str, ...] = ("float32", "bfloat16")

# Leaves never decayed unless config.optim.decay_all_params: biases and norm scales/offsets
# (by leaf name, which also covers GroupNorm and the scanned [L, ...] stacks), position
# embeddings (any path entry containing 'pos_embedding': learned 1-D and factorized 2-D)
# and the class token.
_NO_DECAY_LEAVES = ("bias", "scale", "cls")
_NO_DECAY_PATH_PART = "pos_embedding"


def make_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """Learning rate per step: linear warm-up 0 -> base, then cosine/linear to `end`, or flat.

  The decay reaches ``config.lr.end`` at ``config.total_steps`` and stays there.
  """
  lr = config.lr
  total = int(config.total_steps)
  base = float(lr.base)
  warmup = int(lr.warmup_steps)
  decay = lr.decay
  end = float(lr.end)
  if decay not in DECAYS:
    raise errors.ConfigError(f"Unknown config.lr.decay={decay!r}; choose one of {DECAYS}.")
  if warmup < 0:
    raise errors.ConfigError(f"config.lr.warmup_steps={warmup} is negative; use 0 for no warm-up.")
  if total > 0 and warmup >= total:
    raise errors.ConfigError(
      f"config.lr.warmup_steps={warmup} must be smaller than "
      f"config.total_steps={total}: lower the warm-up or train longer."
    )

  decay_steps = max(total - warmup, 1)
  if decay == "cosine":
    cosine = optax.cosine_decay_schedule(init_value=base - end, decay_steps=decay_steps)
    after: optax.Schedule = lambda step: end + cosine(step)
  elif decay == "linear":
    after = optax.linear_schedule(init_value=base, end_value=end, transition_steps=decay_steps)
  else:
    after = optax.constant_schedule(base)
  if warmup == 0:
    return after
  ramp = optax.linear_schedule(init_value=0.0, end_value=base, transition_steps=warmup)
  return optax.join_schedules([ramp, after], boundaries=[warmup])


def _path_names(path: tuple[Any, ...]) -> list[str]:
  """The dict keys along a tree path (box `.value` and other attribute steps dropped)."""
  return [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]


def weight_decay_mask(params: Any) -> Any:
  """True where weight decay applies: kernels and embeddings, not biases, norms, posemb, cls.

  Decided by parameter path names, never by rank, so the scanned tree (leading layer axis on
  every leaf) gets the same mask. Boxed parameters are unboxed first: the mask has the
  structure of the plain parameter tree.
  """

  def decays(path, _) -> bool:
    names = _path_names(path)
    if not names:
      return True
    if names[-1] in _NO_DECAY_LEAVES:
      return False
    return not any(_NO_DECAY_PATH_PART in n for n in names)

  return jax.tree_util.tree_map_with_path(decays, nn.unbox(params))


def _momentum_dtype(name: str) -> jnp.dtype:
  if name not in MOMENTUM_DTYPES:
    raise errors.ConfigError(
      f"Unknown config.optim.momentum_dtype={name!r}; choose one of {MOMENTUM_DTYPES}."
    )
  return jnp.dtype(name)


def _cast_like_params(updates: Any, params: Any) -> Any:
  if params is None:
    return updates
  return jax.tree.map(lambda u, p: u.astype(jnp.asarray(p).dtype), updates, params)


def make_optimizer(
  config: ml_collections.ConfigDict,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """``(tx, schedule)``: clip -> SGD-momentum / Adam -> masked decoupled decay -> -lr(step).

  ``momentum_dtype`` is the dtype of SGD's momentum buffer and of Adam's first moment
  (bfloat16 halves that memory); Adam's second moment stays in the parameter dtype.
  """
  o = config.optim
  name = o.name
  schedule = make_schedule(config)
  mu_dtype = _momentum_dtype(o.momentum_dtype)

  parts: list[optax.GradientTransformation] = []
  clip = o.grad_clip_norm
  if clip:
    if clip < 0:
      raise errors.ConfigError(
        f"config.optim.grad_clip_norm={clip} is negative; use a positive "
        "norm, or 0 / None for no clipping."
      )
    parts.append(optax.clip_by_global_norm(float(clip)))

  if name == "sgd":
    if o.momentum:
      parts.append(optax.trace(decay=float(o.momentum), accumulator_dtype=mu_dtype))
      # trace returns its (possibly bfloat16) buffer as the update: compute on in the
      # parameters' dtype, so updates always match the parameters.
      parts.append(optax.stateless(_cast_like_params))
  elif name in ("adam", "adamw"):
    parts.append(
      optax.scale_by_adam(b1=float(o.b1), b2=float(o.b2), eps=float(o.eps), mu_dtype=mu_dtype)
    )
  else:
    raise errors.ConfigError(f"Unknown config.optim.name={name!r}; choose one of {OPTIMIZERS}.")

  weight_decay = float(o.weight_decay)
  if weight_decay < 0:
    raise errors.ConfigError(f"config.optim.weight_decay={weight_decay} is negative; use >= 0.")
  if weight_decay:
    mask = None if o.decay_all_params else weight_decay_mask
    parts.append(optax.add_decayed_weights(weight_decay, mask=mask))

  parts.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*parts), schedule
