"""Fine-tuning from checkpoints: the recipe configs, an Orbax run fine-tuned at 2x resolution,
position-embedding re-initialisation, and evaluating a checkpoint without training."""

from __future__ import annotations

import math
import os

import jax
import ml_collections
import numpy as np
import pytest
from absl import flags
from flax import traverse_util
from ml_collections import config_flags

from configs import pretrain, vit
from tests import train_fixtures
from vit_jax import main, models, run, weights
from vit_jax.data import presets
from vit_jax.models.posemb import resize_posemb
from vit_jax.run import optim
from vit_jax.weights import orbax_steps

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POSEMB = weights.architecture.POSEMB


# --- The recipe configs ---------------------------------------------------------------------


def test_vit_config_is_the_papers_finetuning_recipe():
  config = vit.get_config("b16,cifar10")
  assert config.model.name == "ViT-B_16" and config.model.representation_size is None
  assert (config.optim.name, config.optim.momentum) == ("sgd", 0.9)
  assert config.optim.weight_decay == 0.0 and config.optim.grad_clip_norm == 1.0
  assert (config.lr.base, config.lr.decay, config.lr.warmup_steps) == (0.03, "cosine", 500)
  assert config.batch == 512 and config.pp.crop == 384 and config.num_classes == 10
  assert config.pretrained is None and config.posemb_resize == "bilinear"
  steps = {
    name: vit.get_config(f"b16,{name}").total_steps
    for name in ("imagenet2012", "cifar10", "cifar100", "oxford_iiit_pet", "oxford_flowers102")
  }
  assert steps == {
    "imagenet2012": 20_000,
    "cifar10": 10_000,
    "cifar100": 10_000,
    "oxford_iiit_pet": 500,
    "oxford_flowers102": 500,
  }
  pets = vit.get_config("s32,oxford_iiit_pet")
  assert pets.lr.warmup_steps < pets.total_steps and pets.test_split == "test"
  optim.make_optimizer(
    optim.OptimizerSettings.from_config(pets)
  )  # the schedule is valid for the short runs too
  assert {vit.get_config(f"{s},cifar10").model.name for s in vit.MODELS} <= set(models.MODEL_NAMES)
  crops = {s: vit.get_config(f"{s},imagenet2012").pp.crop for s in vit.MODELS}
  assert crops["b16"] == crops["r50_b16"] == 384 and crops["h14"] == 392  # whole patch grids


@pytest.mark.parametrize(
  "arg, expected",
  [
    ("b17,cifar10", r"unknown model 'b17' \(valid: ti16, .*r_ti16, .*bit_r200x3\)"),
    ("b16,cifar11", r"unknown dataset 'cifar11' \(valid: cifar10, .*digits\)"),
    ("b16", r"'<model>,<dataset>'.*Models: ti16.*Datasets: cifar10"),
  ],
)
def test_vit_config_errors_list_the_valid_names(arg, expected):
  with pytest.raises(ValueError, match=expected):
    vit.get_config(arg)


def test_pretrain_config_is_the_papers_upstream_recipe():
  config = pretrain.get_config("b16,imagenet21k")
  assert (config.optim.name, config.optim.b1, config.optim.b2) == ("adamw", 0.9, 0.999)
  assert config.optim.weight_decay == 0.1 and config.optim.grad_clip_norm == 1.0
  assert (config.lr.warmup_steps, config.lr.decay) == (10_000, "linear")
  assert config.batch == 4096 and config.pp.crop == 224
  assert config.model.representation_size == config.model.hidden_size == 768
  assert config.model.transformer.dropout_rate == 0.1
  assert config.total_steps == math.ceil(90 * pretrain.TRAIN_IMAGES["imagenet21k"] / 4096)
  assert 300_000 < config.total_steps < 320_000  # the presets' ~310k
  assert config.num_classes == presets.PRESETS["imagenet21k"].num_classes
  imagenet = pretrain.get_config("l16,imagenet2012")
  assert imagenet.total_steps == math.ceil(300 * 1_268_355 / 4096)
  with pytest.raises(ValueError, match=r"unknown dataset 'cifar10' \(valid: imagenet21k, "):
    pretrain.get_config("b16,cifar10")


def test_jft300m_is_a_planning_preset_with_the_papers_epochs():
  """Table 6's runs: 7 or 14 epochs of JFT-300M's 303M images at batch 4096."""
  config = pretrain.get_config("l16,jft300m")
  assert (config.dataset, config.num_classes, config.batch) == ("jft300m", 18_291, 4096)
  assert config.total_steps == math.ceil(7 * 303_000_000 / 4096) == 517_823
  assert pretrain.get_config("h14,jft300m,14").total_steps == math.ceil(14 * 303e6 / 4096)
  assert pretrain.get_config("b16,imagenet21k,30").total_steps == pretrain.steps_for(
    "imagenet21k", epochs=30
  )
  for bad in ("0", "seven", "-3"):
    with pytest.raises(ValueError, match=rf"the epochs '{bad}' must be a positive integer"):
      pretrain.get_config(f"l16,jft300m,{bad}")


def test_training_on_a_planning_preset_stops_before_writing(tmp_path, capsys):
  workdir = tmp_path / "run"
  argv = ["main", f"--config={REPO}/configs/pretrain.py:ti16,jft300m", f"--workdir={workdir}"]
  assert main.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith("Error: config.dataset='jft300m' is a planning preset")
  assert err.count("\n") == 1 and "python -m vit_jax.plan" in err
  assert not workdir.exists()


def test_the_official_command_line_syntax():
  argv = [
    "prog",
    f"--config={REPO}/configs/vit.py:r50_b16,cifar100",
    "--config.pretrained=/ckpt/R50+ViT-B_16.npz",
    "--config.posemb_resize=reinit",
    "--config.lr.base=0.01",
  ]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file(
    "config", None, flag_values=flag_values, lock_config=True, sys_argv=argv
  )  # as vit_jax.main, which reads sys.argv
  flag_values(argv)
  config = flag_values.config
  assert config.model.name == "R50+ViT-B_16" and config.num_classes == 100
  assert config.pretrained == "/ckpt/R50+ViT-B_16.npz" and config.posemb_resize == "reinit"
  assert config.lr.base == 0.01


# --- Checkpoints of a run ------------------------------------------------------------------


def _tiny_run_config(data_dir: str) -> ml_collections.ConfigDict:
  """The quickstart shrunk as tests/conftest.py's tiny_config: `testing` model at 8x8."""
  return train_fixtures.tiny_config(
    data_dir, total_steps=8, log_every=4, eval_every=100, checkpoint_every=100
  )


@pytest.fixture(scope="module")
def source_run(tmp_path_factory, digits_dir):
  """(config, workdir, final metrics) of a tiny training run with one Orbax step."""
  config = _tiny_run_config(digits_dir)
  workdir = str(tmp_path_factory.mktemp("source"))
  metrics = run.train_and_evaluate(config, workdir)
  return config, workdir, metrics


def test_checkpoint_is_evaluated_without_training(source_run, tmp_path):
  config, workdir, trained = source_run
  config = ml_collections.ConfigDict(config.to_dict())
  config.total_steps = 0
  config.pretrained = os.path.join(workdir, "checkpoints")
  evaluated = run.train_and_evaluate(config, str(tmp_path / "eval"))
  # The loaded parameters, on the run's eval split: the run's own final numbers exactly
  # (fresh parameters would score log(10) with their zero head).
  for key in ("eval/accuracy", "eval/loss", "eval/examples"):
    assert evaluated[key] == trained[key], key
  assert abs(evaluated["eval/loss"] - math.log(10)) > 1e-3
  assert not os.path.exists(tmp_path / "eval" / "checkpoints" / "0")


def test_run_finetunes_at_2x_resolution_with_a_new_head(source_run, monkeypatch):
  _, workdir, _ = source_run
  stored = traverse_util.flatten_dict(
    orbax_steps.read_params(os.path.join(workdir, "checkpoints")), sep="/"
  )
  config = vit.get_config("ti16,digits")  # the fine-tuning recipe (SGD), shrunk
  config.model = models.get_model_config("testing")
  config.data_dir = source_run[0].data_dir
  config.pp.crop = 16  # 2x: the 2x2 grid of 4x4 patches becomes 4x4
  config.pretrained = os.path.join(workdir, "checkpoints")
  config.reset_head = True
  config.batch, config.batch_eval, config.shuffle_buffer = 16, 64, 64
  config.total_steps, config.lr.warmup_steps = 3, 1
  config.log_every, config.eval_every, config.checkpoint_every = 1, 100, 100

  loaded = {}
  real_load = weights.load_pretrained

  def spy(*args, **kwargs):
    loaded.update(traverse_util.flatten_dict(real_load(*args, **kwargs), sep="/"))
    return traverse_util.unflatten_dict(dict(loaded), sep="/")

  monkeypatch.setattr(weights, "load_pretrained", spy)
  state, losses = train_fixtures.fit_and_learn(config)

  assert set(loaded) == set(stored)
  for key, value in stored.items():
    if key.startswith("head/"):
      np.testing.assert_array_equal(loaded[key], 0.0, err_msg=key)  # the fresh zero head
    elif key == POSEMB:
      assert value.shape == (1, 1 + 2 * 2, 32) and loaded[key].shape == (1, 1 + 4 * 4, 32)
      np.testing.assert_allclose(loaded[key], resize_posemb(value, (4, 4), num_prefix=1), rtol=1e-6)
      np.testing.assert_array_equal(loaded[key][:, 0], value[:, 0])  # class token's row
    else:
      np.testing.assert_array_equal(loaded[key], value, err_msg=key)
  assert losses[-1] < losses[0], losses
  tuned = traverse_util.flatten_dict(jax.device_get(state.params), sep="/")
  assert tuned[POSEMB].shape == (1, 17, 32)
  assert not np.array_equal(tuned["head/kernel"], 0.0)  # the new head trained


def test_reinit_takes_fresh_position_embeddings(source_run):
  config, workdir, _ = source_run
  source = os.path.join(workdir, "checkpoints")
  stored = traverse_util.flatten_dict(orbax_steps.read_params(source), sep="/")
  # The 2x model's fresh parameters: the stored tree with a new 4x4-grid table (no model
  # init needed; only shapes and the posemb values matter).
  fresh = {k: np.full_like(v, 7.0) for k, v in stored.items()}
  fresh[POSEMB] = np.random.default_rng(0).standard_normal((1, 17, 32)).astype(np.float32)
  fresh_tree = traverse_util.unflatten_dict(fresh, sep="/")
  result = traverse_util.flatten_dict(
    weights.load_pretrained(source, fresh_tree, config.model, posemb_resize_method="reinit"),
    sep="/",
  )
  np.testing.assert_array_equal(result[POSEMB], fresh[POSEMB])
  for key in stored.keys() - {POSEMB}:  # the rest, head included (same classes), as stored
    np.testing.assert_array_equal(result[key], stored[key], err_msg=key)
  with pytest.raises(ValueError, match="'reinit'"):
    weights.load_pretrained(source, fresh_tree, config.model, posemb_resize_method="reinitt")
