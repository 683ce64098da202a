"""What big_vision's ImageNet recipes share (`plain_vit_i1k.py`, `augreg.py`), once.

big_vision's optimizer is clip -> Adam -> x lr -> + wd * param -> x schedule(step), so its
weight decay ``wd`` is not scaled by the base learning rate; `vit_jax.run.optim` scales
``optim.weight_decay`` by it (as `optax.adamw`): ``weight_decay = wd / lr`` gives the same
update. Both decay the kernels alone (big_vision's ``.*/kernel$``; here every parameter
but biases, norms, position embeddings and the class token, i.e. the kernels).
"""

from __future__ import annotations

import math

import ml_collections

from configs import pretrain

LR = 1e-3
WD = 1e-4  # big_vision's `wd`, per step at the schedule's peak
WARMUP_STEPS = 10_000
CROP = 224
SHUFFLE_BUFFER = 250_000  # big_vision's per-host shuffle buffer


def set_recipe(
  config: ml_collections.ConfigDict, *, dataset: str, epochs: int, batch: int
) -> ml_collections.ConfigDict:
  """Sets the shared values on ``config``: batch, crop, steps for ``epochs`` over the
  preset's train split, Adam with a bfloat16 first moment, lr 1e-3 with 10k warm-up then
  cosine, clipping at 1, weight decay, and the loop's reporting intervals."""
  config.batch = batch
  config.batch_eval = 1024
  config.shuffle_buffer = SHUFFLE_BUFFER
  config.pp.crop = CROP
  config.total_steps = math.ceil(epochs * pretrain.TRAIN_IMAGES[dataset] / batch)
  config.lr.base = LR
  config.lr.warmup_steps = WARMUP_STEPS
  config.lr.decay = "cosine"
  config.optim.name = "adamw"
  config.optim.momentum_dtype = "bfloat16"
  config.optim.weight_decay = WD / LR
  config.optim.grad_clip_norm = 1.0
  config.log_every = 50
  config.eval_every = 2_500
  config.checkpoint_every = 1_000
  return config
