r"""Fine-tuning a pre-trained ViT with the paper's recipe (Sec. 4.1, Appendix B.1.1).

    python -m vit_jax.main --config=configs/vit.py:b16,cifar10 \
        --config.pretrained=ViT-B_16 --workdir=/tmp/b16_cifar10

The argument is ``<model>,<dataset>``: a short model name (`MODELS`, e.g. ``b16`` for
ViT-B/16, ``r50_b16`` for the R50+ViT-B/16 hybrid, ``bit_r50x1`` for the BiT ResNet-50x1
baseline) and a dataset of
`vit_jax.data.presets.PRESETS` (cifar10, cifar100, imagenet2012, oxford_iiit_pet,
oxford_flowers102, ...). ``--config.pretrained`` is any weights source of
`vit_jax.weights.sources`: an official name (``ViT-B_16``: its copy on the Hugging Face
hub), ``hf-hub:<org>/<name>``, an official `.npz`, a timm or Hugging Face checkpoint, or
the `<workdir>/checkpoints` folder of a run of this project; without it the model trains
from scratch. The new head is zero-initialised when the class count differs (or with
``--config.reset_head=True``); the position embeddings are interpolated to the new grid
(``--config.posemb_resize=bilinear|bicubic|nearest``, or ``reinit`` for fresh ones).

Recipe: SGD momentum 0.9, batch 512, no weight decay, gradient clipping at global norm 1,
linear warm-up (500 steps, the official repository's value; a tenth of the run when that
is shorter) then cosine decay to 0, resolution 384 (the preset's crop; for ViT-H/14 392,
the next multiple of its patch size), inception crop and flip. Steps per dataset from the
presets: ImageNet 20k, CIFAR-10/100 10k, Pets and Flowers 500. Learning rate 0.03; the
paper picks it from {0.001, 0.003, 0.01, 0.03} ({0.003, 0.01, 0.03, 0.06} for ImageNet) on
the held-out train slice: ``--config.lr.base=0.01``. ``total_steps=0`` evaluates the
pre-trained weights only.

ImageNet is evaluated on its validation split and, as ``real/accuracy`` and
``v2/accuracy``, on ImageNet ReaL and ImageNet-V2 (tfds ``imagenet2012_real`` and
``imagenet_v2``, prepared in the same ``data_dir``; `presets.IMAGENET_EVALS`).

Expected (the official repository's table, ViT-B/16 pre-trained on ImageNet-21k, at 384):
CIFAR-10 99.02%, CIFAR-100 92.06%, ImageNet 84.53% top-1 accuracy.
"""

from __future__ import annotations

import ml_collections

from configs import common
from vit_jax import models
from vit_jax.data import presets

# Short name -> official name (vit_jax.models.MODEL_NAMES).
MODELS: dict[str, str] = {
  "ti16": "ViT-Ti_16",
  "s16": "ViT-S_16",
  "s32": "ViT-S_32",
  "b16": "ViT-B_16",
  "b32": "ViT-B_32",
  "b8": "ViT-B_8",
  "l16": "ViT-L_16",
  "l32": "ViT-L_32",
  "h14": "ViT-H_14",
  "r50_b16": "R50+ViT-B_16",
  "r50_b32": "R50+ViT-B_32",
  "r50_l16": "R50+ViT-L_16",
  "r50_l32": "R50+ViT-L_32",
  "r26_s32": "R26+ViT-S_32",
  "r_ti16": "R+ViT-Ti_16",
  # Later families with a 16x16 patch (the fine-tuning crop, 384, is a multiple of it).
  "siglip_b16": "SigLIP-B_16",
  "siglip2_b16": "SigLIP2-B_16",
  "siglip2_so400m16": "SigLIP2-So400m_16",
  "clip_b16": "CLIP-B_16",
  "dinov3_s16": "DINOv3-S_16",
  "dinov3_b16": "DINOv3-B_16",
  "dinov3_l16": "DINOv3-L_16",
  "pe_core_t16": "PE-Core-T_16",
  "pe_core_s16": "PE-Core-S_16",
  "pe_core_b16": "PE-Core-B_16",
  "rope_vit_s16": "RoPE-ViT-S_16",
  "rope_vit_b16": "RoPE-ViT-B_16",
  "rope_vit_l16": "RoPE-ViT-L_16",
  "rope_mixed_b16": "RoPE-Mixed-ViT-B_16",
  # ... and with a 14x14 patch (the crop: 392, the next multiple of it).
  "siglip_so400m14": "SigLIP-So400m_14",
  "eva02_ti14": "EVA02-Ti_14",
  "eva02_s14": "EVA02-S_14",
  "eva02_b14": "EVA02-B_14",
  "eva02_l14": "EVA02-L_14",
  # The paper's ResNet baselines (BiT ResNet-v2).
  **{
    f"bit_r{size}": f"BiT-R{size}"
    for size in ("50x1", "50x2", "101x1", "152x1", "152x2", "152x4", "200x3")
  },
}

FINETUNE_WARMUP_STEPS = 500  # The official repository's fine-tuning warm-up.
LEARNING_RATES: tuple[float, ...] = (0.001, 0.003, 0.01, 0.03)  # the paper's grid


def parse_arg(
  arg: str | None, valid_datasets: list[str], example: str
) -> tuple[str, str, presets.Preset]:
  """``'b16,cifar10'`` -> (official model name, dataset, its preset); one error otherwise."""
  parts = [p.strip() for p in (arg or "").split(",")]
  if len(parts) != 2 or not all(parts):
    raise ValueError(
      f"Config argument {arg!r} must be '<model>,<dataset>', e.g. "
      f"--config=...py:{example}. Models: {', '.join(MODELS)}. Datasets: "
      f"{', '.join(valid_datasets)}."
    )
  short, dataset = parts[0].lower(), parts[1].lower()
  problems = []
  if short not in MODELS:
    problems.append(f"unknown model {parts[0]!r} (valid: {', '.join(MODELS)})")
  if dataset not in valid_datasets:
    problems.append(f"unknown dataset {parts[1]!r} (valid: {', '.join(valid_datasets)})")
  if problems:
    raise ValueError(f"Config argument {arg!r}: {'; '.join(problems)}.")
  return MODELS[short], dataset, presets.PRESETS[dataset]


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The fine-tuning config for ``arg`` = ``'<model>,<dataset>'`` (e.g. ``'b16,cifar10'``)."""
  model_name, dataset, preset = parse_arg(arg, list(presets.PRESETS), "b16,cifar10")
  config = common.get_config()

  config.dataset = dataset
  config.train_split = preset.train_split
  config.test_split = preset.test_split
  config.num_classes = preset.num_classes
  config.model = models.get_model_config(model_name)
  # A whole grid of patches: the preset's crop, or the next multiple of the patch size
  # (ViT-H/14 at 384 -> 392, a 28x28 grid); a BiT ResNet takes any size.
  patch = 1 if models.is_bit(config.model) else config.model.patches.size[0]
  config.pp.crop = -(-preset.crop // patch) * patch

  if dataset == "imagenet2012":  # ReaL and V2 beside the validation split (prepared in data_dir)
    config.evals.update(presets.IMAGENET_EVALS)

  config.total_steps = preset.total_steps
  config.lr.warmup_steps = min(FINETUNE_WARMUP_STEPS, preset.total_steps // 10)

  steps = preset.total_steps
  config.log_every = max(1, min(50, steps // 10))
  config.eval_every = max(1, min(1000, steps // 5))
  config.checkpoint_every = config.eval_every
  return config
