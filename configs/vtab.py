r"""VTAB-1k with the ViT paper's one setting for all 19 tasks.

    python -m vit_jax.main --config=configs/vtab.py:b16,dtd \
        --config.pretrained=ViT-B_16 --config.data_dir=/data/tfds --workdir=/tmp/vtab_dtd
    python -m vit_jax.vtab --config=configs/vtab.py:b16 \
        --config.pretrained=ViT-B_16 --config.data_dir=/data/tfds --workdir=/tmp/vtab_b16

The argument is ``<model>[,<task>[,sweep]]``: a short model name of ``configs/vit.py`` and a
task of `vit_jax.data.vtab.TASKS` (without one, the `vit_jax.vtab` command sets each task
in turn). A task trains on its 1,000 examples (train800val200) and reports the accuracy
on its test split (``eval/accuracy``); ``sweep`` trains on train800 and tests on val200,
the protocol's split for choosing hyper-parameters.

Setting, from the ViT paper (Dosovitskiy et al. 2021), Appendix B.1.1 and Table 4: "For
VTAB we follow the protocol in Kolesnikov et al. (2020), and use the same hyperparameter
setting for all tasks. We use a learning rate of 0.01 and train for 2500 steps", chosen
on the 200-example validation sets, at resolution 384 for every task. The rest is this
repository's fine-tuning recipe (`configs/vit.py`): SGD with momentum 0.9, batch 512, no
weight decay, gradient clipping at global norm 1, linear warm-up (250 steps, a tenth of the
run) then cosine decay. No flip and no random crop (the labels of dSprites, SmallNORB and
KITTI are positions, angles and distances).
"""

from __future__ import annotations

import ml_collections

from configs import common, vit
from vit_jax import models
from vit_jax.data import vtab

STEPS = 2500  # the paper's Table 4
LEARNING_RATE = 0.01
CROP = 384


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The config of ``arg`` = ``'<model>[,<task>[,sweep]]'`` (e.g. ``'b16,dtd'``)."""
  parts = [p.strip() for p in (arg or "").split(",")]
  if not parts[0] or len(parts) > 3 or (len(parts) == 3 and parts[2] != "sweep"):
    raise ValueError(
      f"Config argument {arg!r} must be '<model>[,<task>[,sweep]]', e.g. "
      f"--config=configs/vtab.py:b16,dtd. Models: {', '.join(vit.MODELS)}."
    )
  if parts[0].lower() not in vit.MODELS:
    raise ValueError(f"Config argument {arg!r}: unknown model (valid: {', '.join(vit.MODELS)}).")
  config = common.get_config()
  config.model = models.get_model_config(vit.MODELS[parts[0].lower()])
  patch = 1 if models.is_bit(config.model) else config.model.patches.size[0]
  config.pp.crop = -(-CROP // patch) * patch
  config.total_steps = STEPS
  config.lr.base = LEARNING_RATE
  config.lr.warmup_steps = STEPS // 10
  config.log_every = 50
  config.eval_every = STEPS  # the test split once, at the end
  config.checkpoint_every = 500
  config.keep_checkpoints = 1
  vtab.apply_task(config, parts[1] if len(parts) > 1 else "caltech101", len(parts) == 3)
  return config
