r"""Quickstart: a small ViT trained from scratch on the built-in `digits` dataset, on a CPU.

    python -m vit_jax.main --config=configs/quickstart.py --workdir=/tmp/vit_quickstart

No network is needed: `digits` (scikit-learn's 1,797 8x8 handwritten digits, 10 classes)
builds into the tfds data_dir in a second. A few minutes on a 2-core CPU; the accuracy to
expect (mean and range over seeds, measured) is in README.md, "Quickstart".
"""

import ml_collections

from configs import common
from vit_jax import models


def get_config() -> ml_collections.ConfigDict:
  config = common.get_config()
  config.dataset = "digits"
  config.train_split = "train"
  config.test_split = "test"
  # 8x8 digits upsampled to 16x16, 4x4 patches: a 4x4 grid of tokens plus the class token.
  config.pp.crop, config.pp.min_area, config.pp.flip = 16, 0.8, False

  config.model = models.get_model_config("testing")
  config.model.name = "ViT-quickstart"
  config.model.hidden_size = 64
  config.model.transformer.num_layers = 4
  config.model.transformer.mlp_dim = 128
  config.model.transformer.num_heads = 4

  config.batch = 128
  config.batch_eval = 256
  config.shuffle_buffer = 2_000
  config.total_steps = 2_000
  config.lr.base = 2e-3
  config.lr.warmup_steps = 100
  config.optim.name = "adamw"
  config.optim.weight_decay = 0.05

  config.log_every = 100
  config.eval_every = 500
  config.checkpoint_every = 500
  return config
