"""The official `.npz` format under its earlier import path: `vit_jax.weights.npz`."""

from vit_jax.weights.npz import (  # noqa: F401
  SCANNED_BLOCK,
  check_tree,
  is_scanned,
  layers_to_scanned,
  load_npz,
  save_npz,
  scanned_to_layers,
  to_layout,
)
