"""The Python face that `import vit_jax` hands on (`vit_jax.Model`, `load`, `create`):
`model` and what it uses (`model_facts`, `model_checks`, `nnx_view`, `text_scores`,
`fine_tune`), and the paper's analyses and figures (`analysis`, `plots`). A submodule
loads when first named as an attribute (``help(vit_jax.api.fine_tune.train_on_arrays)``)."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any


def __getattr__(name: str) -> Any:
  if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
    return importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
