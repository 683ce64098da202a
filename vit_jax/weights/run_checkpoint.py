"""A training run of this package read as a checkpoint: its folder (the workdir, its
`checkpoints/` or one step folder; layout: `vit_jax.infra.paths.RunPaths`), the model and crop
of its `config.json`, its class names, the Orbax step's parameters (`orbax_steps`), its
preprocessing and a contrastive run's tokenizer. Nothing here builds, writes or fetches
data: the run's data settings are never used."""

from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import ml_collections

from vit_jax import models
from vit_jax.data import caption_settings, data_config
from vit_jax.data.data_config import DataConfig
from vit_jax.infra import errors, storage
from vit_jax.infra.aliases import Params
from vit_jax.infra.paths import CONFIG_FILE, RunPaths, as_path
from vit_jax.weights import npz, orbax_steps, remote


def detect(path: str) -> bool:
  """Whether ``path`` is a folder: a run's, or Orbax steps alone; on a bucket one that holds
  steps (`remote.holds_steps`: any other folder there is read from a local copy)."""
  if storage.is_remote(path):
    return remote.holds_steps(path)
  return as_path(path).is_dir()


def read(
  path: str,
) -> tuple[models.Settings, Params, Optional[list[str]], int, ml_collections.ConfigDict]:
  """(model settings, per-layer params, class names, crop, run config) of the run that the
  folder ``path`` belongs to; its step: the one ``path`` names, else the newest."""
  run = RunPaths.containing(path)
  if run is None:
    raise errors.MissingError(
      f"{path!r} is a folder but neither a training run (no "
      f"{CONFIG_FILE} in it or up to two levels above) nor a Hugging Face "
      "ViT directory (config.json with model_type 'vit')."
    )
  run_config, crop = run_model_config(run)
  names = run.read_class_names()
  source = run.checkpoint_source(path)
  params = npz.scanned_to_layers(nn.unbox(dict(orbax_steps.read_params(source))))
  settings = models.model_settings(run_config.model).replace(scan=False)  # per-layer now
  return settings, params, names, crop, run_config


def eval_data_config(run_config: ml_collections.ConfigDict) -> DataConfig:
  """A run's eval preprocessing; a two-tower run's mean/std are its image tower's, as its
  input pipeline's were (`data.Needs`)."""
  return data_config.from_run_config(run_config, models.image_settings(run_config.model))


def run_tokenizer(run_config: ml_collections.ConfigDict, names: Optional[list[str]]) -> Any:
  """The tokenizer of a two-tower run's captions, as the run read them (the one rule,
  `data.caption_settings`): its data's own captions' (``config.text.tokenizer``), else the
  word tokenizer of its class names in its templates; None for an image model."""
  if not models.is_two_tower(run_config.model):
    return None
  return caption_settings.CaptionSettings.from_config(run_config).load_tokenizer(names)


def run_model_config(run: RunPaths) -> tuple[ml_collections.ConfigDict, int]:
  """A run's saved config and its crop, checked to hold a model (an object) and a
  positive integer ``pp.crop``: what the read-only commands use of it (its data settings
  are never used: nothing is built, written or fetched because of them)."""
  saved = run.read_config()
  pp = saved.get("pp")
  crop = pp.get("crop") if isinstance(pp, dict) else None
  if not isinstance(saved.get("model"), dict) or not isinstance(crop, int) or crop < 1:
    raise errors.CheckpointError(
      f"{run.config_path} is not a run config this package wrote: it needs a 'model' "
      f"object and a positive integer 'pp.crop' (model: {type(saved.get('model')).__name__}, "
      f"pp.crop: {crop!r}). Fix it, or put back the config.json the run wrote."
    )
  return ml_collections.ConfigDict(saved), crop
