"""timm's architecture names -> constructor arguments (`weights/timm_architectures.json`):
the table is what the installed timm registers, and a timm folder whose `config.json`
names only the architecture reads as timm builds it, for every plain-ViT name of timm's
`vision_transformer.py` that this package computes."""

from __future__ import annotations

import json
import os
import pathlib
import sys

import numpy as np
import pytest

from tests import interop_fixtures as fx
from vit_jax.infra import errors
from vit_jax.weights import sources
from vit_jax.weights.timm import names as timm_names
from vit_jax.weights.timm import vit_config

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
# Registered names this ViT computes, as of the table's timm; each kind of refusal below.
REFUSED = {
  "vit_base_patch16_rope_reg1_gap_256": None,  # only when present in the table
  "vit_base_patch16_xp_224": "block_fn=",  # parallel blocks
  "deit_tiny_distilled_patch16_224": "distilled=True",
  "vit_small_resnet26d_224": "backbone='FeatureListNet'",
}


def test_the_issue_names_are_in_the_table_with_their_shapes():
  so400m = timm_names.registered_args("vit_so400m_patch14_siglip_224")
  assert (so400m["embed_dim"], so400m["depth"], so400m["num_heads"]) == (1152, 27, 16)
  assert int(so400m["mlp_ratio"] * so400m["embed_dim"]) == 4304
  assert timm_names.registered_args("vit_medium_patch16_gap_256")["num_heads"] == 8
  betwixt = [n for n in timm_names.names() if n.startswith("vit_betwixt_")]
  assert betwixt and all(timm_names.registered_args(n)["num_heads"] == 10 for n in betwixt)


def test_what_this_vit_does_not_compute_is_named():
  for name, fragment in REFUSED.items():
    args = timm_names.registered_args(name)
    if fragment is None or args is None:
      continue
    assert any(p.startswith(fragment) for p in timm_names.unsupported(args)), name
  assert timm_names.unsupported({"norm_layer": "LayerNorm(eps=1e-05)", "qkv_bias": False}) == []
  assert timm_names.model_args("vit_base_patch16_clip_224")["layer_norm_eps"] == 1e-5


def test_a_refused_architecture_is_one_error_naming_it(tmp_path):
  save_file = pytest.importorskip("safetensors.numpy").save_file
  save_file({"patch_embed.proj.weight": np.zeros((8, 3, 2, 2), np.float32)}, tmp_path / "m.st")
  os.rename(tmp_path / "m.st", tmp_path / "model.safetensors")
  (tmp_path / "config.json").write_text(json.dumps({"architecture": "vit_base_patch16_xp_224"}))
  with pytest.raises(errors.CheckpointError, match="vit_base_patch16_xp_224.*block_fn="):
    sources.load(str(tmp_path))


# --- Against timm itself -------------------------------------------------------------

sys.modules.setdefault("triton", None)  # see tests/test_export.py: triton beside TensorFlow


@pytest.fixture(scope="module")
def timm():
  pytest.importorskip("torch")
  return pytest.importorskip("timm")


def _tool():
  return fx.repo_tool("timm_architectures")


def test_the_table_is_what_the_installed_timm_registers(timm):
  if timm.__version__ != timm_names.timm_version():
    pytest.skip(f"table from timm {timm_names.timm_version()}, installed {timm.__version__}")
  assert _tool().architectures() == json.loads(
    (REPO_ROOT / "vit_jax" / "weights" / timm_names.TABLE).read_text()
  ), "regenerate: python tools/timm_architectures.py"


def _plain_vit_names() -> list[str]:
  """The table's `vision_transformer.py` names this ViT computes."""
  table = json.loads((REPO_ROOT / "vit_jax" / "weights" / timm_names.TABLE).read_text())
  return [
    name
    for name, entry in table["architectures"].items()
    if entry["module"] == "vision_transformer" and not timm_names.unsupported(entry["args"])
  ]


def _timm_settings(model) -> dict:
  """What a timm ViT computes, read off the module: our settings' names and values."""
  import torch  # pylint: disable=g-import-not-at-top

  block = model.blocks[0]
  act = block.mlp.act
  quick = type(act).__name__ == "QuickGELU"
  norm = block.norm1
  pools = {"token": "token", "avg": "gap", "map": "map", "": "unpooled"}
  return dict(
    hidden_size=model.embed_dim,
    num_heads=block.attn.num_heads,
    mlp_dim=block.mlp.fc2.in_features,
    mlp="swiglu_fused" if type(block.mlp).__name__ == "GluMlp" else "mlp",
    patch=tuple(model.patch_embed.patch_size),
    classifier=pools[model.global_pool],
    has_class_token=model.cls_token is not None,
    num_registers=model.num_reg_tokens,
    posemb_patches_only=model.no_embed_class,
    norm_pre=not isinstance(model.norm_pre, torch.nn.Identity),
    fc_norm=not isinstance(model.fc_norm, torch.nn.Identity),
    final_norm=not isinstance(model.norm, torch.nn.Identity)
    or model.fc_norm is not None
    and not isinstance(model.fc_norm, torch.nn.Identity),
    patch_bias=model.patch_embed.proj.bias is not None,
    qkv_bias=block.attn.qkv.bias is not None,
    layer_norm_epsilon=norm.eps,
    activation="quick_gelu" if quick else "gelu",
    gelu_approximate=type(act).__name__ == "GELUTanh" or getattr(act, "approximate", "") == "tanh",
    layer_scale=type(block.ls1).__name__ == "LayerScale",
  )


def _our_settings(config, has_class_token: bool) -> dict:
  return dict(
    hidden_size=config.hidden_size,
    num_heads=config.transformer.num_heads,
    mlp_dim=config.transformer.mlp_dim,
    mlp=config.mlp,
    patch=tuple(config.patches.size),
    classifier=config.classifier,
    has_class_token=has_class_token,
    num_registers=config.num_registers,
    posemb_patches_only=config.posemb_patches_only,
    norm_pre=config.norm_pre,
    fc_norm=config.fc_norm,
    final_norm=config.final_norm,
    patch_bias=config.patch_bias,
    qkv_bias=config.qkv_bias == "all",
    layer_norm_epsilon=config.layer_norm_epsilon,
    activation=config.activation,
    gelu_approximate=config.gelu_approximate,
    layer_scale=config.layer_scale_init is not None,
  )


def _state_dict_of_one_block(timm, name: str):
  """(timm module on the meta device, zero arrays of its state dict with one block)."""
  import torch  # pylint: disable=g-import-not-at-top

  with torch.device("meta"):
    model = timm.create_model(name, pretrained=False, depth=1, img_size=64, num_classes=3)
  shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
  return model, {k: np.zeros(s, np.float32) for k, s in shapes.items()}


@pytest.mark.parametrize("name", _plain_vit_names())
def test_an_architecture_name_alone_reads_as_timm_builds_it(timm, name):
  """The settings read from the table (a config.json with only ``architecture``) equal
  those of timm's module of that name (built on the meta device, one block)."""
  model, tensors = _state_dict_of_one_block(timm, name)
  config, _ = vit_config.read_vit(tensors, name, timm_names.model_args(name), {}, name)
  ours = _our_settings(config, "cls_token" in tensors)
  assert ours == _timm_settings(model)


# Names the issue named, read from real timm files of one block at the registered width
# (SigLIP so400m/14 and SigLIP 2 so400m/16, betwixt, medium without q/k/v biases, mediumd,
# InternViT-300M without a final norm, CLIP without a patch bias).
REAL = ("vit_so400m_patch14_siglip_224", "vit_betwixt_patch16_reg4_gap_256")
REAL += ("vit_medium_patch16_gap_256", "vit_base_patch16_clip_quickgelu_224")
REAL += ("vit_so400m_patch16_siglip_256", "vit_mediumd_patch16_reg4_gap_256")
REAL += ("vit_intern300m_patch14_448", "vit_giant_patch14_dinov2")  # + timm's GluMlp


@pytest.mark.parametrize("name", REAL)
def test_a_hub_folder_naming_only_the_architecture_gives_timms_logits(timm, tmp_path, name):
  import torch  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)
  patch = timm_names.registered_args(name)["patch_size"]
  size = 2 * patch
  model = timm.create_model(name, pretrained=False, depth=1, img_size=size, num_classes=3).eval()
  fx.perturb_torch(model)
  fx.save_timm_hub_folder(tmp_path, model, {"architecture": name})
  loaded = sources.load(str(tmp_path))
  images = fx.images(2, size)
  error = fx.relative_error(fx.our_logits(loaded, images), fx.torch_logits(model, images))
  assert error <= fx.TOLERANCE, error
  fx.assert_predict_matches_timm(loaded, model, size, tmp_path)  # the predict command's
