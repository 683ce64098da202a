r"""Few-shot linear evaluation of a checkpoint: prints accuracy per dataset and shot count.

    python -m vit_jax.fewshot --checkpoint=/tmp/vit_quickstart/checkpoints \
        --dataset=digits --shots=1,5,10,25
    python -m vit_jax.fewshot --checkpoint=ViT-B_16.npz --model=ViT-B_16 --dataset=cifar10

A training run (its workdir, `checkpoints/` or one step folder) brings its model and
preprocessing in its `config.json` (a masked-patch-prediction run's too); an official
`.npz` takes --model, or its architecture and resolution are inferred from the array
shapes; Hugging Face and timm checkpoints, `hf-hub:<org>/<name>` and official names
(`ViT-B_16`) are read as `vit_jax.predict` reads them. --crop changes the resolution
(position embeddings are interpolated as for fine-tuning).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import ml_collections
from absl import flags

from vit_jax import cli, data, errors, models, paths, sharding, weights
from vit_jax.fewshot import evaluator as evaluator_lib
from vit_jax.fewshot import linear
from vit_jax.weights import hub, sources

_CHECKPOINT = flags.DEFINE_string(
  "checkpoint",
  None,
  "An official-layout .npz, a training run (its workdir, checkpoints/ or a step folder), a "
  "Hugging Face or timm checkpoint, hf-hub:<org>/<name> or an official name (ViT-B_16).",
)
_MODEL = flags.DEFINE_enum(
  "model",
  None,
  models.MODEL_NAMES,
  "The model of an .npz checkpoint (default: inferred from the shapes; a "
  "run's comes from its config.json).",
)
_DATASETS = flags.DEFINE_list("dataset", ["digits"], "tfds names or folder:/path, comma-separated.")
_SHOTS = flags.DEFINE_list(
  "shots",
  [str(s) for s in evaluator_lib.DEFAULT_SHOTS],
  "Examples per class in the few-shot train set.",
)
_SEEDS = flags.DEFINE_integer(
  "seeds", evaluator_lib.DEFAULT_SEEDS, "Class-balanced samples per shot count."
)
_L2_REG = flags.DEFINE_float("l2_reg", linear.DEFAULT_L2_REG, "The ridge term lambda.")
_TRAIN_SPLIT = flags.DEFINE_string(
  "train_split",
  None,
  "The split to sample shots from (default: the dataset's preset train split, else 'train').",
)
_TEST_SPLIT = flags.DEFINE_string(
  "test_split", None, "The held-out split (default: the dataset's preset test split, else 'test')."
)
_CROP = flags.DEFINE_integer(
  "crop",
  None,
  "Image size (default: the run's pp.crop, or "
  "what an .npz's position embeddings were trained for).",
)
_BATCH = flags.DEFINE_integer("batch", 256, "Images per forward pass (all devices).")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "tfds data_dir (default: the run's, or tfds').")
flags.mark_flag_as_required("checkpoint")


def _from_run(run: paths.RunPaths) -> tuple[ml_collections.ConfigDict, data.Settings]:
  """The run's model and its data settings (its preprocessing, data_dir, ...)."""
  if _MODEL.value:
    raise errors.CommandLineError(
      f"--model={_MODEL.value} would replace the model of the run in "
      f"{run.root}: leave --model out for a run's checkpoints."
    )
  run_config = ml_collections.ConfigDict(run.read_config())
  return run_config.model, data.Settings.from_config(run_config)


def _from_weights(checkpoint: str) -> tuple[ml_collections.ConfigDict, data.Settings]:
  """An .npz's (or Hugging Face folder's) model, and evaluation-only data settings."""
  loaded = sources.load(checkpoint, _MODEL.value)
  if not (_CROP.value or loaded.image_size):
    raise errors.CommandLineError(
      f"{checkpoint!r} does not say its image size (no learned position embeddings): pass --crop."
    )
  crop = loaded.image_size[0] if loaded.image_size else _CROP.value
  # No augmentation, no shuffling, no skipped images: evaluation only.
  settings = data.Settings(
    dataset="",
    data_dir=None,
    manual_dir=None,
    train_split="train",
    test_split="test",
    num_classes=None,
    crop=crop,
    min_area=1.0,
    flip=False,
    batch=_BATCH.value,
    batch_eval=_BATCH.value,
    shuffle_buffer=1,
    prefetch=2,
    seed=0,
    skip_corrupt_images=False,
    input_mean=tuple(models.with_family_defaults(loaded.config).input_mean),
    input_std=tuple(models.with_family_defaults(loaded.config).input_std),
  )
  return loaded.config, settings


def _config(checkpoint: str) -> tuple[ml_collections.ConfigDict, data.Settings, str]:
  """Model, data settings for the evaluator, and the parameters' source."""
  weights = hub.is_hub_source(checkpoint) or sources.is_hf_or_timm(checkpoint)
  run = None if weights else paths.RunPaths.containing(checkpoint)
  if run is not None:
    model_config, settings = _from_run(run)
    source = os.fspath(run.checkpoint_source(checkpoint))
  elif paths.as_path(checkpoint).is_dir() and not weights:
    raise errors.MissingError(
      f"No config.json in or above {checkpoint!r}: pass a run's workdir, its "
      "checkpoints/ folder or a step folder inside it."
    )
  else:
    model_config, settings = _from_weights(checkpoint)
    source = checkpoint
  settings = dataclasses.replace(
    settings,
    crop=_CROP.value or settings.crop,
    batch=_BATCH.value,
    batch_eval=_BATCH.value,
    data_dir=_DATA_DIR.value or settings.data_dir,
  )
  return model_config, settings, source


def main(args: list[str]) -> None:
  if args:
    raise errors.CommandLineError(f"Unexpected arguments: {args}")
  model_config, settings, checkpoint = _config(_CHECKPOINT.value)
  mesh = sharding.make_mesh(((sharding.DATA_AXIS, -1),))
  evaluator = evaluator_lib.FewShotEvaluator(
    model_config,
    settings,
    mesh,
    _DATASETS.value,
    shots=[int(s) for s in _SHOTS.value],
    seeds=_SEEDS.value,
    l2_reg=_L2_REG.value,
    train_split=_TRAIN_SPLIT.value,
    test_split=_TEST_SPLIT.value,
  )
  crop = settings.crop
  image = jnp.zeros((1, crop, crop, 3))
  init_params = jax.jit(evaluator.model.init)(jax.random.PRNGKey(0), image)["params"]
  params = weights.load_pretrained(
    checkpoint,
    jax.device_get(init_params),
    model_config,
    new_grid_hw=evaluator.model.grid_hw((crop, crop)),
  )
  params = jax.device_put(params, sharding.replicated(mesh))

  results = evaluator(params)
  print(f"{'dataset':<20} {'shots':>5} {'accuracy':>9} {'spread':>7} {'seconds':>8}")
  for r in results:
    print(f"{r.dataset:<20} {r.shots:>5} {r.mean:>9.4f} {r.spread:>7.4f} {r.seconds:>8.2f}")
  for r in {r.dataset: r for r in results}.values():
    print(
      f"{r.dataset}: features of {r.examples} images in {r.feature_seconds:.1f}s "
      f"({r.examples / r.feature_seconds:.0f}/s), {_SEEDS.value} seeds per row."
    )


if __name__ == "__main__":
  cli.exit_with(cli.run(sys.argv, cli.parse_flags, main))
