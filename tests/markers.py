"""Markers shared by the test modules."""

import importlib.util

import pytest

# What compiles for a TPU on this CPU host (`vit_jax.plan`, a libtpu start-up) needs libtpu.
needs_libtpu = pytest.mark.skipif(
  importlib.util.find_spec("libtpu") is None,
  reason='libtpu is not installed (pip install -e ".[tpu]"): nothing compiles for a TPU',
)
