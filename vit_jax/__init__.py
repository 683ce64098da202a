"""The Vision Transformer in JAX/Flax (see README.md).

The Python face (`vit_jax.api.model`): ``vit_jax.load(source)`` (alias ``from_pretrained``),
``vit_jax.create(name, num_classes=...)`` (alias ``create_model``) and the `Model` they
return. The names load on first use (PEP 562), so ``import vit_jax`` stays cheap and never
imports TensorFlow; so does every submodule named as an attribute, as
``help(vit_jax.api.fine_tune.train_on_arrays)`` does (`vit_jax.api` loads its own alike).

Importing the package (any module of it) only imports: no environment variable, no JAX
setting changes and JAX is not imported here. The commands' quiet start (TensorFlow's C++
lines at errors only; JAX's CPU backend on a host with libtpu or JAX's CUDA plugin but no
TPU or GPU) is `vit_jax.infra.platforms.quiet_start()`, which `cli.run_command` calls and a
script or notebook may call before its first JAX computation.
"""

from __future__ import annotations

import importlib
import importlib.util
import types
from typing import Any

_FACE = ("Model", "create", "create_model", "from_pretrained", "load")
__all__ = list(_FACE)


def __getattr__(name: str) -> Any:
  if name in _FACE:
    return getattr(importlib.import_module("vit_jax.api.model"), name)
  if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
    return importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module 'vit_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
  """The public names (tab completion): the face, and the subpackages imported so far."""
  imported = [n for n, v in globals().items() if not n.startswith("_") and _is_submodule(v)]
  return sorted({*__all__, *imported})


def _is_submodule(value: Any) -> bool:
  return isinstance(value, types.ModuleType) and value.__name__.startswith(f"{__name__}.")
