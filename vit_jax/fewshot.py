r"""Few-shot linear evaluation of a checkpoint: prints accuracy per dataset and shot count.

    python -m vit_jax.fewshot --checkpoint=/tmp/vit_quickstart/checkpoints \
        --dataset=digits --shots=1,5,10,25
    python -m vit_jax.fewshot --checkpoint=ViT-B_16.npz --model=ViT-B_16 --dataset=cifar10

A training run (its workdir, `checkpoints/` or one step folder) brings its model and
preprocessing in its `config.json` (a masked-patch-prediction run's too); an official
`.npz` takes --model, or its architecture and resolution are inferred from the array
shapes; Hugging Face and timm checkpoints, `hf-hub:<org>/<name>` and official names
(`ViT-B_16`) are read as `vit_jax.predict` reads them. --crop changes the resolution
(position embeddings are interpolated as for fine-tuning); --seq_len=N reads each image at
its own aspect ratio in at most N patches (NaFlex). An image-text checkpoint (a
contrastive run, a transformers SigLIP or CLIP folder, a LiT `.npz`) is evaluated on its
image tower's features.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
from absl import flags, logging

from vit_jax import cli, data, models, weights
from vit_jax.infra import errors, paths, sharding
from vit_jax.run import objectives
from vit_jax.run.evaluators import fewshot as fewshot_lib
from vit_jax.run.evaluators import ridge
from vit_jax.weights import formats, hub, run_checkpoint, sources

MAX_BATCH = 65536  # images per forward pass, all devices together


def _parse(argv: Sequence[str]) -> dict[str, Any]:
  """The flag values; a `CommandLineError` for a bad command line."""
  flag_values = cli.new_flag_values()
  holders = dict(
    **cli.define_model_flags(flag_values, ("checkpoint", "model")),
    dataset=flags.DEFINE_list(
      "dataset", ["digits"], "tfds names or folder:/path, comma-separated.", flag_values=flag_values
    ),
    shots=flags.DEFINE_list(
      "shots",
      [str(s) for s in fewshot_lib.DEFAULT_SHOTS],
      "Examples per class in the few-shot train set.",
      flag_values=flag_values,
    ),
    seeds=flags.DEFINE_integer(
      "seeds",
      fewshot_lib.DEFAULT_SEEDS,
      "Class-balanced samples per shot count.",
      flag_values=flag_values,
    ),
    l2_reg=flags.DEFINE_float(
      "l2_reg", ridge.DEFAULT_L2_REG, "The ridge term lambda.", flag_values=flag_values
    ),
    train_split=flags.DEFINE_string(
      "train_split",
      None,
      "The split to sample shots from (default: the dataset's preset train split, else 'train').",
      flag_values=flag_values,
    ),
    test_split=flags.DEFINE_string(
      "test_split",
      None,
      "The held-out split (default: the dataset's preset test split, else 'test').",
      flag_values=flag_values,
    ),
    crop=flags.DEFINE_integer(
      "crop",
      None,
      "Image size (default: the run's pp.crop, or what an .npz's position embeddings were "
      "trained for).",
      flag_values=flag_values,
    ),
    seq_len=flags.DEFINE_integer(
      "seq_len",
      None,
      "NaFlex: each image at its own aspect ratio in at most this many patches instead of "
      "the square crop (default: the run's config.pp.seq_len).",
      flag_values=flag_values,
    ),
    batch=flags.DEFINE_integer(
      "batch", 256, "Images per forward pass (all devices).", flag_values=flag_values
    ),
    data_dir=flags.DEFINE_string(
      "data_dir", None, "tfds data_dir (default: the run's, or tfds').", flag_values=flag_values
    ),
  )
  values = cli.parse_command_flags(flag_values, argv, holders, ("checkpoint",), __doc__)
  values["shots"] = _shot_counts(values["shots"])
  _check_values(values)
  return values


def _shot_counts(shots: Sequence[str]) -> list[int]:
  """--shots as positive integers; anything else names the flag's value."""
  text = ",".join(shots)
  try:
    counts = [int(s) for s in shots]
  except ValueError:
    counts = []
  if not counts or min(counts) < 1:
    raise errors.CommandLineError(
      f"--shots={text} must be positive integers, comma-separated (e.g. --shots=1,5,10)."
    )
  return counts


def _check_values(values: dict[str, Any]) -> None:
  """The numeric flags within their bounds, and --data_dir a folder if it exists."""
  for name, low in (("seeds", 1), ("batch", 1), ("crop", 1), ("seq_len", 1)):
    if values[name] is not None and values[name] < low:
      raise errors.CommandLineError(f"--{name}={values[name]} must be at least {low}.")
  if values["batch"] > MAX_BATCH:
    raise errors.CommandLineError(f"--batch={values['batch']} must be at most {MAX_BATCH}.")
  if not (math.isfinite(values["l2_reg"]) and values["l2_reg"] >= 0):
    raise errors.CommandLineError(
      f"--l2_reg={values['l2_reg']} must be a finite number >= 0 (the ridge term)."
    )
  data.check_data_dir(values["data_dir"], "--data_dir")


def _from_run(
  run: paths.RunPaths, values: dict[str, Any]
) -> tuple[ml_collections.ConfigDict, data.Settings]:
  """The run's model and its data settings (its preprocessing, data_dir, ...)."""
  if values["model"]:
    raise errors.CommandLineError(
      f"--model={values['model']} would replace the model of the run in "
      f"{run.root}: leave --model out for a run's checkpoints."
    )
  run_config, _ = run_checkpoint.run_model_config(run)
  settings = objectives.data_settings(run_config)
  data_dir = settings.data_dir
  if data_dir and "://" not in data_dir and not os.path.isdir(data_dir):
    # A read-only command builds nothing where a run's config.json points.
    logging.warning(
      "The run's data_dir %r is not a folder here: using tfds' default (or pass --data_dir).",
      data_dir,
    )
    settings = dataclasses.replace(settings, data_dir=None)
  return run_config.model, settings


def _from_weights(
  checkpoint: str, values: dict[str, Any]
) -> tuple[ml_collections.ConfigDict, data.Settings]:
  """The model of any weights source, and evaluation-only data settings: the images
  prepared as the checkpoint says (`LoadedModel.data_config`) at --crop, else at the
  size the model was trained for."""
  loaded = sources.load(checkpoint, values["model"])
  crop = values["crop"] or loaded.image_size_for(argument="--crop")[0]
  settings = data.Settings.for_evaluation(loaded.data_config, crop=crop, batch=values["batch"])
  return loaded.config, settings


def _config(values: dict[str, Any]) -> tuple[ml_collections.ConfigDict, data.Settings, str]:
  """Model, data settings for the evaluator, and the parameters' source."""
  checkpoint = values["checkpoint"]
  found = None if hub.is_hub_source(checkpoint) else formats.locate(checkpoint)
  is_run = found is not None and found.format is formats.RUN
  run = paths.RunPaths.containing(checkpoint) if is_run else None
  if run is not None:
    model_config, settings = _from_run(run, values)
    source = os.fspath(run.checkpoint_source(checkpoint))
  elif is_run:  # a folder of no run
    raise errors.MissingError(
      f"No config.json in or above {checkpoint!r}: pass a run's workdir, its "
      "checkpoints/ folder or a step folder inside it."
    )
  else:
    model_config, settings = _from_weights(checkpoint, values)
    source = checkpoint
  settings = dataclasses.replace(
    settings,
    crop=values["crop"] or settings.crop,
    batch=values["batch"],
    batch_eval=values["batch"],
    data_dir=values["data_dir"] or settings.data_dir,
  )
  if values["seq_len"] is not None:
    patch = models.image_settings(model_config).patches.size
    settings = settings.with_seq_len(values["seq_len"], tuple(patch), "--seq_len")
  return model_config, settings, source


def _evaluate(values: dict[str, Any]) -> None:
  """Evaluates the parsed command line's checkpoint and prints a row per dataset and shots."""
  model_config, settings, checkpoint = _config(values)
  model_config = models.image_settings(model_config)  # an image-text model's image tower
  mesh = sharding.make_mesh(((sharding.DATA_AXIS, -1),))
  evaluator = fewshot_lib.FewShotEvaluator(
    model_config,
    settings,
    mesh,
    values["dataset"],
    shots=values["shots"],
    seeds=values["seeds"],
    l2_reg=values["l2_reg"],
    train_split=values["train_split"],
    test_split=values["test_split"],
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
      f"({r.examples / r.feature_seconds:.0f}/s), {values['seeds']} seeds per row."
    )


def main(argv: Sequence[str]) -> int:
  """The command, callable in-process (`vit_jax.cli`): parses ``argv`` (argv[0]: the
  program), evaluates and prints; the exit status."""
  return cli.run_command(argv, _parse, _evaluate)


if __name__ == "__main__":
  cli.exit_with(main(sys.argv))
