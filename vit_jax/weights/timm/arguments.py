"""What every timm family's reader shares, numpy only: the checkpoint a reader is given
(`Checkpoint`: the state dict, the architecture name and the arguments read beside it),
the result it returns (`loaded`), and what timm's arguments and ``pretrained_cfg`` say
beyond the arrays in the same words for every family (activation, input mean and std,
input size).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from vit_jax import models
from vit_jax.infra import errors
from vit_jax.infra.aliases import Params
from vit_jax.weights import architecture

# (our activation, tanh GELU?) -> timm's act_layer name (QuickGELU has no tanh variant).
ACT_LAYERS = {
  ("gelu", False): "gelu",
  ("gelu", True): "gelu_tanh",
  ("quick_gelu", False): "quick_gelu",
}
# timm act_layer -> (our activation, tanh GELU?); None: timm's default nn.GELU.
_ACTIVATIONS = {name: ours for ours, name in ACT_LAYERS.items()}
_ACTIVATIONS.update({"gelu_pytorch_tanh": ("gelu", True), None: ("gelu", False)})
_ACT_NAMES = ", ".join(repr(k) for k in _ACTIVATIONS if k)

# A reader's result: (model settings, per-layer params, class names or None, image size).
Loaded = tuple[models.Settings, Params, Optional[list[str]], Optional[tuple[int, int]]]


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """A timm state dict with what was read beside it: its architecture name ('' where none
  names it), its arguments (the registered ones updated with the stored), the class names
  and ``pretrained_cfg`` of its config, and the source named in errors."""

  tensors: dict[str, Any]
  name: str
  args: dict[str, Any]
  class_names: Optional[list[str]]
  pretrained_cfg: dict[str, Any]
  source: str


def act_layer(activation: str, gelu_approximate: bool) -> str:
  """timm's ``act_layer`` name of our activation."""
  return ACT_LAYERS[activation, gelu_approximate and activation == "gelu"]


def activation(args: dict[str, Any], source: str) -> tuple[str, bool]:
  """(our activation, tanh GELU?) of timm's ``act_layer`` model argument."""
  act = args.get("act_layer")
  if act not in _ACTIVATIONS:
    raise errors.CheckpointError(
      f"{source}: timm act_layer {act!r} is not an activation this model has ({_ACT_NAMES})."
    )
  return _ACTIVATIONS[act]


def loaded(
  settings: models.Settings,
  params: Params,
  names: Optional[list[str]],
  image_size: Optional[tuple[int, int]] = None,
) -> Loaded:
  """A reader's result: class names only where they match the head; the image size the
  weights fix (position tables, token MLPs), else ``image_size``."""
  if names is not None and len(names) != architecture.num_classes(params):
    names = None
  size = architecture.trained_image_size(params, settings) or image_size
  return settings, params, names, size


def input_size(pretrained_cfg: dict[str, Any]) -> Optional[tuple[int, int]]:
  """(height, width) of timm's ``pretrained_cfg`` ``input_size`` [C, H, W], if it has one:
  the size a model without position tables (a ResNet) was trained or fine-tuned at."""
  size = pretrained_cfg.get("input_size")
  if isinstance(size, list) and len(size) == 3 and all(isinstance(v, int) for v in size):
    return size[1], size[2]
  return None


def input_stats(pretrained_cfg: dict[str, Any], source: str) -> dict[str, tuple[float, ...]]:
  """The checkpoint's input ``mean``/``std`` (timm's ``pretrained_cfg``) as the settings'
  ``input_mean``/``input_std`` (those it states)."""
  stats = {}
  for ours, theirs in (("input_mean", "mean"), ("input_std", "std")):
    value = pretrained_cfg.get(theirs)
    if value is None:
      continue
    if not isinstance(value, list) or len(value) != 3 or not all(is_number(v) for v in value):
      raise errors.CheckpointError(
        f"{source}: pretrained_cfg {theirs} is {value!r}, not three numbers (one per RGB channel)."
      )
    stats[ours] = tuple(float(v) for v in value)
  return stats


def pair(value: Any) -> tuple[int, int]:
  """timm's size argument (a patch size: one int or two) as (height, width)."""
  return tuple(value) if isinstance(value, (list, tuple)) else (int(value), int(value))


def is_number(value: Any) -> bool:
  """A real number, not a bool (JSON's true is not a LayerNorm epsilon)."""
  return isinstance(value, (int, float)) and not isinstance(value, bool)
