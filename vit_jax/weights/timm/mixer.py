"""timm `MlpMixer` <-> our MLP-Mixer parameters (the official tree), numpy only.

timm's names: ``stem.proj`` (the patch conv), ``blocks.{i}.{norm1, mlp_tokens.fc1/fc2,
norm2, mlp_channels.fc1/fc2}``, ``norm`` and ``head``; its block is the official one
(LayerNorm epsilon 1e-6, global average pooling after the final norm). timm computes the
exact GELU by default (``nn.GELU``) where the official weights were trained with the tanh
approximation; timm's `MlpMixer` takes ``act_layer`` as a class, not a name, so an export
with the tanh GELU states it apart (``spec['act_layer']``: pass
``act_layer=timm.layers.get_act_layer(spec['act_layer'])`` beside the ``kwargs``). The
family's reader (`read`) and config of a ``mixer_*`` name alone (`config_from_name`) are
here too; timm's gMLP, ResMLP and gated Mixers (other arguments) are refused by name.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import numpy as np

from vit_jax import models
from vit_jax.infra import errors
from vit_jax.infra.aliases import Params
from vit_jax.models.settings import PatchSettings
from vit_jax.weights import architecture, tensor_table
from vit_jax.weights.tensor_table import Row, rows
from vit_jax.weights.timm import arguments, names

MODULE = "mlp_mixer"  # timm's module of these architectures (`names.module`)
STEM = "stem.proj.weight"  # the array that tells a timm Mixer state dict
# timm MlpMixer's constructor defaults for what the arrays show (`MlpMixer.__init__`).
_SHAPES: dict[str, Any] = dict(patch_size=16, num_blocks=8, embed_dim=512, mlp_ratio=(0.5, 4.0))
# A timm MlpMixer argument beyond these is a gMLP, ResMLP or gated Mixer.
_ARGS = set(_SHAPES) | {"img_size", "num_classes"}
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


def unexpressed(name: str) -> list[str]:
  """``key=value`` of each argument timm registers for ``name`` beyond the MLP-Mixer's."""
  args = names.registered_args(name) or {}
  return [f"{k}={v!r}" for k, v in sorted(args.items()) if k not in _ARGS]


def read(checkpoint: arguments.Checkpoint) -> arguments.Loaded:
  """The family's reader: the stem's arrays fix the Mixer; its activation is timm's GELU,
  exact or tanh (``act_layer``)."""
  c = checkpoint
  params = from_timm(c.tensors, c.source)
  activation, approximate = arguments.activation(c.args, c.source)
  if activation != "gelu":
    raise errors.CheckpointError(
      f"{c.source}: a timm MlpMixer with act_layer {activation!r}: the Mixer computes a GELU."
    )
  settings = architecture.infer_settings(params).replace(
    gelu_approximate=approximate, **arguments.input_stats(c.pretrained_cfg, c.source)
  )
  return arguments.loaded(settings, params, c.class_names)


def config_from_name(
  name: str, args: dict[str, Any], source: str
) -> tuple[models.MixerSettings, tuple[int, int]]:
  """Our Mixer settings of timm's ``mixer_*`` ``name`` with its registered arguments, and
  its input size: timm's token and channel MLP widths are ``int(width * ratio)`` for its
  two ratios."""
  del source  # the name is the one error's subject
  a = {**_SHAPES, **args}
  extra = sorted(set(a) - _ARGS)
  if extra:  # gMLP, ResMLP and gated Mixers: check_timm refuses them by name first
    raise errors.ConfigError(f"{name!r}: timm MlpMixer arguments {extra} are not computed.")
  d, (tokens, channels) = int(a["embed_dim"]), a["mlp_ratio"]
  settings = models.variant_settings("Mixer-B_16").replace(
    name=name,
    patches=PatchSettings(arguments.pair(a["patch_size"])),
    hidden_dim=d,
    num_blocks=int(a["num_blocks"]),
    tokens_mlp_dim=int(d * tokens),
    channels_mlp_dim=int(d * channels),
    gelu_approximate=False,  # timm's nn.GELU
  )
  return settings, names.named_size(name, args)


def to_timm(params: Params, config: models.Settings) -> dict[str, np.ndarray]:
  """timm's `MlpMixer` state dict (numpy, float32) of our per-layer Mixer tree."""
  return tensor_table.to_torch(mixer_table(config.num_blocks), tensor_table.flat_float32(params))


def _ratio(hidden: int, width: int) -> float:
  """An MLP ratio r with timm's int(r * width) == hidden (t / d itself may round below)."""
  ratio = hidden / width
  return ratio if int(ratio * width) == hidden else (hidden + 0.5) / width


def model_spec(
  config: models.Settings, *, num_classes: Optional[int], image_size: tuple[int, int]
) -> dict[str, Any]:
  """What rebuilds the model in timm: {'architecture', 'model_name', 'kwargs',
  'pretrained_cfg_overlay', 'act_layer' (tanh GELU only)}.

  timm's `mixer_*` factories fix the patch size, width and depth, so an official shape is
  ``timm.create_model(model_name, **kwargs)`` with the rest as ``kwargs``; any other shape
  has no timm name (``model_name`` None) and is ``timm.models.mlp_mixer.MlpMixer(**kwargs)``
  with the state dict loaded from `model.safetensors`.
  """
  num_classes = num_classes or 0  # no head: timm's num_classes=0, the pooled features out
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
    spec["act_layer"] = arguments.act_layer("gelu", True)
  return spec
