"""The run config the speed benchmarks time: one model at one batch and crop, without dropout.

`throughput.py` and `gpu_check/` both build their train and inference rows from it, so
their figures describe the same step.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import common  # noqa: E402  (`configs/` is a folder of the repository)
from vit_jax.models import get_model_config  # noqa: E402

NUM_CLASSES = 1000


def speed_config(
  model: str,
  batch: int,
  resolution: int,
  *,
  dtype: str,
  attention: Optional[str],
  scan: bool = False,
  remat: bool = False,
) -> Any:
  """`configs/common.py` with ``model`` (a `MODEL_NAMES` name) at ``batch`` and
  ``resolution``, dropout off, ImageNet's 1000 classes."""
  config = common.get_config()
  config.model = get_model_config(model)
  config.model.dtype = dtype
  config.model.attention_impl = attention
  config.model.scan = scan
  config.model.remat = remat
  config.model.transformer.dropout_rate = 0.0
  config.model.transformer.attention_dropout_rate = 0.0
  config.pp.crop = resolution
  config.batch = config.batch_eval = batch
  config.num_classes = NUM_CLASSES
  return config
