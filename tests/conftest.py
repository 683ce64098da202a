"""Shared fixtures: a tiny run config on the built-in digits dataset; the session's XLA
compilation cache."""

import atexit
import os
import shutil
import tempfile

# Tests run on the CPU. Set before JAX starts: with libtpu installed (the `tpu` extra, for
# `vit_jax.plan`) JAX would first try a TPU backend in every test process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# TensorFlow's C++ lines at errors only and oneDNN off, in this process and every
# subprocess, as the commands' start sets them (`platforms.quiet_start`): a test that
# imports TensorFlow outside a command reads only its own output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from tests import fresh_python  # noqa: E402  (the standard library only: JAX not started)

# The suite's compile options (`fresh_python.SUITE_XLA_FLAGS`), before JAX reads XLA_FLAGS.
os.environ["XLA_FLAGS"] = fresh_python.xla_flags(flags=os.environ.get("XLA_FLAGS", ""))

# One persistent compilation cache for the session, in the environment so that every
# subprocess (the commands, the multi-device and multi-process scripts) reads and adds to
# it: the tiny runs compile the same programs in many processes and many tests. Programs
# that compiled in 0.2 s or more are kept (JAX's default keeps those of 1 s or more: few of
# the tiny programs). Fresh per session (nothing read from an earlier run), kept out of the
# user's ~/.cache; a JAX_COMPILATION_CACHE_DIR already set is used instead.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _CACHE = tempfile.mkdtemp(prefix="vit_jax_tests_xla_")
  atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

# TensorFlow 2.21 then triton (torch's compiler, imported by torchvision and timm) ends
# the process with a segmentation fault; triton first, the two coexist. Loading it here lets
# any subset of the tests share one process in any order.
try:
  import triton  # noqa: E402, F401
except ImportError:
  pass

import itertools  # noqa: E402

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


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, digits_dir):
  """(workdir, final metrics) of the tiny run (`tiny_config`) trained straight to step 6
  in-process (steps 3 and 6 saved): the uninterrupted run of the resume test and the
  supervised checkpoint the LiT tests start from. Copy the workdir before changing it."""
  from vit_jax import run  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path_factory.mktemp("tiny_run"))
  return workdir, run.train_and_evaluate(train_fixtures.tiny_config(digits_dir), workdir)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, digits_dir):
  """(config, workdir, final metrics) of the `testing` model trained briefly on digits
  (`train_fixtures.trained_config`), with 10-shot evaluation and a whole evaluation at its
  last step: the trained classifier the few-shot and predict tests share. Copy the workdir
  before changing it."""
  from vit_jax import run  # pylint: disable=g-import-not-at-top

  config = train_fixtures.trained_config(digits_dir)
  workdir = str(tmp_path_factory.mktemp("trained_run"))
  return config, workdir, run.train_and_evaluate(config, workdir)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
  """A real GCS server on 127.0.0.1 for the session (`tests.gcs_server`)."""
  from tests.gcs_server import GcsServer  # pylint: disable=g-import-not-at-top

  server = GcsServer(tmp_path_factory.mktemp("gcs"))
  server.start()
  yield server
  server.stop()


_BUCKETS = itertools.count()


@pytest.fixture
def gcs_bucket(gcs_server, monkeypatch) -> str:
  """A new empty bucket (its gs:// URL) on the session's server, which this process's
  clients reach through STORAGE_EMULATOR_HOST (`vit_jax.infra.storage.configure` maps it for
  tensorstore); subprocesses inherit it."""
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)
  return gcs_server.make_bucket(f"bucket-{os.getpid()}-{next(_BUCKETS)}")


def pytest_configure(config):
  # Keep TensorFlow quiet and off any accelerator; tests are CPU-only.
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
