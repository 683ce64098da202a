"""The optax optimizer and learning-rate schedule of an experiment config.

    tx, schedule = make_optimizer(OptimizerSettings.from_config(config))

`OptimizerSettings` holds ``config.total_steps``, ``config.lr.{base, warmup_steps, decay,
end}`` and ``config.optim.{name, momentum, momentum_dtype, b1, b2, eps, weight_decay,
decay_all_params, grad_clip_norm}``, checked; the defaults are `vit_jax.run.defaults`'s alone.

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

import dataclasses
import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from vit_jax.infra import errors
from vit_jax.models.attention import MIXED_FREQS

OPTIMIZERS: tuple[str, ...] = ("sgd", "adam", "adamw")
DECAYS: tuple[str, ...] = ("cosine", "linear", "constant")
MOMENTUM_DTYPES: tuple[str, ...] = ("float32", "bfloat16")

# Leaves never decayed unless config.optim.decay_all_params: biases and norm scales/offsets
# (by leaf name, which also covers GroupNorm and the scanned [L, ...] stacks), position
# embeddings (any path entry containing 'pos_embedding': learned 1-D and factorized 2-D)
# the class token and mixed RoPE's learned frequencies (as timm's ``no_weight_decay``).
_NO_DECAY_LEAVES = ("bias", "scale", "cls", MIXED_FREQS)
_NO_DECAY_PATH_PART = "pos_embedding"


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
  """``config.lr`` and ``config.optim`` with ``config.total_steps``, checked when built."""

  total_steps: int
  lr_base: float
  warmup_steps: int
  decay: str  # one of DECAYS
  lr_end: float
  name: str  # one of OPTIMIZERS
  momentum: float
  momentum_dtype: str  # one of MOMENTUM_DTYPES
  b1: float
  b2: float
  eps: float
  weight_decay: float
  decay_all_params: bool
  grad_clip_norm: float  # 0: no clipping

  def __post_init__(self):
    checks = (
      (
        math.isfinite(self.lr_base) and self.lr_base > 0,
        f"config.lr.base={self.lr_base} must be a positive, finite learning rate (a negative "
        "one trains uphill, nan or inf diverges at once).",
      ),
      (
        math.isfinite(self.lr_end) and self.lr_end >= 0,
        f"config.lr.end={self.lr_end} must be a finite learning rate >= 0.",
      ),
      (self.decay in DECAYS, f"Unknown config.lr.decay={self.decay!r}; choose one of {DECAYS}."),
      (
        self.warmup_steps >= 0,
        f"config.lr.warmup_steps={self.warmup_steps} is negative; use 0 for no warm-up.",
      ),
      (
        self.total_steps <= 0 or self.warmup_steps < self.total_steps,
        f"config.lr.warmup_steps={self.warmup_steps} must be smaller than "
        f"config.total_steps={self.total_steps}: lower the warm-up or train longer.",
      ),
      (
        self.name in OPTIMIZERS,
        f"Unknown config.optim.name={self.name!r}; choose one of {OPTIMIZERS}.",
      ),
      (
        self.momentum_dtype in MOMENTUM_DTYPES,
        f"Unknown config.optim.momentum_dtype={self.momentum_dtype!r}; choose one of "
        f"{MOMENTUM_DTYPES}.",
      ),
      (
        self.grad_clip_norm >= 0,
        f"config.optim.grad_clip_norm={self.grad_clip_norm} is negative; use a positive "
        "norm, or 0 / None for no clipping.",
      ),
      (
        self.weight_decay >= 0,
        f"config.optim.weight_decay={self.weight_decay} is negative; use >= 0.",
      ),
    )
    for ok, message in checks:
      if not ok:
        raise errors.ConfigError(message)

  @classmethod
  def from_config(cls, config: Any) -> "OptimizerSettings":
    lr, o = config.lr, config.optim
    return cls(
      total_steps=int(config.total_steps),
      lr_base=float(lr.base),
      warmup_steps=int(lr.warmup_steps),
      decay=lr.decay,
      lr_end=float(lr.end),
      name=o.name,
      momentum=float(o.momentum or 0.0),
      momentum_dtype=o.momentum_dtype,
      b1=float(o.b1),
      b2=float(o.b2),
      eps=float(o.eps),
      weight_decay=float(o.weight_decay),
      decay_all_params=bool(o.decay_all_params),
      grad_clip_norm=float(o.grad_clip_norm or 0.0),
    )


def make_schedule(settings: OptimizerSettings) -> optax.Schedule:
  """Learning rate per step: linear warm-up 0 -> base, then cosine/linear to `end`, or flat.

  The decay reaches ``lr_end`` at ``total_steps`` and stays there.
  """
  total, base, warmup = settings.total_steps, settings.lr_base, settings.warmup_steps
  decay, end = settings.decay, settings.lr_end
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


def _cast_like_params(updates: Any, params: Any) -> Any:
  if params is None:
    return updates
  return jax.tree.map(lambda u, p: u.astype(jnp.asarray(p).dtype), updates, params)


def make_optimizer(
  settings: OptimizerSettings,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """``(tx, schedule)``: clip -> SGD-momentum / Adam -> masked decoupled decay -> -lr(step).

  ``momentum_dtype`` is the dtype of SGD's momentum buffer and of Adam's first moment
  (bfloat16 halves that memory); Adam's second moment stays in the parameter dtype.
  """
  o = settings
  schedule = make_schedule(settings)
  mu_dtype = jnp.dtype(o.momentum_dtype)

  parts: list[optax.GradientTransformation] = []
  if o.grad_clip_norm:
    parts.append(optax.clip_by_global_norm(o.grad_clip_norm))

  if o.name == "sgd":
    if o.momentum:
      parts.append(optax.trace(decay=o.momentum, accumulator_dtype=mu_dtype))
      # trace returns its (possibly bfloat16) buffer as the update: compute on in the
      # parameters' dtype, so updates always match the parameters.
      parts.append(optax.stateless(_cast_like_params))
  else:  # adam, adamw
    parts.append(optax.scale_by_adam(b1=o.b1, b2=o.b2, eps=o.eps, mu_dtype=mu_dtype))

  if o.weight_decay:
    mask = None if o.decay_all_params else weight_decay_mask
    parts.append(optax.add_decayed_weights(o.weight_decay, mask=mask))

  parts.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*parts), schedule


def freeze(tx: optax.GradientTransformation, frozen: Sequence[str]) -> optax.GradientTransformation:
  """``tx`` for every top-level subtree of the parameters except those named in ``frozen``
  (LiT's locked image tower), which get a zero update and no optimizer state."""
  if not frozen:
    return tx
  labels = lambda params: {k: "frozen" if k in frozen else "train" for k in params}
  return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
