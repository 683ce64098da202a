r"""Self-supervised pre-training by masked patch prediction (paper Sec. 4.6, Appendix B.1.2).

    python -m vit_jax.main --config=configs/mpp.py:b16,imagenet21k \
        --config.data_dir=/path/to/tfds --workdir=/tmp/b16_mpp
    python -m vit_jax.main --config=configs/mpp.py:digits --workdir=/tmp/digits_mpp

Labels are not used. Fine-tune the result with a supervised config and
``--config.pretrained=<workdir>/checkpoints``: the encoder's parameters have the supervised
model's names; the mask embedding and the MPP head are dropped and a zero head is made.

Recipe (``<model>,<dataset>``, the arguments of `configs/pretrain.py`): Adam (b1 0.9,
b2 0.999, no weight decay) at lr 2e-4, 10k warm-up steps then cosine decay, batch 4096,
resolution 224 with inception crop and flip; 50% of the patches corrupted (80% [mask],
10% another patch, 10% kept); target: the 3-bit mean colour of each corrupted patch (512
classes). The paper trains 1M steps on JFT; on the presets here the default is the
supervised pre-training's epochs (`pretrain.steps_for`; ``--config.total_steps`` to change).
``--config.mpp.target=downsampled|pixels`` picks the paper's ablation targets.

``digits``: the quickstart model and preprocessing (configs/quickstart.py) on the built-in
digits, a few minutes on a CPU; `configs/quickstart.py` fine-tunes it as it stands, and
few-shot accuracy of its features is logged during pre-training.
"""

from __future__ import annotations

import ml_collections

from configs import common, pretrain, quickstart, vit
from vit_jax import models


def _objective(config: ml_collections.ConfigDict) -> None:
  """The paper's corruption and target, trained with Adam without weight decay."""
  config.objective = "mpp"
  config.optim.name = "adam"
  config.optim.weight_decay = 0.0
  config.mpp = ml_collections.ConfigDict(
    dict(target="mean_color", corrupt_rate=0.5, mask=0.8, random=0.1)
  )


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """``'<model>,<dataset>'`` (e.g. ``'b16,imagenet21k'``) or ``'digits'``."""
  if arg == "digits":
    config = quickstart.get_config()
    _objective(config)
    config.total_steps = 1_000
    config.lr.base, config.lr.warmup_steps = 1e-3, 100
    config.fewshot.datasets = ("digits",)
    config.fewshot.every = 500
    return config

  model_name, dataset, preset = vit.parse_arg(arg, list(pretrain.EPOCHS), "b16,imagenet21k")
  config = common.get_config()
  _objective(config)
  config.dataset = dataset
  config.train_split = preset.train_split
  config.test_split = preset.test_split
  config.pp.crop = pretrain.CROP
  config.batch = pretrain.BATCH
  config.batch_eval = 1024
  config.model = models.get_model_config(model_name)

  config.total_steps = pretrain.steps_for(dataset)
  config.lr.base, config.lr.warmup_steps = 2e-4, pretrain.WARMUP_STEPS

  config.log_every = 100
  config.eval_every = 10_000
  config.checkpoint_every = 2_000
  return config
