r"""Zero-shot classification and retrieval of a contrastive run (SigLIP, CLIP, LiT).

    python -m vit_jax.zeroshot --checkpoint=/tmp/siglip_digits --dataset=digits

The run (its workdir, `checkpoints/` or one step folder) brings its model, preprocessing,
text length and tokenizer (trained on its captions: its dataset's class names and its
templates). ``--dataset`` is any labelled tfds dataset or ``folder:/path``: its class
names, through ``--templates`` (default: the run's), become the prompts; words the run
never saw are unknown to its tokenizer (a warning says how many). Prints zero-shot
accuracy on ``--split`` and retrieval recall@1/5/10 both ways
(`vit_jax.run.evaluators.zeroshot`).
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import jax
from absl import flags, logging

from vit_jax import cli, data, errors, paths, run, sharding
from vit_jax.data import captions as captions_lib
from vit_jax.data.dataset import Dataset
from vit_jax.run import defaults, objectives
from vit_jax.run.evaluators import zeroshot
from vit_jax.weights import orbax_steps, run_checkpoint


def _parse(argv: Sequence[str]) -> dict[str, Any]:
  flag_values = cli.new_flag_values()
  holders = dict(
    checkpoint=flags.DEFINE_string(
      "checkpoint", None, "A contrastive run: its workdir, checkpoints/ or a step folder.",
      flag_values=flag_values,
    ),
    dataset=flags.DEFINE_string(
      "dataset", None, "A labelled tfds name or folder:/path (default: the run's).",
      flag_values=flag_values,
    ),
    split=flags.DEFINE_string(
      "split", None, "The split to classify (default: the run's test split, else 'test').",
      flag_values=flag_values,
    ),
    templates=flags.DEFINE_string(
      "templates", None, f"Prompt templates, one of {tuple(captions_lib.TEMPLATES)} "
      "(default: the run's).", flag_values=flag_values,
    ),
    data_dir=flags.DEFINE_string(
      "data_dir", None, "tfds data_dir (default: the run's).", flag_values=flag_values
    ),
  )  # fmt: skip
  values = cli.parse_command_flags(flag_values, argv, holders, ("checkpoint",), __doc__)
  if values["templates"] is not None:
    captions_lib.check_templates(values["templates"])
  return values


def _run_config(values: dict[str, Any]) -> tuple[Any, paths.RunPaths, data.CaptionSettings]:
  found = paths.RunPaths.containing(values["checkpoint"])
  if found is None:
    raise errors.CommandLineError(
      f"--checkpoint={values['checkpoint']} is not a training run (no config.json in it or "
      "its two parents): name the workdir of a contrastive run (configs/siglip.py, lit.py)."
    )
  config, _ = run_checkpoint.run_model_config(found)
  base = defaults.get_config()
  for key in set(base) - set(config):  # added to the package after the run was made
    config[key] = base[key]
  captions = objectives.entry(config.objective).data_needs(config).text
  if captions is None:  # its objective trains on no texts
    raise errors.CommandLineError(
      f"The run in {found.root} trains {config.get('objective')!r}, not an image-text "
      "model: zero-shot needs a contrastive run (configs/siglip.py, configs/lit.py)."
    )
  return config, found, captions


def _evaluate(values: dict[str, Any]) -> None:
  config, found, captions = _run_config(values)
  run_names = found.read_class_names()
  if not run_names:
    raise errors.CheckpointError(f"{found.root} has no class_names.json: its captions' words.")
  length = captions.text_len
  tokenizer = captions.load_tokenizer(run_names)  # the run's, as it was trained
  if values["dataset"] and values["dataset"] != config.dataset:
    config.dataset, config.num_classes = values["dataset"], None
    config.test_split = data.PRESETS[values["dataset"]].test_split if values[
      "dataset"] in data.PRESETS else "test"  # fmt: skip
  config.test_split = values["split"] or config.test_split
  config.data_dir = values["data_dir"] or config.data_dir
  config.contrastive.templates = values["templates"] or config.contrastive.templates
  config.total_steps, config.pretrained = 0, None  # evaluates the run's own parameters
  config.contrastive.lock_image = False
  mesh = sharding.make_mesh(((sharding.DATA_AXIS, -1),))
  steps = run.build(config, mesh=mesh)
  names = Dataset(steps.spec.data).class_names
  prompts = captions_lib.Captions(names, config.contrastive.templates, length, tokenizer)
  unknown = sum(int((row == tokenizer.unk_id).any()) for row in prompts.ids.reshape(-1, length))
  if unknown:
    logging.warning("%d prompts hold words the run's tokenizer does not know.", unknown)
  params = jax.device_put(
    orbax_steps.read_params(found.checkpoint_source(values["checkpoint"])),
    steps.state_shardings.params,
  )
  evaluator = zeroshot.ZeroShotEvaluator(
    steps.objective, prompts, data.eval_iterator(steps.spec.data, mesh), mesh
  )
  metrics = evaluator(params)
  print(f"{config.dataset} {config.test_split}: {int(metrics.pop('zeroshot/examples'))} images")
  for name, value in metrics.items():
    print(f"{name:<40} {value:.4f}")


def main(argv: Sequence[str]) -> int:
  """The command, callable in-process (`vit_jax.cli`): the exit status."""
  return cli.run_command(argv, _parse, _evaluate)


if __name__ == "__main__":
  cli.exit_with(main(sys.argv))
