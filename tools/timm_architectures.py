r"""Writes `vit_jax/weights/timm_architectures.json`: every architecture name timm registers
in its ViT-family modules (`MODULES`) -> its module and the constructor arguments its
entrypoint passes, from timm's own registry.

    python tools/timm_architectures.py        # needs timm (pip install -e ".[interop]")

A timm hub `config.json` names only the ``architecture``; what the arrays do not show (the
head count, pooling, LayerNorm epsilon, activation, position rows of the prefix tokens,
LayerScale init) is in these arguments. Each entrypoint of the modules is called with its
model builders (every ``_create_*`` of the module) replaced by one that records the keyword
arguments and stops, on torch's ``meta`` device (a hybrid's backbone is built there,
without memory): no weights, no model. A NaFlexViT's dataclass config is written as the
fields it sets. Values that are not JSON (a norm or activation class, a
`functools.partial`, a backbone) are written as their class name with their keyword
arguments, e.g. ``"LayerNorm(eps=1e-05)"``; `vit_jax.weights.timm.names` reads them,
and `tests/test_timm_names.py` holds this file equal to what the installed timm gives.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
from typing import Any, Callable

OUT = os.path.join(os.path.dirname(__file__), "..", "vit_jax", "weights", "timm_architectures.json")
# timm's ViT-family modules: the plain ViT and what shares its blocks or names (hybrids,
# relative positions, SAM, DeiT, Eva, NaFlexViT, the MLP-Mixers), then the other
# transformers over patches (`docs/timm_names.md` lists every name with its status).
MODULES = (
  "vision_transformer",
  "vision_transformer_hybrid",
  "vision_transformer_relpos",
  "vision_transformer_sam",
  "deit",
  "eva",  # DINOv3, EVA-02, Perception Encoder, RoPE-ViT
  "naflexvit",
  "mlp_mixer",
  "beit",
  "cait",
  "convit",
  "crossvit",
  "xcit",
  "deepseek_vit",
  "gemma4_vit",
  "qwen3_vit",
)


class _Recorded(Exception):
  """Raised by the replaced builder, carrying the keyword arguments it was given."""


def describe(value: Any) -> Any:
  """A constructor argument as JSON: numbers, strings, booleans and lists as they are; a
  class as its name; a partial as ``Name(key=value, ...)``; a ResNetV2 backbone as
  ``ResNetV2(layers=[...])``."""
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, (list, tuple)):
    return [describe(v) for v in value]
  if isinstance(value, functools.partial):
    keywords = ", ".join(f"{k}={describe(v)!r}" for k, v in sorted(value.keywords.items()))
    return f"{describe(value.func)}({keywords})"
  if isinstance(value, type):
    return value.__name__
  if dataclasses.is_dataclass(value):  # NaFlexVitCfg: the fields it sets
    return {
      f.name: describe(getattr(value, f.name))
      for f in dataclasses.fields(value)
      if getattr(value, f.name) != f.default
    }
  stages = getattr(value, "stages", None)
  if stages is not None:  # a backbone module
    return f"{type(value).__name__}(layers={[len(s.blocks) for s in stages]})"
  return type(value).__name__


def _recorder(*args: Any, **kwargs: Any) -> None:
  # A hybrid's builder takes its backbone second (others: the pretrained flag).
  second = args[1] if len(args) > 1 and not isinstance(args[1], bool) else None
  backbone = kwargs.get("backbone", second)
  kwargs.pop("pretrained", None)
  if backbone is not None:
    kwargs["backbone"] = backbone
  cfg = kwargs.pop("cfg", None)  # NaFlexViT: a dataclass, its fields beside the kwargs
  if cfg is not None:
    kwargs = {**describe(cfg), **kwargs}
  raise _Recorded(kwargs)


def _arguments(entrypoint: Callable[..., Any]) -> dict[str, Any]:
  try:
    entrypoint(pretrained=False)
  except _Recorded as recorded:
    return {k: describe(v) for k, v in sorted(recorded.args[0].items())}
  raise RuntimeError(f"{entrypoint.__name__} did not call its builder")


def architectures() -> dict[str, Any]:
  """{'timm_version', 'architectures': {name: {'module', 'args'}}} from the installed timm."""
  sys.modules.setdefault("triton", None)  # unused here; its import can crash beside TF
  import importlib

  import timm
  import torch
  from timm.models import _registry

  table = {}
  for module_name in MODULES:
    module = importlib.import_module(f"timm.models.{module_name}")
    builders = {k: v for k, v in vars(module).items() if k.startswith("_create_")}
    for builder in builders:
      setattr(module, builder, _recorder)
    try:
      with torch.device("meta"):
        for name in timm.list_models(module=module_name):
          table[name] = {
            "module": module_name,
            "args": _arguments(_registry.model_entrypoint(name)),
          }
          # timm builds the name at its default weights' input size (the pretrained
          # config's, as `img_size`) where the arguments do not fix one.
          cfg = _registry.get_pretrained_cfg(name)
          if cfg is not None and cfg.input_size:
            table[name]["input_size"] = list(cfg.input_size[1:])

    finally:
      for builder, original in builders.items():
        setattr(module, builder, original)
  return {"timm_version": timm.__version__, "architectures": dict(sorted(table.items()))}


def main() -> None:
  with open(OUT, "w") as f:
    json.dump(architectures(), f, indent=1, sort_keys=True)
    f.write("\n")
  print(f"wrote {os.path.normpath(OUT)}")


if __name__ == "__main__":
  main()
