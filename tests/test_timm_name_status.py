"""Every timm ViT-family name's status (`tools/timm_name_status.py` -> docs/timm_names.md):
the committed page agrees with the generator for a sample of names and with its own
totals; NaFlexViT on square images gives timm's logits at any resolution (the table
resampled as timm resamples it, up and down), and the families the issue names built at
full size have timm's parameter counts."""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest

from tests import interop_fixtures as fx
from vit_jax.weights import sources, writers
from vit_jax.weights.timm import names as timm_names
from vit_jax.weights.timm import vit as timm_vit

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = REPO_ROOT / "docs" / "timm_names.md"
sys.modules.setdefault("triton", None)  # see tests/test_export.py: triton beside TensorFlow


def _tool():
  return fx.repo_tool("timm_name_status")


def test_the_page_lists_every_name_of_the_table_with_its_totals():
  tool = _tool()
  text = PAGE.read_text()
  rows = tool.parse(text)
  assert set(rows) == set(timm_names.names())
  loads = sum(s.startswith(tool.LOADS) for s in rows.values())
  assert f"**{loads} of {len(rows)} names load.**" in text


# One name per kind of line: loads (plain, SigLIP 2, Eva, Mixer, hybrid, NaFlexViT), a
# count that differs, an argument, a module and a Mixer variant refused.
SAMPLE = [
  "vit_medium_patch16_gap_256",
  "vit_so400m_patch14_siglip_224",
  "eva02_tiny_patch14_224",
  "mixer_s32_224",
  "vit_tiny_r_s16_p8_224",
  "naflexvit_base_patch16_gap",
  "naflexvit_base_patch16_parfac_gap",
  "naflexvit_base_patch16_map",
  "vit_pwee_patch16_reg1_gap_256",
  "beit_base_patch16_224",
  "gmixer_12_224",
]


def test_the_committed_page_is_what_the_generator_gives_for_a_sample():
  pytest.importorskip("torch")
  timm = pytest.importorskip("timm")
  if timm.__version__ != timm_names.timm_version():
    pytest.skip(f"page from timm {timm_names.timm_version()}, installed {timm.__version__}")
  tool = _tool()
  rows = tool.parse(PAGE.read_text())
  for name in SAMPLE:
    assert rows[name] == tool.status(name), name


# --- NaFlexViT on square images, against timm ----------------------------------------

NAFLEX = {  # name -> its tiny model arguments (the stored table 4x4 patches)
  "naflexvit_base_patch16_gap": {},  # 4 registers, bicubic with antialiasing, fc_norm
  "naflexvit_base_patch16_siglip": {},  # bilinear, MAP head, tanh GELU
  "naflexvit_base_patch16_parfac_gap": {},  # factorised table, linear per axis
  # RADIO: align_corners bilinear without antialiasing, class token + 7 registers, token
  # pooling, no final norm.
  "naflexvit_base_patch16_radio_v3": {},
}


@pytest.mark.parametrize("size", [96, 48, 64])  # grid 6 (up), 3 (down), 4 (as stored)
@pytest.mark.parametrize("name", NAFLEX)
def test_naflexvit_on_square_images_gives_timms_logits(tmp_path, name, size):
  torch = pytest.importorskip("torch")
  timm = pytest.importorskip("timm")
  pytest.importorskip("safetensors.torch")
  args = dict(embed_dim=32, depth=1, num_heads=2, pos_embed_grid_size=(4, 4), **NAFLEX[name])
  torch.manual_seed(0)
  model = timm.create_model(name, pretrained=False, num_classes=fx.NUM_CLASSES, **args).eval()
  fx.perturb_torch(model)
  model_args = {**args, "pos_embed_grid_size": [4, 4]}
  config = {
    "architecture": name,
    "num_classes": fx.NUM_CLASSES,
    "model_args": model_args,
    "pretrained_cfg": {"input_size": [3, size, size]},
  }
  fx.save_timm_hub_folder(tmp_path, model, config)
  loaded = sources.load(str(tmp_path))
  assert loaded.image_size == (size, size)
  images = fx.images(2, size)
  ours = fx.our_logits(loaded, images)
  error = fx.relative_error(ours, fx.torch_logits(model, images))
  print(f"{name} at {size}x{size}: import {error:.1e}")  # -s
  assert error <= fx.TOLERANCE, error
  if size == 96:  # the predict command's; the export is timm's ViT at that grid
    fx.assert_predict_matches_timm(loaded, model, size, tmp_path)
    fixed = writers.at_fixed_grid(loaded, (size, size))  # the table as the model resizes it
    spec = timm_vit.model_spec(fixed.config, num_classes=fx.NUM_CLASSES, image_size=(size, size))
    rebuilt = fx.timm_rebuilt(spec, timm_vit.to_timm(fixed.params, fixed.config))
    assert fx.relative_error(fx.torch_logits(rebuilt, images), ours) <= fx.TOLERANCE


# --- The families the issue names: tiny timm models, both ways, and the full sizes ------

# name -> tiny arguments (a width the registered head count divides): SigLIP so400m/14 and
# its MAP head, SigLIP 2 so400m/16 and giant-opt, the medium/betwixt/mediumd widths without
# q/k/v biases or with registers, InternViT-300M (no final norm), CLIP (no patch bias).
FAMILIES = {
  "vit_so400m_patch14_siglip_224": dict(embed_dim=32, depth=1),
  "vit_so400m_patch16_siglip_256": dict(embed_dim=32, depth=1),
  "vit_so400m_patch14_siglip_gap_224": dict(embed_dim=32, depth=1),
  "vit_giantopt_patch16_siglip_256": dict(embed_dim=32, depth=1),
  "vit_medium_patch16_gap_256": dict(embed_dim=32, depth=2),
  "vit_betwixt_patch16_reg4_gap_256": dict(embed_dim=40, depth=1),
  "vit_mediumd_patch16_reg4_gap_256": dict(embed_dim=32, depth=2),
  "vit_intern300m_patch14_448": dict(embed_dim=32, depth=1),
  "vit_base_patch16_clip_224": dict(embed_dim=24, depth=1),
}


def _tiny_hub_folder(tmp_path, name: str):
  """timm's tiny model of ``name`` (every array perturbed) in a hub-layout folder whose
  config.json names the architecture and the tiny sizes only."""
  torch = pytest.importorskip("torch")
  timm = pytest.importorskip("timm")
  pytest.importorskip("safetensors.torch")
  size = 2 * timm_names.registered_args(name)["patch_size"]
  args = dict(FAMILIES[name], img_size=size)
  torch.manual_seed(0)
  model = timm.create_model(name, pretrained=False, num_classes=fx.NUM_CLASSES, **args).eval()
  fx.perturb_torch(model)
  config = {"architecture": name, "num_classes": fx.NUM_CLASSES, "model_args": FAMILIES[name]}
  fx.save_timm_hub_folder(tmp_path, model, config)
  return model, sources.load(str(tmp_path)), size


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_imports_with_timms_logits_and_exports_to_what_timm_rebuilds(tmp_path, name):
  model, loaded, size = _tiny_hub_folder(tmp_path, name)  # skipped without timm
  images = fx.images(2, size)
  ours = fx.our_logits(loaded, images)
  imported = fx.relative_error(ours, fx.torch_logits(model, images))
  assert imported <= fx.TOLERANCE, imported
  spec = timm_vit.model_spec(loaded.config, num_classes=fx.NUM_CLASSES, image_size=(size, size))
  rebuilt = fx.timm_rebuilt(spec, timm_vit.to_timm(loaded.params, loaded.config))
  exported = fx.relative_error(fx.torch_logits(rebuilt, images), ours)
  print(f"{name} {FAMILIES[name]}: import {imported:.1e}, export {exported:.1e}")  # -s
  assert exported <= fx.TOLERANCE, exported


FULL = [*FAMILIES, "vit_so400m_patch14_siglip_384", "naflexvit_so400m_patch16_siglip"]
FULL += [
  "vit_base_patch16_siglip_512",
  "vit_large_patch16_siglip_384",
  "vit_betwixt_patch16_gap_256",
]


@pytest.mark.parametrize("name", FULL)
def test_the_full_size_name_has_timms_parameter_count(name):
  """`vit_jax.create`'s model of the name, built abstractly, against timm's on the meta
  device (the generator's own comparison)."""
  pytest.importorskip("torch")
  pytest.importorskip("timm")
  tool = _tool()
  count, classes = tool.timm_count(name)
  assert tool.our_count(name, classes) == count


# Our SigLIP names -> timm's architecture of the same model (at 224, 1000 classes).
NAMED = {
  "SigLIP-So400m_14": "vit_so400m_patch14_siglip_224",
  "SigLIP2-B_16": "vit_base_patch16_siglip_224",
  "SigLIP2-So400m_16": "vit_so400m_patch16_siglip_256",
}


@pytest.mark.parametrize("ours, theirs", NAMED.items())
def test_named_siglip_variants_are_timms_architectures(ours, theirs):
  """The options equal what timm's name reads as (`vit_jax.create(theirs)`), the shape
  too at 224; the count at 224 is timm's (tests/test_models.py pins it)."""
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  from vit_jax.weights.timm import create  # pylint: disable=g-import-not-at-top

  named, (read, _) = models.get_model_config(ours), create.config_from_name(theirs)
  keys = ("classifier", "class_token", "gelu_approximate", "activation", "hidden_size")
  keys += ("layer_norm_epsilon", "qkv_bias", "patch_bias", "final_norm", "fc_norm")
  for key in keys:
    assert getattr(read, key) == named[key], key
  assert read.transformer == models.model_settings(named).transformer
  assert tuple(read.patches.size) == tuple(named.patches.size)


def test_a_naflexvit_folder_with_an_argument_not_computed_is_one_error_naming_it(tmp_path):
  """The stored model_args are checked as the registered ones are (a rotary NaFlexViT)."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  from vit_jax.infra import errors  # pylint: disable=g-import-not-at-top

  save_file({"embeds.proj.weight": np.zeros((8, 768), np.float32)}, tmp_path / "model.safetensors")
  config = {"architecture": "naflexvit_base_patch16_gap", "model_args": {"pos_embed": "rope"}}
  (tmp_path / "config.json").write_text(json.dumps(config))
  with pytest.raises(errors.CheckpointError, match="pos_embed='rope'") as raised:
    sources.load(str(tmp_path))
  assert "\n" not in str(raised.value)
