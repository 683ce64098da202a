"""Shared fixtures: a tiny run config on the built-in digits dataset."""

import os

# Tests run on the CPU. Set before JAX starts: with libtpu installed (the `tpu` extra, for
# `vit_jax.plan`) JAX would first try a TPU backend in every test process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# TensorFlow 2.21 then triton (torch's compiler, imported by torchvision and timm) ends
# the process with a segmentation fault; triton first, the two coexist. Loading it here lets
# any subset of the tests share one process in any order.
try:
  import triton  # noqa: E402, F401
except ImportError:
  pass

import pytest  # noqa: E402

from tests import train_fixtures  # noqa: E402


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
  """One tfds data_dir for the session: digits builds into it once (about a second)."""
  return str(tmp_path_factory.mktemp("tfds"))


@pytest.fixture
def tiny_config(digits_dir):
  """Quickstart shrunk to seconds: the `testing` model at 8x8, a few steps."""
  return train_fixtures.tiny_config(digits_dir)


def pytest_configure(config):
  # Keep TensorFlow quiet and off any accelerator; tests are CPU-only.
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
