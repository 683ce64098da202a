"""timm BiT ResNet-v2 (``resnetv2_*_bit``) <-> our `BitResNet` parameters, numpy only.

timm's names: ``stem.conv``, ``stages.{s}.blocks.{u}.{norm1, downsample.conv, conv1,
norm2, conv2, norm3, conv3}``, ``norm`` (the final GroupNorm) and ``head.fc`` (a 1x1 conv
[K, C, 1, 1]). Both standardise kernels as (w - mean) / sqrt(var + 1e-8) (`models.bit`), so
the kernels are only transposed. timm names BiT models by depth and width
(``resnetv2_50x1_bit``); the other ResNet-v2s of timm (BatchNorm, other stems and
epsilons) compute something else and are refused by name (`check_name`, in `read`).
"""

from __future__ import annotations

import re
from typing import Any, Optional

import numpy as np

from vit_jax import models
from vit_jax.infra import errors
from vit_jax.infra.aliases import Params
from vit_jax.models import bit
from vit_jax.weights import architecture, tensor_table
from vit_jax.weights.tensor_table import Row, rows
from vit_jax.weights.timm import arguments

MODULE = "resnetv2"  # timm's module of ResNet-v2 (not in `names`' table: read by the stem)
STEM = "stem.conv.weight"  # the array that tells a timm ResNet-v2 state dict
_UNIT = re.compile(r"^stages\.(\d+)\.blocks\.(\d+)\.")
_BIT_NAME = re.compile(r"^resnetv2_(\d+)x(\d+)_bit$")
# (units per stage, width factor) -> the timm names of BiT (their factories fix both).
_DEPTHS = {(3, 4, 6, 3): 50, (3, 4, 23, 3): 101, (3, 8, 36, 3): 152}
_TIMM_WIDTHS = {50: (1, 3), 101: (1, 3), 152: (2, 4)}
_CONVS = (
  ("conv1", "conv1"),
  ("conv2", "conv2"),
  ("conv3", "conv3"),
  ("conv_proj", "downsample.conv"),
)
_NORMS = (("gn1", "norm1"), ("gn2", "norm2"), ("gn3", "norm3"))
_HEAD = "head.fc"


def check_name(timm_name: str, args: dict[str, Any], source: str) -> None:
  """A timm architecture name is a BiT's (``resnetv2_<depth>x<width>_bit``) or none, and
  the model pools by the average (timm's ``global_pool`` 'avg')."""
  if timm_name and not _BIT_NAME.match(timm_name):
    raise errors.CheckpointError(
      f"{source}: timm architecture {timm_name!r} is a ResNet-v2 that is not BiT (other "
      "norms, stem or weight standardisation); only resnetv2_<depth>x<width>_bit is read."
    )
  if args.get("global_pool", "avg") != "avg":
    raise errors.CheckpointError(
      f"{source}: timm global_pool {args['global_pool']!r}; the BiT ResNet pools by the "
      "average ('avg')."
    )


def bit_table(units: tuple[int, ...]) -> list[Row]:
  """Every array of timm's ``resnetv2_*_bit`` with ``units`` per stage, ours <-> timm's."""
  table = [
    Row(f"{bit.ROOT}/conv_root/kernel", STEM, tensor_table.CONV),
    *rows(bit.PRE_HEAD_NORM, "norm"),
    *rows("head", _HEAD, tensor_table.DENSE_AS_CONV, required=False),
  ]
  for s, num_units in enumerate(units):
    for u in range(num_units):
      ours, theirs = f"block{s + 1}/{bit.unit_name(u)}/", f"stages.{s}.blocks.{u}."
      for conv, timm_conv in _CONVS:
        optional = dict(required=False) if conv == "conv_proj" else {}
        table.append(
          Row(f"{ours}{conv}/kernel", f"{theirs}{timm_conv}.weight", tensor_table.CONV, **optional)
        )
      for norm, timm_norm in _NORMS:
        table += rows(f"{ours}{norm}", f"{theirs}{timm_norm}")
  return table


def from_timm(tensors: dict[str, np.ndarray], source: str) -> Params:
  """Our `BitResNet` tree of timm's ``resnetv2_*_bit`` state dict; one error names every
  timm array it has no place for."""
  units: dict[int, int] = {}
  for k in tensors:
    if m := _UNIT.match(k):
      units[int(m[1])] = max(units.get(int(m[1]), 0), int(m[2]) + 1)
  table = bit_table(tuple(units.get(s, 0) for s in range(max(units, default=-1) + 1)))
  what = " (GroupNorm, weight-standardised convs, no biases)"
  return tensor_table.from_torch(table, tensors, source, "BiT ResNet", what)


def read(checkpoint: arguments.Checkpoint) -> arguments.Loaded:
  """The family's reader: a BiT state dict under a BiT's name (or none), at the input size
  of its pretrained config (a ResNet's weights do not fix it)."""
  c = checkpoint
  check_name(c.name, c.args, c.source)
  params = from_timm(c.tensors, c.source)
  settings = architecture.infer_settings(params)
  settings = settings.replace(**arguments.input_stats(c.pretrained_cfg, c.source))
  return arguments.loaded(settings, params, c.class_names, arguments.input_size(c.pretrained_cfg))


def to_timm(params: Params, config: models.Settings) -> dict[str, np.ndarray]:
  """timm's ``ResNetV2`` state dict (numpy, float32) of our `BitResNet` tree."""
  table = bit_table(tuple(config.resnet.num_layers))
  return tensor_table.to_torch(table, tensor_table.flat_float32(params))


def timm_name(config: models.Settings) -> Optional[str]:
  """timm's factory name of this BiT shape, or None where timm registers none (of the
  paper's: R50x2, R152x1, R200x3)."""
  depth = _DEPTHS.get(tuple(config.resnet.num_layers))
  width = int(config.resnet.width_factor)
  if depth is None or width not in _TIMM_WIDTHS[depth]:
    return None
  return f"resnetv2_{depth}x{width}_bit"


def model_spec(
  config: models.Settings, *, num_classes: Optional[int], image_size: tuple[int, int]
) -> dict[str, Any]:
  """What rebuilds the model in timm: {'architecture', 'model_name', 'kwargs',
  'pretrained_cfg_overlay' (classes, input size, mean and std)}.

  A shape timm registers is ``timm.create_model(model_name, **kwargs)``; any other has no
  timm name (``model_name`` None) and is ``timm.models.resnetv2.ResNetV2(**kwargs,
  conv_layer=functools.partial(timm.layers.StdConv2d, eps=1e-8))``, as timm's
  ``_create_resnetv2_bit`` builds its BiTs, with the state dict loaded from
  `model.safetensors`.
  """
  num_classes = num_classes or 0  # no head: timm's num_classes=0, the pooled features out
  name = timm_name(config)
  units, width = tuple(config.resnet.num_layers), int(config.resnet.width_factor)
  kwargs: dict[str, Any] = dict(num_classes=num_classes)
  if name is None:
    kwargs.update(layers=list(units), width_factor=width, stem_type="fixed")
  how = (
    f"timm.create_model({name!r}, **kwargs)"
    if name
    else "timm.models.resnetv2.ResNetV2(**kwargs, conv_layer=functools.partial("
    f"timm.layers.StdConv2d, eps={bit.KERNEL_VARIANCE_EPSILON})), then load_state_dict of "
    "model.safetensors"
  )
  size = "x".join(map(str, image_size))
  return {
    "architecture": (
      f"BiT ResNet-v2: units per stage {units}, width factor {width}, input {size}, "
      f"{num_classes} classes; in timm: {how}"
    ),
    "model_name": name,
    "kwargs": kwargs,
    # The input size too: a ResNet's weights do not fix it, and a re-import reads it here.
    "pretrained_cfg_overlay": {
      "num_classes": num_classes,
      "input_size": [3, *image_size],
      "mean": list(config.input_mean),
      "std": list(config.input_std),
    },
  }
