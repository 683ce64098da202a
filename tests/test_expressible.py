"""Imports decide from the checkpoint's own description: a timm architecture or a
transformers model type this package does not compute is one error naming it and what is
missing, before any array is read (never a KeyError, never a result)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from vit_jax.infra import errors
from vit_jax.weights import sources

WIDTH = 8


def _rope_vit_arrays() -> dict[str, np.ndarray]:
  """A one-block timm ViT state dict without a position table (rotary models store none)."""
  shapes = {
    "patch_embed.proj.weight": (WIDTH, 3, 16, 16),
    "patch_embed.proj.bias": (WIDTH,),
    "cls_token": (1, 1, WIDTH),
    "blocks.0.norm1.weight": (WIDTH,),
    "blocks.0.norm1.bias": (WIDTH,),
    "blocks.0.attn.qkv.weight": (3 * WIDTH, WIDTH),
    "blocks.0.attn.q_bias": (WIDTH,),
    "blocks.0.attn.v_bias": (WIDTH,),
    "blocks.0.attn.proj.weight": (WIDTH, WIDTH),
    "blocks.0.attn.proj.bias": (WIDTH,),
    "blocks.0.norm2.weight": (WIDTH,),
    "blocks.0.norm2.bias": (WIDTH,),
    "blocks.0.mlp.fc1.weight": (2 * WIDTH, WIDTH),
    "blocks.0.mlp.fc1.bias": (2 * WIDTH,),
    "blocks.0.mlp.fc2.weight": (WIDTH, 2 * WIDTH),
    "blocks.0.mlp.fc2.bias": (WIDTH,),
    "norm.weight": (WIDTH,),
    "norm.bias": (WIDTH,),
    "head.weight": (5, WIDTH),
    "head.bias": (5,),
  }
  return {k: np.zeros(s, np.float32) for k, s in shapes.items()}


def write_checkpoint(folder: str, config: dict) -> str:
  """``folder`` with ``config`` as config.json beside a small state dict."""
  os.makedirs(folder)
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(config, f)
  save_file(_rope_vit_arrays(), os.path.join(folder, "model.safetensors"))
  return folder


@pytest.mark.parametrize(
  "name,fragment",
  [
    ("vit_base_patch16_sapiens2", "(timm eva.py) has attn_only_layer_scale=True"),
    ("eva02_enormous_patch14_clip_224", "use_post_norm=True"),
    ("beit_base_patch16_224", "is BEiT (timm beit.py)"),
    ("gmixer_24_224", "(timm mlp_mixer.py) has act_layer='SiLU'"),
  ],
)
def test_a_timm_family_the_package_does_not_express_is_one_error(tmp_path, name, fragment):
  """Named in one line with what is missing: an eva.py name by each argument this ViT
  does not compute (DINOv3, EVA-02, PE and RoPE-ViT are read: tests/test_timm_eva.py)."""
  folder = write_checkpoint(str(tmp_path / "m"), {"architecture": name})
  for path in (folder, os.path.join(folder, "model.safetensors")):
    with pytest.raises(errors.CheckpointError) as raised:
      sources.load(path)
    message = str(raised.value)
    assert "\n" not in message
    assert f"timm architecture {name!r}" in message and fragment in message


def test_a_timm_architecture_never_seen_is_one_error_naming_it(tmp_path):
  folder = write_checkpoint(str(tmp_path / "m"), {"architecture": "swin_tiny_patch4_window7_224"})
  with pytest.raises(errors.CheckpointError, match="'swin_tiny_patch4_window7_224' is none"):
    sources.load(folder)


@pytest.mark.parametrize(
  "config,fragment",
  [
    (
      {"model_type": "dinov3_vit", "architectures": ["DINOv3ViTModel"]},
      "model_type 'dinov3_vit' (DINOv3ViTModel) is not computed by this package (DINOv3",
    ),
    ({"model_type": "beit"}, "model_type 'beit' (no architectures) is not computed"),
    (
      {"model_type": "vit", "architectures": ["ViTForMaskedImageModeling"]},
      "architectures ['ViTForMaskedImageModeling'] are not computed",
    ),
  ],
)
def test_a_transformers_model_the_package_does_not_express_is_one_error(tmp_path, config, fragment):
  folder = write_checkpoint(str(tmp_path / "m"), config)
  with pytest.raises(errors.CheckpointError) as raised:
    sources.load(folder)
  assert fragment in str(raised.value) and "\n" not in str(raised.value)
