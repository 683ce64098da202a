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
from flax import traverse_util

from vit_jax import errors
from vit_jax.aliases import Params
from vit_jax.weights import timm as timm_export

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


def _conv(weight: np.ndarray) -> np.ndarray:  # [Cout, Cin, kh, kw] -> [kh, kw, Cin, Cout]
  return np.ascontiguousarray(weight.transpose(2, 3, 1, 0))


def _t(x: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(x.T)


def from_timm(tensors: dict[str, np.ndarray], source: str) -> Params:
  """Our per-layer Mixer tree of timm's `MlpMixer` state dict; one error names every timm
  array it has no place for (e.g. a stem norm, or ResMLP/gMLP layers)."""
  tensors = {k: np.asarray(v, np.float32) for k, v in tensors.items()}
  unused = set(tensors)

  def take(key: str) -> np.ndarray:
    unused.discard(key)
    if key not in tensors:
      raise errors.CheckpointError(
        f"{source}: no {key!r}; this is not a timm MlpMixer state dict (mixer_*)."
      )
    return tensors[key]

  flat = {
    "stem/kernel": _conv(take(STEM)),
    "stem/bias": take("stem.proj.bias"),
    "pre_head_layer_norm/scale": take("norm.weight"),
    "pre_head_layer_norm/bias": take("norm.bias"),
  }
  if "head.weight" in tensors:
    flat["head/kernel"], flat["head/bias"] = _t(take("head.weight")), take("head.bias")
  for i in sorted({int(m[1]) for k in tensors if (m := _BLOCK.match(k))}):
    ours, theirs = f"MixerBlock_{i}/", f"blocks.{i}."
    for ln, norm in _NORMS:
      flat[f"{ours}{ln}/scale"] = take(f"{theirs}{norm}.weight")
      flat[f"{ours}{ln}/bias"] = take(f"{theirs}{norm}.bias")
    for mlp, timm_mlp in _MLPS:
      for dense, fc in (("Dense_0", "fc1"), ("Dense_1", "fc2")):
        flat[f"{ours}{mlp}/{dense}/kernel"] = _t(take(f"{theirs}{timm_mlp}.{fc}.weight"))
        flat[f"{ours}{mlp}/{dense}/bias"] = take(f"{theirs}{timm_mlp}.{fc}.bias")
  if unused:
    raise errors.CheckpointError(
      f"{source}: {len(unused)} timm arrays have no place in the MLP-Mixer (LayerNorm "
      f"blocks, no stem norm, average pooling): {sorted(unused)[:6]}."
    )
  return traverse_util.unflatten_dict(flat, sep="/")


def to_timm(params: Params, config: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
  """timm's `MlpMixer` state dict (numpy, float32) of our per-layer Mixer tree."""
  flat = timm_export.flat_float32(params)
  out = {
    STEM: timm_export._conv(flat["stem/kernel"]),
    "stem.proj.bias": flat["stem/bias"],
    "norm.weight": flat["pre_head_layer_norm/scale"],
    "norm.bias": flat["pre_head_layer_norm/bias"],
    "head.weight": _t(flat["head/kernel"]),
    "head.bias": flat["head/bias"],
  }
  for i in range(config.num_blocks):
    ours, theirs = f"MixerBlock_{i}/", f"blocks.{i}."
    for ln, norm in _NORMS:
      out[f"{theirs}{norm}.weight"] = flat[f"{ours}{ln}/scale"]
      out[f"{theirs}{norm}.bias"] = flat[f"{ours}{ln}/bias"]
    for mlp, timm_mlp in _MLPS:
      for dense, fc in (("Dense_0", "fc1"), ("Dense_1", "fc2")):
        out[f"{theirs}{timm_mlp}.{fc}.weight"] = _t(flat[f"{ours}{mlp}/{dense}/kernel"])
        out[f"{theirs}{timm_mlp}.{fc}.bias"] = flat[f"{ours}{mlp}/{dense}/bias"]
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


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
    spec["act_layer"] = timm_export._ACT_LAYER[True]
  return spec
