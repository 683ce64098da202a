"""accum_steps='auto': the fewest micro-batches whose compiled step fits a pretended limit."""

import dataclasses
import functools

import jax
import numpy as np
import pytest

from tests import train_fixtures
from vit_jax import run
from vit_jax.infra import sharding
from vit_jax.run import memory_fit, resolver, step_cost


def test_candidates_split_the_batch_over_the_data_devices():
  assert memory_fit.accum_candidates(16, 1) == [1, 2, 4, 8, 16]
  assert memory_fit.accum_candidates(24, 2) == [1, 2, 3, 4, 6, 12]


def _config(accum_steps):
  config = train_fixtures.step_config()
  config.pp.crop = 16  # 16 tokens: activations, not parameters, dominate the memory
  config.batch = 16
  config.accum_steps = accum_steps
  config.num_classes = 10
  return config


@pytest.fixture
def auto_config():
  return _config(memory_fit.AUTO)


@functools.cache  # one compile per count for the module (the tests share _peak(1))
def _peak(accum_steps):
  return step_cost.peak_bytes(train_fixtures.build_steps(_config(accum_steps)).compile_train_step())


def _fit(config, limit_bytes):
  """Resolves ``config`` against ``limit_bytes``; runs the chosen step once."""
  mesh = sharding.make_mesh(tuple(config.mesh))
  spec = resolver.resolve(config, mesh=mesh, memory_limit_bytes=limit_bytes, open_data=False)
  assert isinstance(spec.accum_steps, int)
  steps = run.build_steps(spec, mesh)
  compiled = steps.compile_train_step()
  batch = jax.device_put(train_fixtures.fixed_batch(16, image_size=16), steps.batch_sharding)
  new_state, metrics = compiled(steps.init_state(), batch)  # the chosen step runs
  assert np.isfinite(float(metrics["train/loss"])) and int(new_state.step) == 1
  return step_cost.peak_bytes(compiled)


def test_auto_chooses_the_fewest_micro_batches_that_fit(auto_config):
  peaks = {a: _peak(a) for a in (1, 2, 4)}
  assert peaks[1] > peaks[2] > peaks[4]
  # A pretended device whose budget (limit less the headroom) fits 4 micro-batches, not 2.
  budget = (peaks[2] + peaks[4]) // 2
  limit = int(budget / (1 - memory_fit.HEADROOM)) + 1
  assert _fit(auto_config, limit) == peaks[4]


def test_auto_without_a_known_limit_uses_one_micro_batch(auto_config):
  assert _fit(auto_config, None) == _peak(1)


def test_auto_fails_clearly_when_nothing_fits(auto_config):
  with pytest.raises(ValueError, match="no train step for batch=16 fits"):
    _fit(auto_config, 1000)


def test_an_int_is_left_as_it_is():
  config = _config(2)
  mesh = sharding.make_mesh(tuple(config.mesh))
  spec = resolver.resolve(config, mesh=mesh, open_data=False)
  assert spec.accum_steps == 2 and dataclasses.replace(spec).accum_steps == 2
