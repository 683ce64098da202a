"""accum_steps='auto': the fewest micro-batches whose compiled step fits a pretended limit."""

import jax
import numpy as np
import pytest

from tests import train_fixtures
from vit_jax import memory_fit, sharding, step_cost, train


def test_candidates_split_the_batch_over_the_data_devices():
  assert memory_fit.accum_candidates(16, 1) == [1, 2, 4, 8, 16]
  assert memory_fit.accum_candidates(24, 2) == [1, 2, 3, 4, 6, 12]


def _config(accum_steps):
  config = train_fixtures.step_config()
  config.pp.crop = 16  # 16 tokens: activations, not parameters, dominate the memory
  config.batch = 16
  config.accum_steps = accum_steps
  return config


@pytest.fixture
def auto_config():
  return _config(memory_fit.AUTO)


def _state_and_batch(trainer):
  batch = train_fixtures.fixed_batch(16, image_size=16)
  return trainer.init_state(), jax.device_put(batch, sharding.batch_sharding(trainer.mesh))


def _peak(accum_steps):
  trainer = train.Trainer(_config(accum_steps), num_classes=10)
  return step_cost.peak_bytes(trainer.compile_train_step(*_state_and_batch(trainer)))


def _fit(config, monkeypatch, limit_bytes):
  monkeypatch.setattr(memory_fit, "device_memory_limit", lambda device: limit_bytes)
  trainer = train.Trainer(config, num_classes=10)
  state, batch = _state_and_batch(trainer)
  compiled = trainer.compile_train_step(state, batch)
  new_state, metrics = compiled(state, batch)  # the chosen step runs
  assert np.isfinite(float(metrics["train/loss"])) and int(new_state.step) == 1
  return step_cost.peak_bytes(compiled)


def test_auto_chooses_the_fewest_micro_batches_that_fit(auto_config, monkeypatch):
  peaks = {a: _peak(a) for a in (1, 2, 4)}
  assert peaks[1] > peaks[2] > peaks[4]
  # A pretended device whose budget (limit less the headroom) fits 4 micro-batches, not 2.
  budget = (peaks[2] + peaks[4]) // 2
  limit = int(budget / (1 - memory_fit.HEADROOM)) + 1
  assert _fit(auto_config, monkeypatch, limit) == peaks[4]


def test_auto_without_a_known_limit_uses_one_micro_batch(auto_config, monkeypatch):
  assert _fit(auto_config, monkeypatch, None) == _peak(1)


def test_auto_fails_clearly_when_nothing_fits(auto_config, monkeypatch):
  with pytest.raises(ValueError, match="no train step for batch=16 fits"):
    _fit(auto_config, monkeypatch, 1000)
