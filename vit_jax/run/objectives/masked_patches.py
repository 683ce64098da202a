"""The masked-patch-prediction objective: per-patch targets, the loss, evaluation sums.

Targets of each patch the model sees (paper Appendix B.1.2; the first is its choice):
  mean_color: the patch's mean colour, each RGB channel quantised to 3 bits: one of
    512 classes (softmax cross-entropy).
  downsampled: the patch shrunk to 4x4 by averaging, each cell such a 3-bit colour: 16
    predictions of 512 classes (the patch size must be a multiple of 4).
  pixels: the patch's values in [-1, 1], regressed with the squared error.
The loss averages over the corrupted patches only.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from vit_jax.infra import errors
from vit_jax.infra.aliases import Batch
from vit_jax.models import ModelSettings, create_model
from vit_jax.models import mpp as mpp_model
from vit_jax.run.objectives.base import Objective

TARGETS: tuple[str, ...] = ("mean_color", "downsampled", "pixels")
COLOR_BITS = 3  # per channel: 2^(3 * 3) = 512 colour classes
NUM_COLORS = 2 ** (3 * COLOR_BITS)
_CELLS = {"mean_color": 1, "downsampled": 4}  # cells per side of a patch's colour grid


def _check_target(target: str) -> None:
  if target not in TARGETS:
    raise errors.ConfigError(f"Unknown config.mpp.target={target!r}; choose one of {TARGETS}.")


def check(config: Any) -> None:
  """``config.mpp``'s target, by name, when the run is resolved (a config without the
  section is refused when the objective is built)."""
  options = config.get("mpp")
  if options is not None:
    _check_target(options.get("target"))


def _patches(images: jax.Array, patch: tuple[int, int], cells: int) -> jax.Array:
  """[B, H, W, C] -> [B, N, cells * cells, ph / cells * pw / cells, C], patches row-major."""
  b, h, w, c = images.shape
  ph, pw = patch
  if ph % cells or pw % cells:
    raise errors.ConfigError(
      f"The patch {ph}x{pw} cannot be split into {cells}x{cells} cells: use "
      f"config.mpp.target='mean_color' or a patch size divisible by {cells}."
    )
  x = images.reshape(b, h // ph, cells, ph // cells, w // pw, cells, pw // cells, c)
  x = x.transpose(0, 1, 4, 2, 5, 3, 6, 7)  # [B, gh, gw, cells, cells, ph/cells, pw/cells, C]
  return x.reshape(b, (h // ph) * (w // pw), cells * cells, -1, c)


def color_classes(images: jax.Array, patch: tuple[int, int], cells: int = 1) -> jax.Array:
  """The 3-bit colour class in [0, 512) of each cell of each patch: int32 [B, N, cells^2].

  images in [-1, 1]; a cell's mean channel value v in [0, 1] goes to bin floor(8 v)
  (1.0 to bin 7); the class is (r * 8 + g) * 8 + b.
  """
  levels = 2**COLOR_BITS
  means = jnp.mean(_patches((images + 1.0) / 2.0, patch, cells), axis=3)  # [B, N, cells^2, 3]
  bins = jnp.clip(jnp.floor(means * levels), 0, levels - 1).astype(jnp.int32)
  return (bins[..., 0] * levels + bins[..., 1]) * levels + bins[..., 2]


def targets(images: jax.Array, patch: tuple[int, int], target: str) -> jax.Array:
  """int32 [B, N, cells^2] colour classes, or float [B, N, ph * pw * C] for 'pixels'."""
  _check_target(target)
  if target == "pixels":
    p = _patches(images, patch, 1)
    return p.reshape(*p.shape[:2], -1)
  return color_classes(images, patch, _CELLS[target])


def num_outputs(target: str, patch: tuple[int, int], channels: int = 3) -> int:
  """The MPP head's width per patch for ``target``."""
  _check_target(target)
  if target == "pixels":
    return patch[0] * patch[1] * channels
  return _CELLS[target] ** 2 * NUM_COLORS


def per_image(
  predictions: jax.Array, kind: jax.Array, images: jax.Array, patch: tuple[int, int], target: str
) -> tuple[jax.Array, jax.Array]:
  """(loss [B], accuracy [B]) over each image's corrupted patches (accuracy 0 for 'pixels').

  predictions: [B, N, outputs] from `MaskedPatchPredictor`; kind: its corruption [B, N].
  """
  want = targets(images, patch, target)
  corrupted = (kind > 0).astype(jnp.float32)  # [B, N]
  if target == "pixels":
    per_patch = jnp.mean(jnp.square(predictions - want), axis=-1)  # [B, N]
    correct = jnp.zeros_like(per_patch)
  else:
    logits = predictions.reshape(*want.shape, NUM_COLORS)  # [B, N, cells^2, 512]
    per_patch = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, want), -1)
    correct = jnp.mean(jnp.argmax(logits, -1) == want, axis=-1)  # [B, N]
  count = jnp.maximum(jnp.sum(corrupted, axis=1), 1.0)
  return (
    jnp.sum(per_patch * corrupted, axis=1) / count,
    jnp.sum(correct * corrupted, axis=1) / count,
  )


class MaskedPatchPrediction(Objective):
  """Masked patch prediction as the training loop needs it: model, loss, eval sums.

  ``options``: the run's ``config.mpp`` (target, corrupt_rate, mask, random).
  """

  # The evaluation's 'correct' / 'count' is the share of corrupted patches whose target
  # (e.g. the 3-bit mean colour) is predicted right: logged under its own name.
  accuracy_metric = "patch_accuracy"

  def __init__(self, model_config: ModelSettings, options: ml_collections.ConfigDict):
    if not options:
      raise errors.ConfigError(
        "config.objective='mpp' reads config.mpp (target, corrupt_rate, mask, random), "
        "which the config lacks: start from configs/mpp.py."
      )
    mc = options
    _check_target(mc.target)
    self.encoder = create_model(model_config, num_classes=None)
    self.target = mc.target
    self.patch = self.encoder.input_stride
    self.model = mpp_model.MaskedPatchPredictor(
      encoder=self.encoder,
      outputs=num_outputs(mc.target, self.patch),
      corruption=mpp_model.Corruption(mc.corrupt_rate, mc.mask, mc.random),
    )

  def init(self, rng: jax.Array, images: jax.Array) -> Any:
    """Boxed parameters (with their logical axis names)."""
    params_rng, corrupt_rng = jax.random.split(rng)
    return self.model.init({"params": params_rng, mpp_model.CORRUPT_RNG: corrupt_rng}, images)[
      "params"
    ]

  def loss(self, params: Any, batch: Batch, rng: jax.Array) -> jax.Array:
    """The mean over the batch of each image's loss on its corrupted patches."""
    dropout_rng, corrupt_rng = jax.random.split(rng)
    predictions, kind = self.model.apply(
      {"params": params},
      batch["image"],
      train=True,
      rngs={"dropout": dropout_rng, mpp_model.CORRUPT_RNG: corrupt_rng},
    )
    loss, _ = per_image(predictions, kind, batch["image"], self.patch, self.target)
    return jnp.mean(loss)

  def eval_step(self, params: Any, batch: Batch) -> dict[str, jax.Array]:
    """Sums over the real examples of a batch, corrupted with a fixed key.

    'correct' sums each image's fraction of corrupted patches predicted right: with the
    same number corrupted in every image, correct / count is the patch accuracy.
    """
    predictions, kind = self.model.apply(
      {"params": params},
      batch["image"],
      train=False,
      rngs={mpp_model.CORRUPT_RNG: jax.random.PRNGKey(0)},
    )
    loss, accuracy = per_image(predictions, kind, batch["image"], self.patch, self.target)
    mask = batch["mask"]
    return {
      "loss_sum": jnp.sum(loss * mask),
      "correct": jnp.sum(accuracy * mask),
      "count": jnp.sum(mask),
    }
