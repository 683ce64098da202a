"""The one place of every run default: `get_config()`; each experiment config (the files
in `configs/`, or a user's own in Python) starts from it and changes only what differs.

The code reads these keys without fallback values of its own, so a config that is not
built from this one fails before the run starts, naming the keys it lacks
(`check_complete`). Installed with the package: ``from vit_jax.run import defaults``.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from vit_jax import models
from vit_jax.data import caption_settings
from vit_jax.infra import errors
from vit_jax.run.evaluators import fewshot, ridge


def get_config() -> ml_collections.ConfigDict:
  """Every run key at its default (a fine-tuning of ViT-B/16 on cifar10)."""
  config = ml_collections.ConfigDict()
  config.seed = 0

  # Data (vit_jax.data): a tfds name, or 'folder:/path' for <dir>/{train,test}/<class>/*.jpg.
  config.dataset = "cifar10"
  config.data_dir = ml_collections.FieldReference(None, field_type=str)
  config.manual_dir = ml_collections.FieldReference(None, field_type=str)
  config.train_split = "train[:98%]"
  config.test_split = "test"
  config.num_classes = ml_collections.FieldReference(None, field_type=int)  # None: from data
  config.label_key = "label"  # a tfds dataset's ClassLabel feature read as the label
  config.pp = ml_collections.ConfigDict(dict(crop=224, min_area=0.05, flip=True))
  config.pp.randaug = ml_collections.FieldReference(None, field_type=tuple)  # (layers, magnitude)
  # NaFlex: each image at its own aspect ratio in at most this many patches (e.g. 256), in
  # place of the crop x crop square (vit_jax/data/naflex_images.py); None: square crops.
  config.pp.seq_len = ml_collections.FieldReference(None, field_type=int)
  # NaFlex budgets each train step draws from (e.g. (128, 256, 576)), the batch sized to
  # config.batch x config.pp.seq_len tokens (vit_jax/data/budget_mix.py); None: seq_len.
  config.pp.train_seq_lens = ml_collections.FieldReference(None, field_type=tuple)
  config.batch = 512
  config.batch_eval = 512
  config.shuffle_buffer = 50_000
  config.prefetch = 2
  # Processes that decode and preprocess the images (None: one per core this process may
  # use; 0: threads of this process instead; vit_jax/data/decode_workers.py).
  config.decode_processes = ml_collections.FieldReference(None, field_type=int)
  config.skip_corrupt_images = False

  # Model (vit_jax.models.MODEL_NAMES) and its pre-trained weights.
  config.model = models.get_model_config("ViT-B_16")
  config.pretrained = ml_collections.FieldReference(None, field_type=str)  # any weights source
  config.reset_head = False  # True: a fresh zero head even when the class count matches.
  config.posemb_resize = "bilinear"  # or 'bicubic', 'nearest', 'reinit'

  # What is trained (vit_jax.run.objectives): 'classification', 'mpp' (configs/mpp.py), or
  # 'contrastive' (a two-tower model, configs/siglip.py and configs/lit.py).
  config.objective = "classification"
  # Contrastive image-text training: loss "sigmoid" (SigLIP) or "softmax" (CLIP); lock_image:
  # the image tower keeps its config.pretrained weights (LiT); captions from the labels
  # with the prompt templates of vit_jax.data.captions.TEMPLATES.
  # cache_image_features: with lock_image, the image tower runs once per example (its
  # features are kept on the host; vit_jax.run.feature_cache).
  config.contrastive = ml_collections.ConfigDict(
    dict(loss="sigmoid", lock_image=False, templates="digits", cache_image_features=False)
  )
  # Image-text data with its own captions (vit_jax.data.free_text; a contrastive run; the
  # rule: vit_jax.data.caption_settings): tokenizer: the text tower's (a folder, a
  # SentencePiece .model or a tokenizer.json; None: captions made from the labels with
  # config.contrastive.templates), eos: a SentencePiece model's end token ('none', 'yes',
  # 'sticky'), lower: its captions lower-cased (ASCII letters) and pad_id: its pad id (None:
  # the model's pad piece) -- big_vision's SigLIP and LiT: eos='sticky', lower=True,
  # pad_id=1 -- and a tfds dataset's image and text features (text None: its
  # 'captions/text', 'caption', 'captions' or 'text').
  config.text = ml_collections.ConfigDict(
    dict(
      eos=caption_settings.DEFAULT_EOS,
      lower=caption_settings.DEFAULT_LOWER,
      image_feature=caption_settings.DEFAULT_IMAGE_FEATURE,
    )
  )
  config.text.tokenizer = ml_collections.FieldReference(None, field_type=str)
  config.text.pad_id = ml_collections.FieldReference(None, field_type=int)
  config.text.text_feature = ml_collections.FieldReference(None, field_type=str)

  # Optimization (vit_jax.run.optim).
  config.loss = "softmax_xent"  # or 'sigmoid_xent' (vit_jax.run.losses)
  config.label_smoothing = 0.0  # of the training labels, in [0, 1)
  # Mixup of each example with its neighbour in the compiled step (vit_jax.run.mixup): the
  # mixing weight ~ Beta(p, p), p = 0: off; cutmix=True pastes a box instead of blending.
  config.mixup = ml_collections.ConfigDict(dict(p=0.0, cutmix=False))
  config.total_steps = 10_000
  # Micro-batches per step (an int), or 'auto': the fewest whose compiled step fits the
  # device memory, then model.remat if none does (vit_jax.run.memory_fit).
  config.accum_steps = ml_collections.FieldReference(1, field_type=object)
  config.lr = ml_collections.ConfigDict(dict(base=0.03, warmup_steps=500, decay="cosine", end=0.0))
  config.optim = ml_collections.ConfigDict(
    dict(
      name="sgd",
      momentum=0.9,
      momentum_dtype="float32",
      b1=0.9,
      b2=0.999,
      eps=1e-8,
      weight_decay=0.0,
      decay_all_params=False,
      grad_clip_norm=1.0,
    )
  )

  # Devices (vit_jax.infra.sharding): mesh axes and sizes (-1: all remaining devices). The names
  # are vit_jax.infra.sharding's DATA_AXIS and MODEL_AXIS, written out as a user gives them.
  config.mesh = (("data", -1), ("model", 1))
  config.partitioning = "data_parallel"  # or 'fsdp', 'tensor_parallel'

  # Loop.
  config.log_every = 50
  config.eval_every = 1000
  config.checkpoint_every = 1000
  config.keep_checkpoints = 3
  # Resuming with another seed, or another batch or shuffle_buffer, changes the data order
  # from the resumed step on: an error unless the switch is True (the change is then
  # recorded in <workdir>/config_history.jsonl).
  config.allow_changed_seed = False
  config.allow_changed_batch = False
  # Few-shot linear evaluation of the frozen features every `every` steps, logged as
  # fewshot/<dataset>_<shots>shot (vit_jax.run.evaluators.fewshot); off while `datasets` is empty.
  config.fewshot = ml_collections.ConfigDict(
    dict(
      datasets=(),
      shots=fewshot.DEFAULT_SHOTS,
      seeds=fewshot.DEFAULT_SEEDS,
      l2_reg=ridge.DEFAULT_L2_REG,
      every=1000,
    )
  )
  # Named evaluations beside config.test_split's (vit_jax.run.evaluators.instances):
  # config.evals.<name> = dict(kind='accuracy' or 'real', dataset, split, label_key, every,
  # pp), logged as <name>/accuracy; e.g. ImageNet ReaL and V2 in configs/vit.py's imagenet2012.
  config.evals = ml_collections.ConfigDict()
  return config


# Keys that a config written before them may lack (read as their defaults).
OPTIONAL_KEYS = frozenset({"evals", "label_key"})


def check_complete(config: Any) -> None:
  """One ConfigError naming the top-level keys of `get_config` that ``config`` lacks (a
  bare ``ConfigDict`` lacks them all)."""
  missing = sorted(set(get_config()) - set(config) - OPTIONAL_KEYS)
  if missing:
    raise errors.ConfigError(
      f"The run config lacks {len(missing)} keys: {', '.join(missing)}. Start from "
      "vit_jax.run.defaults.get_config() (what configs/*.py do) and set what differs."
    )
