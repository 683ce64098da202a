"""timm's Eva (eva.py: DINOv3, EVA-02) both ways, against timm 1.0.31 itself: tiny models
of each registered architecture built by timm with every array perturbed, read from a
hub-layout folder (config.json naming the architecture) with timm's logits, at another
resolution without any table resized, exported and rebuilt by timm with the same logits;
and the full-size architectures' parameter counts equal to timm's."""

from __future__ import annotations

import dataclasses
import json
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest
from flax import traverse_util

from tests import interop_fixtures as fx
from vit_jax import models
from vit_jax.infra import errors
from vit_jax.weights import sources
from vit_jax.weights.timm import eva as timm_eva
from vit_jax.weights.timm import expressible
from vit_jax.weights.timm import folder as timm_folder
from vit_jax.weights.timm import names as timm_names

sys.modules.setdefault("triton", None)  # see tests/test_export.py: triton beside TensorFlow
torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
safetensors_torch = pytest.importorskip("safetensors.torch")

# name -> (width, depth, image size, extra config.json model_args): widths keep the
# registered head count with 8-wide heads, so the name alone gives every argument.
TINY = {
  "vit_small_patch16_dinov3": (48, 2, 48, {}),
  "vit_small_patch16_dinov3_qkvb": (48, 1, 32, {"global_pool": "token"}),
  "vit_small_plus_patch16_dinov3": (48, 1, 48, {}),  # split SwiGLU
  "eva02_tiny_patch14_224": (24, 2, 28, {}),  # fused SwiGLU, q+v biases, RoPE beside a table
  "eva02_base_patch14_224": (96, 1, 42, {}),  # q/k/v_proj apart, SwiGLU with its LayerNorm
  "eva02_base_patch16_clip_224": (96, 1, 32, {}),  # + LayerNorm on the heads, class token
  "vit_base_patch16_rope_reg1_gap_256": (96, 1, 32, {}),  # GELU MLP, a register, no cls
  # Naver's RoPE-ViT: AttentionRope (a key bias), columns first, temperature 100 ...
  "vit_small_patch16_rope_224": (48, 1, 48, {}),
  "vit_small_patch16_rope_ape_224": (48, 1, 32, {}),  # ... beside a table without cls rows
  "vit_base_patch16_rope_mixed_224": (96, 2, 48, {}),  # learned frequencies per layer
  "vit_large_patch16_rope_mixed_ape_224": (128, 1, 32, {}),
  # Perception Encoder: attention pooling over every token, 8 heads of its own, RoPE at
  # offset 1 rescaled to the pre-training grid beside a table, a norm before the blocks.
  "vit_pe_core_tiny_patch16_384": (24, 2, 48, {}),
  "vit_pe_core_gigantic_patch14_448": (128, 1, 28, {}),  # no class token, MLP 5.83x, pool 4x
  # PE's spatial and language towers: no final norm, average pooling (LayerScale 0.1).
  "vit_pe_spatial_tiny_patch16_512": (24, 1, 32, {}),
  "vit_pe_lang_large_patch14_448": (128, 1, 28, {}),
}


def _timm_model(name: str, size: int, **kwargs):
  width, depth, _, extra = TINY[name]
  args = dict(embed_dim=width, depth=depth, img_size=size, num_classes=fx.NUM_CLASSES)
  torch.manual_seed(0)
  model = timm.create_model(name, pretrained=False, **args, **extra, **kwargs).eval()
  fx.perturb_torch(model)
  return model


def _hub_folder(tmp_path, name: str):
  """timm's model in a hub-layout folder: model.safetensors and a config.json naming the
  architecture (and the tiny sizes' arguments that differ from the name's)."""
  _, _, size, extra = TINY[name]
  model = _timm_model(name, size)
  stats = {k: list(model.pretrained_cfg[k]) for k in ("mean", "std")}
  stats["input_size"] = [3, size, size]  # as timm's hub config: the size it was trained at
  config = {"architecture": name, "num_classes": fx.NUM_CLASSES, "pretrained_cfg": stats}
  if extra:
    config["model_args"] = extra
  fx.save_timm_hub_folder(tmp_path, model, config)
  return model, sources.load(str(tmp_path))


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory):
  """``name`` -> (folder, timm's model, our import) of `_hub_folder`, written and read once
  for the module: the tests below only read them."""
  made = {}

  def get(name: str):
    if name not in made:
      folder = tmp_path_factory.mktemp(name)
      made[name] = (folder, *_hub_folder(folder, name))
    return made[name]

  return get


@pytest.mark.parametrize("name", TINY)
def test_import_gives_timms_logits(hub_folder, name):
  _, model, loaded = hub_folder(name)
  size = TINY[name][2]
  images = fx.images(2, size)
  error = fx.relative_error(fx.our_logits(loaded, images), fx.torch_logits(model, images))
  assert error <= fx.TOLERANCE, error
  assert loaded.config.rope in ("dinov3", "eva", "mixed")


@pytest.mark.parametrize("name", ["vit_small_patch16_dinov3", "vit_small_plus_patch16_dinov3"])
def test_another_resolution_needs_no_table_for_the_rotary_embedding(hub_folder, name):
  """DINOv3 (no absolute table) at twice the size: the rotary tables follow the grid, as
  timm's with dynamic_img_size (an absolute table beside RoPE is resized as any ViT's)."""
  _, model, loaded = hub_folder(name)
  size = 2 * TINY[name][2]
  assert loaded.config.posemb == "none"
  images = fx.images(2, size, seed=3)
  error = fx.relative_error(fx.our_logits(loaded, images), fx.torch_logits(model, images))
  assert error <= fx.TOLERANCE, error


@pytest.mark.parametrize("name", TINY)
def test_export_is_rebuilt_by_timm_with_the_same_logits(hub_folder, name):
  _, _, loaded = hub_folder(name)
  size = TINY[name][2]
  spec = timm_eva.model_spec(loaded.config, num_classes=fx.NUM_CLASSES, image_size=(size, size))
  rebuilt = fx.timm_rebuilt(spec, timm_eva.to_timm(loaded.params, loaded.config))
  images = fx.images(2, size, seed=1)
  error = fx.relative_error(fx.torch_logits(rebuilt, images), fx.our_logits(loaded, images))
  assert error <= fx.TOLERANCE, error


FULL = [
  "vit_small_patch16_dinov3",
  "vit_small_patch16_dinov3_qkvb",
  "vit_small_plus_patch16_dinov3",
  "vit_base_patch16_dinov3",
  "vit_large_patch16_dinov3",
  "vit_huge_plus_patch16_dinov3",
  "eva02_tiny_patch14_224",
  "eva02_small_patch14_224",
  "eva02_base_patch14_224",
  "eva02_large_patch14_224",
  "eva02_large_patch14_clip_224",
  "vit_base_patch16_rope_reg1_gap_256",
  # RoPE-ViT and PE core: the rest are NAMED below (counted there at 224).
  *(
    f"vit_{size}_patch16_rope{kind}_224"
    for size in ("small", "base", "large")
    for kind in ("_ape", "_mixed_ape")
  ),
  "vit_small_patch16_rope_mixed_224",
  "vit_large_patch16_rope_mixed_224",
  "vit_pe_core_gigantic_patch14_448",
  *(f"vit_pe_spatial_{size}_patch16_512" for size in ("tiny", "small", "base")),
  "vit_pe_spatial_large_patch14_448",
  "vit_pe_spatial_gigantic_patch14_448",
  "vit_pe_lang_large_patch14_448",
  "vit_pe_lang_gigantic_patch14_448",
]


@pytest.mark.parametrize("name", FULL)
def test_full_size_parameter_count_equals_timms(name):
  """timm's model on the meta device against ours built abstractly (`jax.eval_shape`) from
  the config read off one block of timm's arrays and the name's registered depth."""
  with torch.device("meta"):
    full = timm.create_model(name, pretrained=False)
    one = timm.create_model(name, pretrained=False, depth=1)
  want = sum(p.numel() for p in full.parameters())
  tensors = {k: np.zeros(v.shape, np.float32) for k, v in one.state_dict().items()}
  args = timm_names.model_args(name)
  config, _ = timm_eva.read_eva(tensors, name, args, name)
  config = config.replace(
    transformer=dataclasses.replace(config.transformer, num_layers=args["depth"])
  )
  # The blocks as one nn.scan: traced once instead of once per layer (a tenth of the
  # time), the same parameters stacked (tests/test_models.py counts every variant so).
  module = models.create_model(config, num_classes=full.num_classes, scan=True)
  size = full.pretrained_cfg["input_size"][1]
  dummy = jax.ShapeDtypeStruct((1, size, size, 3), np.float32)
  shapes = jax.eval_shape(module.init, jax.random.key(0), dummy)["params"]
  got = sum(int(np.prod(s.shape)) for s in jax.tree_util.tree_leaves(nn.unbox(shapes)))
  assert got == want


def test_what_eva_py_holds_that_this_vit_does_not_compute_is_one_line_naming_it(tmp_path):
  with pytest.raises(errors.CheckpointError, match=r"qk_norm=True"):
    expressible.check_timm("vit_base_patch16_sapiens2", "here")
  with pytest.raises(errors.CheckpointError, match=r"use_post_norm=True"):
    expressible.check_timm("eva02_enormous_patch14_clip_224", "here")
  for name in ("vit_large_patch16_dinov3.lvd1689m", "vit_base_patch16_rope_mixed_ape_224"):
    expressible.check_timm(name, "here")  # expressible
  expressible.check_timm("vit_pe_core_large_patch14_336.fb", "here")
  two_norms = dict(timm_names.model_args("eva02_tiny_patch14_224"), use_post_transformer_norm=True)
  with pytest.raises(errors.CheckpointError, match="two final norms"):  # avg pool: fc_norm
    timm_eva.read_eva({}, "eva02_tiny_patch14_224", two_norms, "here")
  # An Eva state dict without its name: its rotary embedding is in no array.
  safetensors_torch.save_file(
    {"patch_embed.proj.weight": torch.zeros(8, 3, 2, 2), "blocks.0.gamma_1": torch.zeros(8)},
    tmp_path / "model.safetensors",
  )
  with pytest.raises(errors.CheckpointError, match="config.json naming the architecture"):
    timm_folder.read(str(tmp_path / "model.safetensors"))


# Our names -> timm's architecture of the same model.
NAMED = {
  "DINOv3-S_16": "vit_small_patch16_dinov3",
  "DINOv3-B_16": "vit_base_patch16_dinov3",
  "DINOv3-L_16": "vit_large_patch16_dinov3",
  "EVA02-Ti_14": "eva02_tiny_patch14_224",
  "EVA02-S_14": "eva02_small_patch14_224",
  "EVA02-B_14": "eva02_base_patch14_224",
  "EVA02-L_14": "eva02_large_patch14_224",
  "PE-Core-T_16": "vit_pe_core_tiny_patch16_384",
  "PE-Core-S_16": "vit_pe_core_small_patch16_384",
  "PE-Core-B_16": "vit_pe_core_base_patch16_224",
  "PE-Core-L_14": "vit_pe_core_large_patch14_336",
  "RoPE-ViT-S_16": "vit_small_patch16_rope_224",
  "RoPE-ViT-B_16": "vit_base_patch16_rope_224",
  "RoPE-ViT-L_16": "vit_large_patch16_rope_224",
  "RoPE-Mixed-ViT-B_16": "vit_base_patch16_rope_mixed_224",
}


@pytest.mark.parametrize("ours, theirs", NAMED.items())
def test_named_variants_are_timms_architectures(ours, theirs):
  """Parameter counts at 224 with 1000 classes equal timm's (meta device), and the options
  equal those read from timm's registered arguments."""
  with torch.device("meta"):
    full = timm.create_model(theirs, pretrained=False, num_classes=1000, img_size=224)
    one = timm.create_model(theirs, pretrained=False, depth=1, num_classes=1000)
  module = models.create_model(models.get_model_config(ours), num_classes=1000, scan=True)
  dummy = jax.ShapeDtypeStruct((1, 224, 224, 3), np.float32)
  shapes = jax.eval_shape(module.init, jax.random.key(0), dummy)["params"]
  got = sum(int(np.prod(s.shape)) for s in jax.tree_util.tree_leaves(nn.unbox(shapes)))
  named = models.get_model_config(ours)
  assert got == sum(p.numel() for p in full.parameters())
  tensors = {k: np.zeros(v.shape, np.float32) for k, v in one.state_dict().items()}
  read, _ = timm_eva.read_eva(tensors, theirs, timm_names.model_args(theirs), theirs)
  for key in ("rope", "rope_temperature", "rope_rotate_half", "rope_ref_grid", "mlp", "mlp_norm"):
    assert getattr(read, key) == named[key], key
  for key in ("qkv_bias", "classifier", "num_registers", "layer_norm_epsilon", "fc_norm"):
    assert getattr(read, key) == named[key], key
  for key in ("rope_grid_indexing", "rope_grid_offset", "posemb", "norm_pre", "patch_bias"):
    assert getattr(read, key) == named[key], key
  for key in ("final_norm",):
    assert getattr(read, key) == named[key], key
  for key in ("map_num_heads", "map_mlp_dim", "map_include_prefix", "layer_scale_init"):
    assert getattr(read, key) == named[key], key


@pytest.mark.parametrize(
  "name, crop",
  [
    ("vit_small_patch16_dinov3", 32),
    ("eva02_tiny_patch14_224", 42),
    ("vit_base_patch16_rope_mixed_224", 32),  # its learned frequencies trained as they are
    ("vit_pe_core_tiny_patch16_384", 32),  # its table resized, the attention pool kept
  ],
)
def test_finetunes_from_the_hub_folder_at_another_grid(
  hub_folder, name, crop, digits_dir, monkeypatch
):
  """Three steps through ``config.pretrained`` on another grid (DINOv3: 2x2 where timm's
  was 3x3, nothing to resize; EVA-02: 3x3 where it was 2x2, its table resized as any
  ViT's): a new zero head, every other array as stored or resized, the loss going down."""
  from tests import train_fixtures  # pylint: disable=g-import-not-at-top
  from tests.test_vit_family import _finetune_config  # pylint: disable=g-import-not-at-top
  from vit_jax import weights  # pylint: disable=g-import-not-at-top
  from vit_jax.weights import npz  # pylint: disable=g-import-not-at-top

  folder, _, loaded = hub_folder(name)
  config = _finetune_config(loaded, str(folder), digits_dir, crop)
  adapted = {}
  real_load = weights.load_pretrained

  def spy(*args, **kwargs):
    tree = npz.scanned_to_layers(real_load(*args, **kwargs))
    adapted.update(traverse_util.flatten_dict(tree, sep="/"))
    return tree

  monkeypatch.setattr(weights, "load_pretrained", spy)
  _, losses = train_fixtures.fit_and_learn(config, steps=3)
  imported = traverse_util.flatten_dict(loaded.params, sep="/")
  assert adapted["head/kernel"].shape[-1] == 10 and not adapted["head/kernel"].any()
  resized = {k for k in imported if k.startswith("head/") or k.endswith("pos_embedding")}
  for key, value in imported.items():
    if key not in resized:
      np.testing.assert_array_equal(adapted[key], value, err_msg=key)
  assert losses[-1] < losses[0], losses


@pytest.mark.parametrize(
  "name",
  [
    "vit_small_plus_patch16_dinov3",
    "vit_large_patch16_rope_mixed_ape_224",
    "vit_pe_core_tiny_patch16_384",
  ],
)
def test_predict_on_the_hub_folder_gives_timms_top1_and_probability(hub_folder, tmp_path, name):
  _, model, loaded = hub_folder(name)
  size = TINY[name][2]
  assert list(loaded.config.input_mean) == list(model.pretrained_cfg["mean"])  # recorded
  fx.assert_predict_matches_timm(loaded, model, size, tmp_path)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_precision_hub_file_loads_with_the_logits_of_its_stored_values(tmp_path, dtype):
  """Hub files are often half precision: read in their stored dtype (bfloat16 through
  ml_dtypes), widened exactly to float32 by the table; timm's model with the same rounded
  weights gives the same logits."""
  name = "vit_small_patch16_dinov3"
  size = TINY[name][2]
  model = _timm_model(name, size)
  rounded = {k: v.to(getattr(torch, dtype)).contiguous() for k, v in model.state_dict().items()}
  safetensors_torch.save_file(rounded, tmp_path / "model.safetensors")
  (tmp_path / "config.json").write_text(json.dumps({"architecture": name}))
  loaded = sources.load(str(tmp_path))
  model.load_state_dict({k: v.float() for k, v in rounded.items()})
  images = fx.images(2, size)
  error = fx.relative_error(fx.our_logits(loaded, images), fx.torch_logits(model, images))
  assert error <= fx.TOLERANCE, error


@pytest.mark.parametrize(
  "name",
  ["vit_small_plus_patch16_dinov3", "eva02_base_patch16_clip_224", "vit_pe_core_tiny_patch16_384"],
)
def test_the_export_command_writes_eva_that_reads_back_and_timm_rebuilds(
  hub_folder, tmp_path, name
):
  """`python -m vit_jax.export --format=timm` of a rotary model writes timm's Eva (name and
  keyword arguments in timm_model.json); timm rebuilds it and this package reads it back,
  both with the same logits. A model timm's Eva cannot hold is one error naming why."""
  from vit_jax import export  # pylint: disable=g-import-not-at-top

  hub, model, loaded = hub_folder(name)
  export.export(str(hub), "timm", str(tmp_path / "out"))
  spec = json.loads((tmp_path / "out" / "timm_model.json").read_text())
  state = safetensors_torch.load_file(tmp_path / "out" / "model.safetensors")
  rebuilt = fx.timm_rebuilt(spec, state)
  again = sources.load(str(tmp_path / "out"))
  assert again.image_size == (TINY[name][2],) * 2
  images = fx.images(2, TINY[name][2], seed=2)
  want = fx.torch_logits(model, images)
  for got in (fx.torch_logits(rebuilt, images), fx.our_logits(again, images)):
    assert fx.relative_error(got, want) <= fx.TOLERANCE
  config = loaded.config.replace(activation="quick_gelu")
  with pytest.raises(errors.ConfigError, match="an activation other than the exact GELU"):
    timm_eva.model_spec(config, num_classes=5, image_size=(32, 32))
