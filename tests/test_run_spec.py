"""A run resolved once (`vit_jax.run.resolve`), its steps built apart from the loop, and the
run folder found from any path inside it."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest
from etils import epath
from flax import traverse_util

from tests import train_fixtures
from vit_jax import models, run
from vit_jax.infra import errors, sharding
from vit_jax.run import folder as folder_lib
from vit_jax.run import resolver, resume_policy
from vit_jax.weights import sources

pytest_plugins = ["tests.finished_run"]  # the finished_run fixture


def _spec(config, **kwargs):
  mesh = sharding.make_mesh(tuple(config.mesh))
  return resolver.resolve(config, mesh=mesh, **kwargs), mesh


def test_the_spec_is_typed_immutable_and_keeps_the_config_json(tiny_config):
  spec, _ = _spec(tiny_config)
  assert (spec.batch, spec.crop, spec.num_classes, spec.num_train) == (16, 8, 10, 1437)
  assert spec.optimizer.lr_base == tiny_config.lr.base and spec.loop.total_steps == 6
  assert spec.accum_steps == 1 and spec.config_json["model"]["name"] == "testing"
  with pytest.raises(dataclasses.FrozenInstanceError):
    spec.seed = 1
  with pytest.raises(AttributeError):
    spec.model.hidden_size = 8  # the model config is frozen too


def test_steps_build_and_compile_from_abstract_inputs_without_data_or_workdir(tmp_path):
  """What planning for another machine needs: a spec without reading the data (class count
  from the config), and a compiled step from ShapeDtypeStructs only."""
  config = train_fixtures.tiny_config(str(tmp_path / "no_data_here"), num_classes=7)
  spec, mesh = _spec(config, open_data=False)
  assert spec.num_train is None and spec.num_classes == 7
  steps = run.build_steps(spec, mesh)
  batch = steps.abstract_train_batch()
  assert batch["image"].shape == (16, 8, 8, 3) and batch["label"].shape == (16, 7)
  assert batch["image"].sharding == steps.batch_sharding
  assert steps.abstract_eval_batch()["mask"].shape == (64,)
  compiled = steps.compile_train_step()
  flops, source = steps.step_flops(compiled)
  assert source == "xla" and flops > 0
  leaves = jax.tree.leaves(steps.abstract_state)
  assert all(isinstance(x, jax.ShapeDtypeStruct) and x.sharding is not None for x in leaves)
  assert os.listdir(tmp_path) == []  # nothing was read or written


def test_every_settings_error_comes_before_anything_is_built(tiny_config):
  tiny_config.accum_steps = 3  # 16 does not split into 3 micro-batches
  with pytest.raises(errors.ConfigError, match="config.batch=16 is not divisible"):
    _spec(tiny_config, open_data=False)


@pytest.mark.parametrize(
  "key, value, fragment",
  [
    ("model__classifier", "tokens", "Unknown config.model.classifier='tokens'"),
    ("model__remat_policy", "save_all", "Unknown config.model.remat_policy='save_all'"),
    ("posemb_resize", "linear", "Unknown config.posemb_resize='linear'"),
    ("model__posemb", "sincos", "Unknown config.model.posemb='sincos'"),
  ],
)
def test_resolve_rejects_a_bad_model_option_before_reading_or_building_anything(
  tmp_path, key, value, fragment
):
  config = train_fixtures.tiny_config(str(tmp_path / "no_data_here"), num_classes=7)
  train_fixtures.override(config, {key.replace("__", "."): value})
  with pytest.raises(errors.ConfigError, match=fragment):
    _spec(config, open_data=False)
  assert os.listdir(tmp_path) == []


def test_each_evaluator_reads_the_config_section_of_its_name_when_the_run_is_resolved(tmp_path):
  config = train_fixtures.tiny_config(str(tmp_path / "no_data_here"), num_classes=7)
  config.fewshot.datasets = ("digits",)
  config.fewshot.shots = (2, 3)
  spec, _ = _spec(config, open_data=False)
  fewshot = spec.evaluators["fewshot"]
  assert (fewshot.datasets, fewshot.shots, fewshot.every) == (("digits",), (2, 3), 1000)
  config.fewshot.every = 0  # a bad option is an error before anything is built
  with pytest.raises(errors.ConfigError, match=r"config.fewshot.every=0 must be positive"):
    _spec(config, open_data=False)
  assert os.listdir(tmp_path) == []


def test_the_spec_s_model_is_typed_settings_that_create_model_also_takes(tiny_config):
  spec, _ = _spec(tiny_config)
  assert isinstance(spec.model, models.ModelSettings)
  assert spec.model.transformer.num_heads == tiny_config.model.transformer.num_heads
  assert spec.with_model(remat=True).model.remat and not spec.model.remat
  from_settings = models.create_model(spec.model, num_classes=3)
  # The resolver fills an unset dtype and attention with the backend's choice.
  tiny_config.model.dtype = spec.model.dtype
  tiny_config.model.attention_impl = spec.model.attention_impl
  from_config = models.create_model(tiny_config.model, num_classes=3)
  assert from_settings == from_config


def test_the_run_folder_is_found_from_any_path_inside_it(finished_run):
  root = epath.Path(finished_run)
  for inside in (root, root / "checkpoints", root / "checkpoints" / "6"):
    for given in (str(inside), f"file://{inside}", inside):
      folder = folder_lib.RunFolder.containing(given)
      assert folder is not None and folder.root == root, given
  assert folder_lib.RunFolder.containing(root.parent) is None
  folder = folder_lib.RunFolder(f"file://{root}")
  assert folder.checkpoint_source(f"file://{root}") == root / "checkpoints"
  assert folder.checkpoint_source(root / "checkpoints" / "3") == root / "checkpoints" / "3"
  assert folder.read_config()["model"]["hidden_size"] == 16  # the run's tiny model


def test_predict_and_export_read_a_run_given_as_url_or_epath(finished_run):
  """predict and export read checkpoints through `sources.load`; fewshot's command is run
  on a file:// URL in test_fewshot.py."""
  want = traverse_util.flatten_dict(sources.load(finished_run).params, sep="/")
  for given in (f"file://{finished_run}/checkpoints", epath.Path(finished_run) / "checkpoints"):
    got = traverse_util.flatten_dict(sources.load(given).params, sep="/")
    assert got.keys() == want.keys()
    for k in want:
      np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def _repo_text(name):
  with open(os.path.join(os.path.dirname(__file__), os.pardir, name)) as f:
    return f.read()


def test_the_docs_show_the_resume_policy_table_and_the_readme_its_switches():
  assert resume_policy.markdown() in _repo_text("docs/architecture.md")
  readme = _repo_text("README.md")
  for switch in resume_policy.SWITCHES:
    assert f"--config.{switch}=True" in readme, switch


def test_every_resume_key_is_a_config_key_and_every_switch_a_config_switch(tiny_config):
  for rule in resume_policy.RULES:
    assert rule.key in tiny_config or rule.key == "num_train", rule.key
    assert (rule.switch is not None) == (rule.on_change == resume_policy.SWITCH), rule.key
  assert set(resume_policy.SWITCHES) == {k for k in tiny_config if k.startswith("allow_changed")}


def test_the_data_identity_stored_with_checkpoints_is_the_policy_s_checkpoint_keys(tiny_config):
  spec, _ = _spec(tiny_config)
  assert list(spec.data_identity()) == [
    r.key for r in resume_policy.rules(resume_policy.CHECKPOINT)
  ]
  assert spec.data_identity()["batch"] == 16 and spec.data_identity()["num_train"] == 1437


def test_the_folder_check_follows_the_policy_for_the_keys_config_json_records(
  tmp_path, tiny_config, caplog
):
  folder = folder_lib.RunFolder(tmp_path)
  saved = json.loads(tiny_config.to_json_best_effort())
  folder.write_config(saved, step=0)
  (tmp_path / "checkpoints").mkdir()

  def changed(**values):
    current = json.loads(json.dumps(saved))
    for key, value in values.items():
      section, _, leaf = key.partition("__")
      if leaf:
        current[section][leaf] = value
      else:
        current[key] = value
    caplog.clear()
    folder.check_config(current)
    return caplog.text

  with pytest.raises(
    errors.ResumeError, match=r"model, pp differ.*hidden_size: 32 -> 48; pp.crop: 8 -> 16"
  ):
    changed(model__hidden_size=48, pp__crop=16)
  assert f"Resuming with a changed lr.base: {saved['lr']['base']} -> 0.5" in changed(lr__base=0.5)
  # The batch and the seed are recorded with the checkpoints (check_resume), not here.
  assert changed(batch=32, seed=7) == ""


def test_a_model_option_added_after_the_run_started_is_no_change(tmp_path):
  """A run saved before `model.stoch_depth` existed resumes; a changed width still stops."""
  folder = folder_lib.RunFolder(tmp_path)
  (tmp_path / "checkpoints").mkdir()
  saved = {"model": {"hidden_size": 16}, "num_classes": 10, "pp": {"crop": 8}}
  (tmp_path / "config.json").write_text(json.dumps(saved))
  folder.check_config({**saved, "model": {"hidden_size": 16, "stoch_depth": 0.0}})
  with pytest.raises(errors.ResumeError, match=r"model.hidden_size: 16 -> 32"):
    folder.check_config({**saved, "model": {"hidden_size": 32, "stoch_depth": 0.0}})
