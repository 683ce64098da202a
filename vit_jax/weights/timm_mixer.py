"""timm `MlpMixer` <-> our MLP-Mixer parameters (the official tree), numpy only.

timm's names: ``stem.proj`` (the patch conv), ``blocks.{i}.{norm1, mlp_tokens.fc1/fc2,
norm2, mlp_channels.fc1/fc2}``, ``norm`` and ``head``; its block is the official one
(LayerNorm epsilon 1e-6, global average pooling after the final norm). timm computes the
exact GELU by default (``nn.GELU``) where the official weights were trained with the tanh
approximation; timm's `MlpMixer` takes ``act_layer`` as a class, not a name, so an export
with the tanh GELU states it apart (``spec['act_layer']``: pass
``act_layer=timm.layers.get_act_layer(spec['act_layer'])`` beside the ``kwargs``).
"""

from __future__ import annotations

import re
from typing import Any, Optional

import ml_collections
import numpy as np

from vit_jax import errors
from vit_jax.aliases import Params
from vit_jax.weights import tensor_table
from vit_jax.weights import timm as timm_vit
from vit_jax.weights.tensor_table import Row, rows

STEM = "stem.proj.weight"  # the array that tells a timm Mixer state dict
_BLOCK = re.compile(r"^blocks\.(\d+)\.")
# Official Mixer architectures (patch, width, depth) -> timm names (their factories fix
# these three; any other shape is built as timm's MlpMixer class itself).
_NAMES = {
  (16, 768, 12): "mixer_b16_224",
  (32, 768, 12): "mixer_b32_224",
  (16, 1024, 24): "mixer_l16_224",
  (32, 1024, 24): "mixer_l32_224",
}
_OFFICIAL_RATIOS = (0.5, 4.0)  # timm's default token and channel MLP ratios, the official ones
_MLPS = (("token_mixing", "mlp_tokens"), ("channel_mixing", "mlp_channels"))
_NORMS = (("LayerNorm_0", "norm1"), ("LayerNorm_1", "norm2"))


def mixer_table(depth: int) -> list[Row]:
  """Every array of timm's `MlpMixer` of ``depth`` blocks, ours <-> timm's."""
  table = [
    Row("stem/kernel", STEM, tensor_table.CONV),
    Row("stem/bias", "stem.proj.bias"),
    *rows("pre_head_layer_norm", "norm"),
    *rows("head", "head", tensor_table.DENSE, required=False),
  ]
  for i in range(depth):
    ours, theirs = f"MixerBlock_{i}/", f"blocks.{i}."
    for ln, norm in _NORMS:
      table += rows(f"{ours}{ln}", f"{theirs}{norm}")
    for mlp, timm_mlp in _MLPS:
      for dense, fc in (("Dense_0", "fc1"), ("Dense_1", "fc2")):
        table += rows(f"{ours}{mlp}/{dense}", f"{theirs}{timm_mlp}.{fc}", tensor_table.DENSE)
  return table


def from_timm(tensors: dict[str, np.ndarray], source: str) -> Params:
  """Our per-layer Mixer tree of timm's `MlpMixer` state dict; one error names every timm
  array it has no place for (e.g. a stem norm, or ResMLP/gMLP layers)."""
  depth = 1 + max((int(m[1]) for k in tensors if (m := _BLOCK.match(k))), default=-1)
  what = " (LayerNorm blocks, no stem norm, average pooling)"
  return tensor_table.from_torch(mixer_table(depth), tensors, source, "MlpMixer", what)


def to_timm(params: Params, config: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
  """timm's `MlpMixer` state dict (numpy, float32) of our per-layer Mixer tree."""
  return tensor_table.to_torch(mixer_table(config.num_blocks), tensor_table.flat_float32(params))


def _ratio(hidden: int, width: int) -> float:
  """An MLP ratio r with timm's int(r * width) == hidden (t / d itself may round below)."""
  ratio = hidden / width
  return ratio if int(ratio * width) == hidden else (hidden + 0.5) / width


def model_spec(
  config: ml_collections.ConfigDict, *, num_classes: Optional[int], image_size: tuple[int, int]
) -> dict[str, Any]:
  """What rebuilds the model in timm: {'architecture', 'model_name', 'kwargs',
  'pretrained_cfg_overlay', 'act_layer' (tanh GELU only)}.

  timm's `mixer_*` factories fix the patch size, width and depth, so an official shape is
  ``timm.create_model(model_name, **kwargs)`` with the rest as ``kwargs``; any other shape
  has no timm name (``model_name`` None) and is ``timm.models.mlp_mixer.MlpMixer(**kwargs)``
  with the state dict loaded from `model.safetensors`.
  """
  if not num_classes:
    raise errors.ConfigError("This model cannot be exported to timm: no classification head.")
  patch = tuple(config.patches.size)
  d = config.hidden_dim
  name = _NAMES.get((patch[0], d, config.num_blocks)) if patch[0] == patch[1] else None
  kwargs: dict[str, Any] = dict(img_size=list(image_size), num_classes=num_classes)
  ratios = [_ratio(config.tokens_mlp_dim, d), _ratio(config.channels_mlp_dim, d)]
  if ratios != list(_OFFICIAL_RATIOS):
    kwargs["mlp_ratio"] = ratios
  if name is None:
    kwargs.update(
      patch_size=patch[0] if patch[0] == patch[1] else list(patch),
      num_blocks=config.num_blocks,
      embed_dim=d,
    )
  how = (
    f"timm.create_model({name!r}, **kwargs)"
    if name
    else "timm.models.mlp_mixer.MlpMixer(**kwargs), then load_state_dict of model.safetensors"
  )
  spec = {
    "architecture": (
      f"MLP-Mixer: patch {'x'.join(map(str, patch))}, width {d}, depth {config.num_blocks}, "
      f"token MLP {config.tokens_mlp_dim}, channel MLP {config.channels_mlp_dim}, input "
      f"{'x'.join(map(str, image_size))}, {num_classes} classes; in timm: {how}"
    ),
    "model_name": name,
    "kwargs": kwargs,
    "pretrained_cfg_overlay": {"num_classes": num_classes},
  }
  if config.gelu_approximate:
    spec["act_layer"] = timm_vit.act_layer("gelu", True)
  return spec
