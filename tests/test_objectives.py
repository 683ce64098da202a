"""Each objective's entry answers for it (`vit_jax.run.objectives`): its checks, which the
resolver raises, the data it needs, and the tokenizer of its captions, which the input
pipeline and the loader of a finished run get by the one rule (`data.caption_settings`)."""

from __future__ import annotations

import json

import ml_collections
import pytest

from configs import common, siglip
from configs import mpp as mpp_config
from tests import train_fixtures
from vit_jax import models, run
from vit_jax.data import captions
from vit_jax.data.caption_settings import CaptionSettings
from vit_jax.data.dataset import DatasetInfo
from vit_jax.infra import errors, sharding
from vit_jax.run import defaults, objectives
from vit_jax.weights import run_checkpoint

TEXT = dict(width=16, depth=1, mlp_dim=32, num_heads=2, vocab_size=64, pool="gap")
NAMES = ["zero", "one", "two"]


def _siglip(**overrides) -> ml_collections.ConfigDict:
  config = siglip.get_config("digits")
  train_fixtures.override(config, train_fixtures.TINY)
  config.model = models.two_tower_config(
    models.get_model_config("testing"), text=TEXT, text_len=8, embed_dim=16
  )
  config.num_classes = 3
  return train_fixtures.override(config, overrides)


def _saved(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``config`` as a finished run's config.json reads back."""
  return ml_collections.ConfigDict(json.loads(config.to_json_best_effort()))


def _resolve(config: ml_collections.ConfigDict) -> run.RunSpec:
  return run.resolve(config, mesh=sharding.make_mesh(tuple(config.mesh)), open_data=False)


def test_captions_made_from_labels_are_read_back_with_the_runs_tokenizer():
  config = _siglip()
  text = objectives.data_settings(config).text
  assert text == CaptionSettings(8, templates=config.contrastive.templates)
  assert CaptionSettings.from_config(_saved(config)) == text
  words = ["a photo of the number one.", "two"]
  built = captions.Captions(NAMES, config.contrastive.templates, 8).tokenizer
  loaded = run_checkpoint.run_tokenizer(_saved(config), NAMES)
  assert loaded.encode(words, 8).tolist() == built.encode(words, 8).tolist()
  assert run_checkpoint.run_tokenizer(_saved(config), None) is None  # no class names saved


def test_free_text_captions_and_older_configs_follow_the_same_rule():
  config = _siglip(**{"text.tokenizer": "/checkpoint/spiece.model", "text.eos": "yes"})
  text = objectives.data_settings(config).text
  assert (text.tokenizer, text.eos, text.templates) == ("/checkpoint/spiece.model", "yes", None)
  assert CaptionSettings.from_config(_saved(config)) == text
  older = _saved(config)
  del older["text"]  # a config.json written before free-text captions existed
  assert CaptionSettings.from_config(older) == CaptionSettings(8, templates="digits")
  assert CaptionSettings(8).eos == defaults.get_config().text.eos  # one default


def test_image_models_have_no_captions_and_load_no_tokenizer():
  config = common.get_config()
  assert objectives.data_settings(config).text is None
  assert run_checkpoint.run_tokenizer(_saved(config), NAMES) is None


def test_a_two_tower_runs_images_are_normalised_as_its_image_tower_expects():
  config = _siglip()
  config.model.image.input_mean, config.model.image.input_std = (0.48, 0.46, 0.41), (0.3,) * 3
  settings = objectives.data_settings(config)
  assert (settings.input_mean, settings.input_std) == ((0.48, 0.46, 0.41), (0.3,) * 3)
  evaluated = settings.eval_data_config()  # the eval images as the train images
  assert (evaluated.mean, evaluated.std) == ((0.48, 0.46, 0.41), (0.3,) * 3)
  loaded = run_checkpoint.eval_data_config(_saved(config))  # the finished run, loaded
  assert (loaded.mean, loaded.std) == ((0.48, 0.46, 0.41), (0.3,) * 3)


@pytest.mark.parametrize(
  "overrides, message",
  [
    ({"contrastive.lock_image": True}, "lock_image=True keeps the image tower as it starts"),
    ({"contrastive.loss": "hinge"}, "Unknown config.contrastive.loss='hinge'"),
    ({"model": models.get_model_config("testing")}, "trains a two-tower model"),
  ],
)
def test_the_contrastive_checks_are_the_entrys_and_the_resolver_raises_them(overrides, message):
  config = _siglip(**overrides)
  with pytest.raises(errors.ConfigError, match=message):
    objectives.entry("contrastive").check(config)
  with pytest.raises(errors.ConfigError, match=message):
    _resolve(config)


def test_mixup_is_refused_where_the_objective_trains_on_no_labels():
  assert objectives.entry("classification").trains_on_labels
  assert not objectives.entry("contrastive").trains_on_labels
  assert not objectives.entry("mpp").trains_on_labels
  with pytest.raises(errors.ConfigError, match="config.mixup.p=0.2 mixes images and labels"):
    _resolve(_siglip(**{"mixup.p": 0.2}))


def test_the_mpp_entry_checks_its_section():
  config = mpp_config.get_config("digits")
  config.mpp.target = "colour"
  with pytest.raises(errors.ConfigError, match="Unknown config.mpp.target='colour'"):
    objectives.entry("mpp").check(config)
  with pytest.raises(errors.ConfigError, match="Unknown config.mpp.target='colour'"):
    _resolve(config)
  config = common.get_config()
  config.objective, config.num_classes = "mpp", 3
  train_fixtures.override(config, train_fixtures.TINY)
  config.model = models.get_model_config("testing")
  with pytest.raises(errors.ConfigError, match="reads config.mpp .* start from configs/mpp.py"):
    run.build(config, open_data=False)


def test_the_data_checks_are_the_entrys():
  one_class = DatasetInfo(num_classes=1, num_train=8, num_test=8, class_names=["a"])
  config = common.get_config()
  settings = objectives.data_settings(config)
  check = objectives.entry("classification").check_data
  with pytest.raises(errors.ConfigError, match="has 1 class: a classifier needs at least 2"):
    check(config, None, settings, one_class)
  check(config, None, settings, None)  # the data not read: nothing to check
  small = _siglip(**{"model.text.vocab_size": 4})
  model = models.model_settings(small.model)
  info = DatasetInfo(num_classes=3, num_train=8, num_test=8, class_names=NAMES)
  with pytest.raises(errors.ConfigError, match="vocab_size=4 is smaller than the .* words"):
    objectives.entry("contrastive").check_data(small, model, objectives.data_settings(small), info)


def test_an_unknown_objective_is_one_error_naming_the_choices():
  with pytest.raises(errors.ConfigError, match="config.objective='foo'.*'classification'"):
    objectives.entry("foo")


def test_each_objective_declares_its_optional_capabilities_on_the_base_class():
  """The run reads them as plain attributes: an objective without one has its default."""
  for kind in (
    objectives.classification.Classification,
    objectives.masked_patches.MaskedPatchPrediction,
    objectives.contrastive.Contrastive,
  ):
    assert issubclass(kind, objectives.Objective)
  plain = objectives.classification.Classification
  assert (plain.frozen, plain.pretrained_key, plain.text_len) == ((), None, None)
  assert (plain.accuracy_metric, dict(plain.batch_fields)) == ("accuracy", {})
  assert plain.train_flops_per_example is None and plain.accumulated_value_and_grad is None
  assert objectives.masked_patches.MaskedPatchPrediction.accuracy_metric == "patch_accuracy"
  two_tower = objectives.contrastive.Contrastive
  assert two_tower.accuracy_metric == "in_batch_top1"
  assert callable(two_tower.accumulated_value_and_grad)
