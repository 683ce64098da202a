"""Run by test_train_sharded.py in a subprocess with 8 fake CPU devices.

Two train steps with each partitioning strategy; writes losses, parameters and the
sharding of a few kernels to the .npz given as argv[1].
"""

import os
import sys

from tests import fresh_python

os.environ["XLA_FLAGS"] = fresh_python.xla_flags(8)

import jax  # pylint: disable=g-import-not-at-top
import numpy as np
from flax import traverse_util

from tests import train_fixtures
from vit_jax.infra import sharding


def main(out_path: str) -> None:
  assert jax.device_count() == 8, jax.devices()
  results = {}
  for strategy, mesh in (
    ("data_parallel", (("data", 8), ("model", 1))),
    ("fsdp", (("data", 8), ("model", 1))),
    ("tensor_parallel", (("data", 4), ("model", 2))),
  ):
    config = train_fixtures.step_config()
    config.mesh, config.partitioning = mesh, strategy
    trainer = train_fixtures.build_steps(config)
    state = trainer.init_state()
    batch = jax.device_put(train_fixtures.fixed_batch(), sharding.batch_sharding(trainer.mesh))
    state = train_fixtures.record_steps(trainer, state, batch, strategy, results)
    flat = traverse_util.flatten_dict(state.params, sep="/")
    for k in (
      "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel",
      "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel",
    ):
      results[f"{strategy}/spec/{k}"] = np.array(str(flat[k].sharding.spec))
  config = train_fixtures.step_config()
  config.batch = 12
  try:
    train_fixtures.build_steps(config)
  except ValueError as e:
    results["batch_error"] = np.array(str(e))
  np.savez(out_path, **results)


if __name__ == "__main__":
  main(sys.argv[1])
