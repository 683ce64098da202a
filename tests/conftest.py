"""Shared fixtures: a tiny run config on the built-in digits dataset."""

import os

import pytest

from configs import quickstart
from vit_jax.models import get_model_config


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
  """One tfds data_dir for the session: digits builds into it once (about a second)."""
  return str(tmp_path_factory.mktemp("tfds"))


@pytest.fixture
def tiny_config(digits_dir):
  """Quickstart shrunk to seconds: the `testing` model at 8x8, a few steps."""
  config = quickstart.get_config()
  config.data_dir = digits_dir
  config.model = get_model_config("testing")
  config.pp.crop = 8
  config.batch = 16
  config.batch_eval = 64
  config.shuffle_buffer = 64
  config.total_steps = 6
  config.lr.warmup_steps = 2
  config.log_every = 2
  config.eval_every = 4
  config.checkpoint_every = 3
  return config


def pytest_configure(config):
  # Keep TensorFlow quiet and off any accelerator; tests are CPU-only.
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
