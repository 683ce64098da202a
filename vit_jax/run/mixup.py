"""Mixup and CutMix of a global train batch inside the compiled step (``config.mixup``).

    mix = make_mixer(MixupSettings.from_config(config), blocks=data_devices)  # None: off
    batch = mix(batch, rng)

Mixup (Zhang et al., 2018) as big_vision trains with it (``u.mixup``, ``fold_in=None``):
one weight per step, a ~ Beta(p, p) and a = max(a, 1 - a), so an image keeps at least
half of itself; every example is mixed with its neighbour (the batch rolled by one)
and the labels alike, ``a * x + (1 - a) * roll(x)``. The roll is within each device's
share of the batch (``blocks`` consecutive rows of the global batch, one per device
along the ``data`` axis), as big_vision's per-device batch under pmap: no example moves
between devices. The partners therefore depend on the size of the ``data`` axis, never on
the number of processes; the weight depends only on the step's key.

CutMix (Yun et al., 2019), ``cutmix=True``: with the same weight a, a box of about
(1 - a) of the image, centred uniformly at random and clipped at the border (as timm's
``rand_bbox``), is pasted from the neighbour; the labels are weighted by the share of
pixels actually pasted (timm's ``correct_lam``). One box per step.

Evaluation never mixes: only `steps.train_step` calls the mixer.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from vit_jax.infra import errors
from vit_jax.infra.aliases import Batch

# Folded into the step's key for the mixer's draws: the dropout keys stay as they are.
RNG_TAG = 0x6D6978  # 'mix'
PROPOSALS = 32  # candidates of each loop-free Gamma draw (`log_gamma`)


@dataclasses.dataclass(frozen=True)
class MixupSettings:
  """``config.mixup``: the Beta concentration ``p`` (0: off) and the CutMix switch."""

  p: float
  cutmix: bool

  def __post_init__(self):
    if not self.p >= 0.0:
      raise errors.ConfigError(
        f"config.mixup.p={self.p} must be >= 0: the Beta(p, p) concentration of the mixing "
        "weight (0: off; big_vision's ImageNet recipes use 0.2 to 0.8)."
      )

  @classmethod
  def from_config(cls, config: Any) -> "MixupSettings":
    return cls(p=float(config.mixup.p), cutmix=bool(config.mixup.cutmix))


def log_gamma(rng: jax.Array, alpha: float, proposals: int = PROPOSALS) -> jax.Array:
  """log of one Gamma(alpha, 1) draw, without a loop in the compiled program.

  Marsaglia and Tsang's (2000) method for Gamma(alpha + 1), boosted to Gamma(alpha) by
  U^(1 / alpha), all in log space (stable for tiny alpha). ``jax.random.gamma`` rejects in
  a while loop, which would make the train step loop and so hide its FLOPs from XLA's
  count (`step_cost.has_loops`); here ``proposals`` candidates are drawn at once and the
  first accepted one kept. Each is accepted with probability > 0.95 for alpha + 1 >= 1,
  so all 32 fail with probability < 1e-41 (then the last one is used).
  """
  d = alpha + 1.0 - 1.0 / 3.0
  c = 1.0 / jnp.sqrt(9.0 * d)
  normal_rng, accept_rng, boost_rng = jax.random.split(rng, 3)
  x = jax.random.normal(normal_rng, (proposals,))
  v = (1.0 + c * x) ** 3
  log_u = jnp.log(jax.random.uniform(accept_rng, (proposals,), minval=1e-30))
  safe_v = jnp.where(v > 0, v, 1.0)
  accepted = (v > 0) & (log_u < 0.5 * x**2 + d - d * safe_v + d * jnp.log(safe_v))
  first = jnp.argmax(accepted.at[-1].set(True))  # the first accepted proposal
  log_boost = jnp.log(jax.random.uniform(boost_rng, minval=1e-30)) / alpha
  return jnp.log(d * safe_v[first]) + log_boost


def mixing_weight(rng: jax.Array, p: float) -> jax.Array:
  """The share a in [0.5, 1] each example keeps of itself: max(a, 1 - a), a ~ Beta(p, p),
  as the ratio G1 / (G1 + G2) of two Gamma(p) draws."""
  rng_1, rng_2 = jax.random.split(rng)
  a = jax.nn.sigmoid(log_gamma(rng_1, p) - log_gamma(rng_2, p))  # G1 / (G1 + G2)
  return jnp.maximum(a, 1.0 - a)


def _roll_in_blocks(x: jax.Array, blocks: int) -> jax.Array:
  """Row i of each of ``blocks`` equal consecutive blocks takes row i - 1 of its block."""
  split = x.reshape(blocks, x.shape[0] // blocks, *x.shape[1:])  # [D, B/D, ...]
  return jnp.roll(split, 1, axis=1).reshape(x.shape)


def box_mask(rng: jax.Array, height: int, width: int, share: jax.Array) -> jax.Array:
  """bool [H, W]: a box of about ``share`` of the image, its centre uniform on the pixel
  grid, clipped at the border (so the box may be smaller)."""
  cut = jnp.sqrt(share)
  box_h, box_w = (height * cut).astype(jnp.int32), (width * cut).astype(jnp.int32)
  rng_y, rng_x = jax.random.split(rng)
  cy = jax.random.randint(rng_y, (), 0, height)
  cx = jax.random.randint(rng_x, (), 0, width)
  rows, cols = jnp.arange(height), jnp.arange(width)
  inside_y = (rows >= cy - box_h // 2) & (rows < cy + box_h // 2)  # [H]
  inside_x = (cols >= cx - box_w // 2) & (cols < cx + box_w // 2)  # [W]
  return inside_y[:, None] & inside_x[None, :]


def mix_batch(batch: Batch, rng: jax.Array, settings: MixupSettings, blocks: int) -> Batch:
  """``batch`` ({'image': [B, H, W, C], 'label': [B, K], ...}) mixed with each example's
  neighbour within its block of B / ``blocks`` rows; other entries pass unchanged."""
  weight_rng, box_rng = jax.random.split(rng)
  a = mixing_weight(weight_rng, settings.p)
  images, labels = batch["image"], batch["label"]
  other_images = _roll_in_blocks(images, blocks)
  other_labels = _roll_in_blocks(labels, blocks)
  if settings.cutmix:
    height, width = images.shape[1:3]
    pasted = box_mask(box_rng, height, width, 1.0 - a)  # [H, W]
    images = jnp.where(pasted[None, :, :, None], other_images, images)
    a = 1.0 - jnp.mean(pasted.astype(jnp.float32))  # the share actually kept
  else:
    images = a * images + (1.0 - a) * other_images
  labels = a * labels + (1.0 - a) * other_labels
  return {**batch, "image": images, "label": labels}


def make_mixer(
  settings: MixupSettings, *, blocks: int
) -> Optional[Callable[[Batch, jax.Array], Batch]]:
  """``(batch, rng) -> batch`` for `steps.train_step`; None when ``settings.p`` is 0."""
  if not settings.p:
    return None
  return lambda batch, rng: mix_batch(batch, rng, settings, blocks)
