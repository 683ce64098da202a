"""On 8 fake CPU devices every partitioning strategy computes the 1-device step."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import traverse_util

from tests import fresh_python, train_fixtures

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def sharded_results(tmp_path_factory):
  out = tmp_path_factory.mktemp("sharded") / "results.npz"
  env = {**os.environ, "XLA_FLAGS": fresh_python.xla_flags(8), "PYTHONPATH": REPO}
  proc = subprocess.run(
    [sys.executable, "-m", "tests._strategy_step", str(out)],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  with np.load(out) as f:
    return dict(f)


@pytest.fixture(scope="module")
def single_device():
  config = train_fixtures.step_config()
  config.mesh = (("data", 1), ("model", 1))
  trainer = train_fixtures.build_steps(config)
  state = trainer.init_state()
  batch = train_fixtures.fixed_batch()
  losses = []
  for _ in range(2):
    state, metrics = trainer.train_step(state, batch)
    losses.append(float(metrics["train/loss"]))
  return np.array(losses), traverse_util.flatten_dict(jax.device_get(state.params), sep="/")


@pytest.mark.parametrize("strategy", ["data_parallel", "fsdp", "tensor_parallel"])
def test_strategy_matches_single_device(strategy, sharded_results, single_device):
  losses, params = single_device
  np.testing.assert_allclose(sharded_results[f"{strategy}/loss"], losses, atol=1e-5)
  assert losses[1] < losses[0]  # the second step learned something
  for k, v in params.items():
    np.testing.assert_allclose(sharded_results[f"{strategy}/params/{k}"], v, atol=1e-5, err_msg=k)


def test_strategies_really_shard(sharded_results):
  mlp = "spec/Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"
  query = "spec/Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"
  assert "data" not in str(sharded_results[f"data_parallel/{mlp}"])
  assert "model" not in str(sharded_results[f"data_parallel/{mlp}"])
  assert "data" in str(sharded_results[f"fsdp/{mlp}"])
  assert "model" in str(sharded_results[f"tensor_parallel/{mlp}"])
  assert "model" in str(sharded_results[f"tensor_parallel/{query}"])


def test_batch_not_divisible_by_devices_is_a_clear_error(sharded_results):
  msg = str(sharded_results["batch_error"])
  assert "batch=12" in msg and "8 devices" in msg and "multiple of 8" in msg
