"""The model families beside the ViT that timm has (the MLP-Mixer and BiT), each through
the same checks, one parameter per record of the timm family registry
(`vit_jax.weights.timm.families`): logical axes the partitioning rules shard, a zero head
with remat and bfloat16 keeping the function, `.npz` files read with the architecture
inferred, timm's state dicts (written by timm in the test with perturbed weights) imported
with timm's logits, exports that timm rebuilds with ours, official shapes exported under
timm's names, a tiny fine-tuning run, the configs' names and a plan for a TPU slice. The
tiny models and timm's builders are the family test modules' (tests/test_bit.py,
tests/test_mixer.py), which keep what only one family has."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tests import interop_fixtures as fx
from tests import test_bit, test_mixer, train_fixtures
from tests.markers import needs_libtpu
from vit_jax import export, models
from vit_jax.infra import errors
from vit_jax.models import families as model_families
from vit_jax.weights import architecture, npz, sources
from vit_jax.weights.timm import families

sys.modules.setdefault("triton", None)  # see tests/test_export.py: triton beside TensorFlow


ABSENT = object()  # a config key the config does not have


@dataclasses.dataclass(frozen=True)
class Case:
  """One timm family's tiny model and what the shared checks expect of it."""

  timm: families.TimmFamily  # the record under test
  ours: model_families.Family  # our model family it reads into
  tiny: Callable[..., ml_collections.ConfigDict]  # the tiny model (config field changes)
  size: int  # the tiny model's image size
  features: int  # the width of its pooled features
  shape: Callable[[ml_collections.ConfigDict], tuple]  # its shape, as read back
  npz_size: Optional[tuple[int, int]]  # the image size an .npz fixes (None: any)
  official: tuple[str, ...]  # official names read back off their shapes
  official_size: int
  timm_names: dict[str, Optional[str]]  # official name -> timm's name (None: no name)
  rebuild: Callable[[dict[str, Any]], Any]  # timm's model of an export's spec
  hf_refusal: str
  run_model: Callable[[], ml_collections.ConfigDict]  # the fine-tuning run's model
  run_overrides: dict[str, Any]
  write_pretrained: Callable[[Any, ml_collections.ConfigDict], str]  # -> config.pretrained
  fit_note: str
  configs: tuple[tuple[str, str, dict[str, Any]], ...]  # (module, argument, {key: value})
  plan: tuple[str, ml_collections.ConfigDict, float]  # (pretrain argument, model, FLOPs rel)


def _bit_pretrained(directory, model: ml_collections.ConfigDict) -> str:
  """timm's weights with their 5-class head."""
  test_bit.write_timm_bit(directory / "timm", units=tuple(model.resnet.num_layers))
  return str(directory / "timm")


def _mixer_pretrained(directory, model: ml_collections.ConfigDict) -> str:
  """Stored Mixer weights of the run's 10 classes (the run resets the head)."""
  npz.save_npz(directory / "mixer.npz", test_mixer.random_params(model, num_classes=10, size=8))
  return str(directory / "mixer.npz")


CASES = {
  "bit": Case(
    timm=families.BIT,
    ours=model_families.BIT,
    tiny=test_bit.tiny_config,
    size=32,
    features=512,
    shape=lambda c: tuple(c.resnet.num_layers),
    npz_size=None,  # a ResNet does not fix it: predict asks for --resolution
    official=("BiT-R50x1", "BiT-R152x4"),
    official_size=32,
    timm_names={
      "BiT-R50x1": "resnetv2_50x1_bit",
      "BiT-R101x1": "resnetv2_101x1_bit",
      "BiT-R152x2": "resnetv2_152x2_bit",
      "BiT-R152x4": "resnetv2_152x4_bit",
      **{name: None for name in ("BiT-R50x2", "BiT-R152x1", "BiT-R200x3")},
    },
    rebuild=test_bit.rebuild_timm,
    hf_refusal="--format=hf writes ViTs only",
    run_model=lambda: test_bit.tiny_config(units=(1, 1)),
    run_overrides={},
    write_pretrained=_bit_pretrained,
    fit_note="head: using the fresh one from init_params (5 classes stored, 10 in the model)",
    configs=(
      ("pretrain", "bit_r50x1,imagenet21k", {"model.name": "BiT-R50x1", "optim.name": "adamw"}),
      ("pretrain", "bit_r50x1,imagenet21k", {"model.representation_size": ABSENT, "pp.crop": 224}),
      ("vit", "bit_r152x4,cifar10", {"model.name": "BiT-R152x4", "pp.crop": 384}),
      ("vit", "r50_b32,cifar10", {"model.name": "R50+ViT-B_32"}),
    ),
    plan=("bit_r50x1,imagenet21k", test_bit.tiny_config(), 0.25),
  ),
  "mixer": Case(
    timm=families.MIXER,
    ours=model_families.MIXER,
    tiny=test_mixer.tiny_config,
    size=16,
    features=32,
    shape=lambda c: (c.hidden_dim, c.num_blocks, c.tokens_mlp_dim, c.channels_mlp_dim),
    npz_size=(16, 16),  # the token MLPs fix the number of patches
    official=("Mixer-L_16",),
    official_size=224,
    timm_names={"Mixer-B_16": "mixer_b16_224", "Mixer-B_32": "mixer_b32_224"},
    rebuild=test_mixer.rebuild_timm,
    hf_refusal="transformers has no MLP-Mixer",
    run_model=test_mixer.tiny_config,
    run_overrides={"reset_head": True},
    write_pretrained=_mixer_pretrained,
    fit_note="head: using the fresh one from init_params (reset_head=True)",
    configs=(
      ("mixer", "b16,cifar10", {"model.name": "Mixer-B_16", "pp.crop": 224, "batch": 512}),
      ("mixer", "b16,cifar10", {"dataset": "cifar10", "train_split": "train[:98%]"}),
      ("mixer", "b16,cifar10", {"total_steps": 10_000, "lr.base": 0.03, "optim.name": "sgd"}),
    ),
    plan=(
      "b16,imagenet21k",
      test_mixer.tiny_config(hidden_dim=256, tokens_mlp_dim=128, channels_mlp_dim=1024),
      0.05,
    ),
  ),
}
each_family = pytest.mark.parametrize("name", list(CASES))


def test_the_registry_picks_the_reader_by_stem_then_module_and_the_writer_by_config():
  assert families.for_checkpoint(None, {"stem.proj.weight": 0}) is families.MIXER
  assert families.for_checkpoint("mlp_mixer", {"stem.conv.weight": 0}) is families.BIT  # arrays
  assert families.for_checkpoint("eva", {}) is families.EVA
  assert families.for_checkpoint("naflexvit", {}) is families.NAFLEX
  assert families.for_checkpoint(None, {}) is families.VIT  # a state dict no name describes
  assert families.for_module("deit") is families.VIT and families.for_module("beit") is None
  writers = {
    "ViT-B_16": families.VIT,
    "DINOv3-S_16": families.EVA,  # RoPE and SwiGLU: timm's Eva
    "Mixer-B_16": families.MIXER,
    "BiT-R50x1": families.BIT,
  }
  for ours, family in writers.items():
    assert families.writer_for(models.get_model_config(ours)) is family.writer, ours


def test_every_module_of_timms_table_is_a_familys_or_refused_by_name():
  from vit_jax.weights.timm import (
    expressible,  # pylint: disable=g-import-not-at-top
    names,  # pylint: disable=g-import-not-at-top
  )

  owned = [m for f in families.FAMILIES for m in f.modules]
  assert len(owned) == len(set(owned))  # one family per module
  modules = {names.module(n) for n in names.names()}
  assert modules <= set(owned) | set(expressible.TIMM_MODULES_UNEXPRESSED)


def test_the_cases_are_the_registrys_families_beside_the_vit():
  """Each family read into a model family of its own has a case; the ViT's (timm's ViT,
  Eva and NaFlexViT) are tested in tests/test_vit_family.py and their own files."""
  beside = {f for f in families.FAMILIES if f.model_family is not model_families.VIT}
  assert {c.timm for c in CASES.values()} == beside
  assert all(c.ours is c.timm.model_family for c in CASES.values())


@pytest.mark.parametrize(
  "name, strategy, sharded",
  [
    (
      "bit",
      "fsdp",
      {"root_block/conv_root/kernel": 3, "block1/unit01/conv2/kernel": 3, "head/kernel": 0},
    ),
    (
      "bit",
      "tensor_parallel",
      {
        "block1/unit01/conv1/kernel": 3,
        "block1/unit01/conv2/kernel": 3,
        "block1/unit01/conv3/kernel": 2,
        "block1/unit01/gn2/scale": 0,
      },
    ),
    ("mixer", "fsdp", {"stem/kernel": 3, "MixerBlock_0/channel_mixing/Dense_0/kernel": 0}),
    (
      "mixer",
      "tensor_parallel",
      {
        "MixerBlock_0/token_mixing/Dense_0/kernel": 1,
        "MixerBlock_0/token_mixing/Dense_1/kernel": 0,
        "MixerBlock_0/channel_mixing/Dense_0/kernel": 1,
        "MixerBlock_0/channel_mixing/Dense_1/kernel": 0,
      },
    ),
  ],
)
def test_every_parameter_has_logical_axes_the_rules_shard(name, strategy, sharded):
  case = CASES[name]
  model = models.create_model(case.tiny(), num_classes=5)
  fx.check_logical_axes(model, case.size, strategy, sharded)


@each_family
def test_head_is_zero_and_remat_and_bfloat16_keep_the_function(name):
  case = CASES[name]
  config, size = case.tiny(), case.size
  model = models.create_model(config, num_classes=5)
  fresh = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, size, size, 3)))["params"])
  assert not np.any(fresh["head"]["kernel"])
  params, images = fx.random_tree(config, 5, size), fx.images(2, size)
  want = fx.logits(config, params, images, 5)
  remat = fx.logits(case.tiny(remat=True), params, images, 5)
  np.testing.assert_allclose(remat, want, atol=1e-6)
  assert fx.relative_error(fx.logits(config, params, images, 5, dtype=jnp.bfloat16), want) < 0.05
  assert fx.logits(config, params, images, 0).shape == (2, case.features)  # no head
  with pytest.raises(errors.ConfigError, match="scan=True"):
    models.create_model(case.tiny(scan=True), num_classes=5)


@each_family
def test_an_npz_loads_with_the_architecture_inferred(tmp_path, name):
  case = CASES[name]
  config = case.tiny()
  params = fx.random_tree(config, 5, case.size)
  npz.save_npz(tmp_path / "model.npz", params)
  loaded = sources.load(tmp_path / "model.npz")
  assert models.family_of(loaded.config) is case.ours and loaded.config.name == "custom"
  assert case.shape(loaded.config) == case.shape(config)
  assert loaded.image_size == case.npz_size and loaded.num_classes == 5
  images = fx.images(2, case.size)
  np.testing.assert_array_equal(
    fx.logits(loaded.config, loaded.params, images, 5), fx.logits(config, params, images, 5)
  )
  for official in case.official:
    shapes = jax.eval_shape(
      models.create_model(models.get_model_config(official), num_classes=0).init,
      jax.random.key(0),
      jnp.zeros((1, case.official_size, case.official_size, 3)),
    )["params"]
    assert architecture.infer_settings(shapes).name == official


# (family, the arguments of its writer of a timm hub folder, the architecture its config.json
# names, the image size read, the sizes the logits are compared at)
IMPORTS = [
  ("bit", {}, "resnetv2_50x1_bit", (448, 448), (64, 45)),  # timm's input_size; 45: uneven pads
  *(
    (
      "mixer",
      dict(pretrained=cfg, tanh=tanh, **kw),
      cfg.split(".")[0],
      (kw["img_size"],) * 2,
      (kw["img_size"],),
    )
    for cfg, kw in test_mixer.TIMM_FAMILIES
    for tanh in (False, True)
  ),
]


@pytest.mark.parametrize("name, written, arch, image_size, sizes", IMPORTS)
def test_timm_import_gives_timms_logits(tmp_path, name, written, arch, image_size, sizes):
  writer = test_bit.write_timm_bit if name == "bit" else test_mixer.write_timm_mixer
  net = writer(tmp_path, **written)
  assert json.loads((tmp_path / "config.json").read_text())["architecture"] == arch
  loaded = sources.load(str(tmp_path))
  assert models.family_of(loaded.config) is CASES[name].ours
  assert loaded.image_size == image_size and loaded.num_classes == 5
  assert tuple(loaded.config.input_mean) == tuple(net.pretrained_cfg["mean"]) == (0.5,) * 3
  assert bool(loaded.config.get("gelu_approximate")) is written.get("tanh", False)  # timm's GELU
  for size in sizes:
    images = fx.images(2, size)
    got, want = fx.our_logits(loaded, images), fx.torch_logits(net, images)
    assert fx.relative_error(got, want) <= fx.TOLERANCE, size


# (family, changes to its tiny model): the Mixer's with a token MLP ratio timm rounds.
EXPORTS = [
  ("bit", {}),
  ("mixer", dict(gelu_approximate=False, tokens_mlp_dim=13)),
  ("mixer", dict(gelu_approximate=True, tokens_mlp_dim=13)),
]


@pytest.mark.parametrize("name, changes", EXPORTS)
def test_timm_export_gives_our_logits(tmp_path, name, changes):
  pytest.importorskip("timm")
  from safetensors.torch import load_file  # pylint: disable=g-import-not-at-top

  case = CASES[name]
  config, size = case.tiny(**changes), case.size
  params = fx.random_tree(config, 5, size)
  model = sources.LoadedModel(config, params, 5, (size, size), None, "tiny")
  export.export_model(model, "timm", str(tmp_path / "timm"))
  spec = json.loads((tmp_path / "timm" / "timm_model.json").read_text())
  assert spec["model_name"] is None  # no timm name: the class, as timm's own factories
  assert ("act_layer" in spec) is bool(config.get("gelu_approximate"))  # a tanh GELU
  net = case.rebuild(spec)
  net.load_state_dict(load_file(str(tmp_path / "timm" / "model.safetensors")))
  images = fx.images(2, size)
  ours = fx.logits(config, params, images, 5)
  assert fx.relative_error(fx.torch_logits(net, images), ours) <= fx.TOLERANCE
  back = sources.load(str(tmp_path / "timm"))  # our export reads back as it was
  assert all(getattr(back.config, k) == v for k, v in changes.items()), changes
  np.testing.assert_array_equal(fx.logits(back.config, back.params, images, 5), ours)
  assert back.image_size == (size, size)
  with pytest.raises(errors.CommandLineError, match=case.hf_refusal):
    export.export_model(model, "hf", str(tmp_path / "hf"))


@each_family
def test_an_official_shape_exports_under_its_timm_name(name):
  case = CASES[name]
  for ours, theirs in case.timm_names.items():
    config = models.get_model_config(ours)
    assert case.timm.writer is not None and case.timm.writer.writes(config)
    spec = case.timm.writer.model_spec(config, num_classes=10, image_size=(224, 224))
    assert spec["model_name"] == theirs, ours


@each_family
def test_a_run_fine_tunes_stored_weights_with_a_fresh_head(digits_dir, tmp_path, caplog, name):
  """The fit's notes, then the tiny run (`train_fixtures.TINY`, 8x8) learns."""
  case = CASES[name]
  config = train_fixtures.tiny_config(digits_dir, **case.run_overrides)
  config.model = case.run_model()
  config.pretrained = case.write_pretrained(tmp_path, config.model)
  with caplog.at_level(logging.INFO, logger="absl"):
    _, losses = train_fixtures.fit_and_learn(config)
  assert train_fixtures.fit_notes(caplog.records) == [case.fit_note]
  assert losses[-1] < losses[0], losses


@each_family
def test_the_configs_take_the_family_names(name):
  import importlib  # pylint: disable=g-import-not-at-top

  for module, argument, expected in CASES[name].configs:
    config = importlib.import_module(f"configs.{module}").get_config(argument)
    for key, value in expected.items():
      *path, last = key.split(".")
      section = config
      for part in path:
        section = section[part]
      if value is ABSENT:
        assert last not in section, (argument, key)
      else:
        assert section[last] == value, (argument, key)


# A TPU compile per family: the slow tier (the planner's paths: tests/test_plan.py).
@pytest.mark.slow
@needs_libtpu
@each_family
def test_plan_compiles_the_family_for_a_tpu_slice(name):
  from configs import pretrain  # pylint: disable=g-import-not-at-top
  from vit_jax.plan import planner, topology  # pylint: disable=g-import-not-at-top

  argument, model, flops_rel = CASES[name].plan
  config = pretrain.get_config(argument)  # Adam, batch 4096 -> shrunk below
  config.model = model
  config.num_classes, config.pp.crop, config.batch, config.batch_eval = 10, 32, 64, 64
  plan = planner.make_plan(config, topology.parse("v5e:2x2"))
  assert plan.fits and plan.flops_source == "xla" and plan.model == model.name
  # The analytic count (cost.resnet_flops_per_image, mixer.flops) near XLA's count.
  assert plan.model_flops_per_image * 64 == pytest.approx(plan.step_flops, rel=flops_rel)
  assert plan.train.collectives.bytes["all-reduce"] == pytest.approx(plan.params_bytes, rel=0.02)
