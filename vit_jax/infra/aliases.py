"""The type aliases the package shares, stated once."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

# A Flax parameter tree: nested dicts of arrays, keyed by module and parameter names.
Params = dict[str, Any]
# A global batch on the devices: 'image' f32[B, H, W, 3] in [-1, 1], 'label' f32[B, K];
# evaluation batches add 'mask' f32[B] (0 for padding rows).
Batch = dict[str, jax.Array]
# The same on the host, before it becomes a global array: this process's rows only.
HostBatch = dict[str, np.ndarray]
