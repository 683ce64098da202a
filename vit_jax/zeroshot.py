r"""Zero-shot classification and retrieval of an image-text model (SigLIP, CLIP, LiT).

    python -m vit_jax.zeroshot --checkpoint=/tmp/siglip_digits --dataset=digits
    python -m vit_jax.zeroshot --checkpoint=siglip.npz --dataset=folder:/photos
    python -m vit_jax.zeroshot --checkpoint=siglip2_naflex.npz --dataset=folder:/docs --seq_len=256

``--checkpoint`` is any two-tower model `vit_jax.load` reads, with its tokenizer, text
length and eval preprocessing: a contrastive run of this package (its workdir,
`checkpoints/` or one step folder), big_vision's SigLIP or LiT `.npz`, the official LiT
`.npz`, a transformers SigLIP or CLIP folder. ``--dataset`` is any labelled tfds dataset
or ``folder:/path``: its class names, through ``--templates``, become the prompts. A run
brings its own dataset and templates (the defaults) and a tokenizer trained on its
captions, to which words it never saw are unknown (a warning says how many); any other
checkpoint names no dataset, so ``--dataset`` is required, and the templates default to
`CHECKPOINT_TEMPLATES` (CLIP's prompts for photographs: a released model was trained on
photographs with their captions). Prints zero-shot accuracy on
``--split`` and retrieval recall@1/5/10 both ways (`vit_jax.run.evaluators.zeroshot`).
``--seq_len``: each image at its own aspect ratio in that many patches (NaFlex, as
``predict --seq_len``) instead of the square crop.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Sequence

import jax
from absl import flags, logging

from vit_jax import cli, data, models
from vit_jax.data import captions as captions_lib
from vit_jax.data.dataset import Dataset
from vit_jax.infra import errors, sharding
from vit_jax.run import defaults, objectives
from vit_jax.run.evaluators import zeroshot
from vit_jax.weights import sources

CHECKPOINT_TEMPLATES = "clip"  # --templates' default for a checkpoint that is not a run


def _parse(argv: Sequence[str]) -> dict[str, Any]:
  flag_values = cli.new_flag_values()
  holders = dict(
    checkpoint=flags.DEFINE_string(
      "checkpoint", None, "An image-text model: a contrastive run, a SigLIP/LiT .npz, a "
      "transformers SigLIP or CLIP folder.",
      flag_values=flag_values,
    ),
    dataset=flags.DEFINE_string(
      "dataset", None, "A labelled tfds name or folder:/path (default: a run's own).",
      flag_values=flag_values,
    ),
    split=flags.DEFINE_string(
      "split", None, "The split to classify (default: the run's test split, else 'test').",
      flag_values=flag_values,
    ),
    templates=flags.DEFINE_string(
      "templates", None, f"Prompt templates, one of {tuple(captions_lib.TEMPLATES)} "
      "(default: a run's own, else the package's).", flag_values=flag_values,
    ),
    data_dir=flags.DEFINE_string(
      "data_dir", None, "tfds data_dir (default: the run's).", flag_values=flag_values
    ),
    seq_len=flags.DEFINE_integer(
      "seq_len", None, "NaFlex: each image at its own aspect ratio in at most this many "
      "patches instead of the square crop (default: the run's config.pp.seq_len).",
      flag_values=flag_values,
    ),
  )  # fmt: skip
  values = cli.parse_command_flags(flag_values, argv, holders, ("checkpoint",), __doc__)
  if values["templates"] is not None:
    captions_lib.check_templates(values["templates"])
  return values


def _with_dataset(values: dict[str, Any], settings: data.Settings) -> data.Settings:
  """``settings`` on --dataset (its preset's test split, else 'test'), --split and
  --data_dir where given; no captions in the batches (the prompts are made here)."""
  name = values["dataset"]
  if name and name != settings.dataset:
    preset = data.PRESETS.get(name)
    split = preset.test_split if preset is not None else "test"
    settings = dataclasses.replace(settings, dataset=name, num_classes=None, test_split=split)
  return dataclasses.replace(
    settings,
    test_split=values["split"] or settings.test_split,
    data_dir=values["data_dir"] or settings.data_dir,
    text=None,
  )


def _source(values: dict[str, Any]) -> tuple[sources.LoadedModel, data.Settings, str]:
  """The two-tower model of --checkpoint (`vit_jax.load`: its parameters, tokenizer and
  text length), the eval data settings and the templates. A training run brings its data
  settings and templates; any other checkpoint has none, so --dataset is required and the
  images are prepared as the checkpoint says (`LoadedModel.data_config`)."""
  checkpoint = values["checkpoint"]
  loaded = sources.load(checkpoint)
  if not models.is_two_tower(loaded.config):
    raise errors.CommandLineError(
      f"--checkpoint={checkpoint} is an image model, not an image-text one: zero-shot needs "
      "two towers (a contrastive run, a SigLIP, CLIP or LiT checkpoint)."
    )
  base = defaults.get_config()
  if loaded.run_config is not None:
    config = loaded.run_config
    for key in set(base) - set(config):  # added to the package after the run was made
      config[key] = base[key]
    settings, templates = objectives.data_settings(config), config.contrastive.templates
  elif not values["dataset"]:
    raise errors.CommandLineError(
      f"--checkpoint={checkpoint} is no training run, so it names no dataset: pass "
      "--dataset=folder:/path/to/images (a folder per class) or a labelled tfds name."
    )
  else:
    crop = loaded.image_size_for(argument="--checkpoint")[0]
    batch = base.batch_eval
    settings = data.Settings.for_evaluation(loaded.data_config, crop=crop, batch=batch)
    templates = CHECKPOINT_TEMPLATES
  if values["seq_len"] is not None:
    patch = models.image_settings(loaded.config).patches.size
    settings = settings.with_seq_len(values["seq_len"], tuple(patch), "--seq_len")
  return loaded, _with_dataset(values, settings), values["templates"] or templates


def _evaluate(values: dict[str, Any]) -> None:
  data.check_data_dir(values["data_dir"], "--data_dir")
  loaded, settings, templates = _source(values)
  if loaded.tokenizer is None:  # a run of captions made from labels, without class_names.json
    raise errors.CheckpointError(f"{loaded.source} has no tokenizer (no class_names.json).")
  mesh = sharding.make_mesh(((sharding.DATA_AXIS, -1),))
  names = Dataset(settings).class_names
  length = loaded.config.text_len
  prompts = captions_lib.Captions(names, templates, length, loaded.tokenizer)
  if isinstance(loaded.tokenizer, captions_lib.CaptionTokenizer):  # a run's, of its words
    unk = loaded.tokenizer.unk_id
    unknown = sum(int((row == unk).any()) for row in prompts.ids.reshape(-1, length))
    if unknown:
      logging.warning("%d prompts hold words the run's tokenizer does not know.", unknown)
  module = loaded.module()
  embed = lambda p, images, ids: module.apply({"params": p}, images, ids)  # noqa: E731
  batches = data.eval_iterator(settings, mesh)
  evaluator = zeroshot.ZeroShotEvaluator(embed, prompts, batches, mesh)
  params = jax.device_put(loaded.params, sharding.replicated(mesh))
  metrics = evaluator(params)
  print(f"{settings.dataset} {settings.test_split}: {int(metrics.pop('zeroshot/examples'))} images")
  for name, value in metrics.items():
    print(f"{name:<40} {value:.4f}")


def main(argv: Sequence[str]) -> int:
  """The command, callable in-process (`vit_jax.cli`): the exit status."""
  return cli.run_command(argv, _parse, _evaluate)


if __name__ == "__main__":
  cli.exit_with(main(sys.argv))
