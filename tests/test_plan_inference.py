"""`vit_jax.plan.inference`: the largest batch by extrapolating compiled memory (with a fake
compiler), and a tiny ViT's forward pass compiled for one TPUv3 core (needs libtpu)."""

from __future__ import annotations

import pytest

from tests.markers import needs_libtpu
from vit_jax.infra import hardware
from vit_jax.models import get_model_config
from vit_jax.plan import inference, topology
from vit_jax.run import memory_fit

BUDGET = 1000.0


def _fake_compiler(bytes_at):
  """A compile_at whose memory is ``bytes_at(batch)``; records the batches compiled."""
  calls: list[int] = []

  def compile_at(batch: int) -> inference.Compiled:
    calls.append(batch)
    need = bytes_at(batch)
    return inference.Compiled(batch, need, need <= BUDGET, 1e-3 * batch)

  return compile_at, calls


def test_linear_memory_is_found_in_one_confirming_compile():
  compile_at, calls = _fake_compiler(lambda b: 100 + 6 * b)  # fits up to (1000-100)/6 = 150
  found = inference.largest_batch(compile_at, BUDGET)
  assert calls == [*inference.PROBE_BATCHES, 150]
  assert max(c.batch for c in found if c.fits) == 150


def test_a_miss_corrects_the_line_with_the_newest_compiles():
  # Superlinear: the probes' line overshoots; the corrected line lands under the budget.
  compile_at, calls = _fake_compiler(lambda b: 100 + 5 * b + 0.01 * b * b)
  found = inference.largest_batch(compile_at, BUDGET)
  fitting = max(c.batch for c in found if c.fits)
  assert len(calls) <= len(inference.PROBE_BATCHES) + inference.MAX_CONFIRMATIONS
  assert not next(c for c in found if c.batch == calls[2]).fits  # the first guess missed
  assert 100 + 5 * fitting + 0.01 * fitting**2 <= BUDGET
  assert 100 + 5 * (fitting + 8) + 0.01 * (fitting + 8) ** 2 > BUDGET  # and lands close


def test_nothing_fits():
  compile_at, calls = _fake_compiler(lambda b: 2 * BUDGET)
  found = inference.largest_batch(compile_at, BUDGET)
  assert calls == list(inference.PROBE_BATCHES) and not any(c.fits for c in found)


@needs_libtpu
def test_a_tiny_vit_on_one_v3_core():
  slice_ = topology.parse("v3-2")
  topology.prepare_environment(slice_)
  config = get_model_config("testing")
  v3 = hardware.CHIPS["v3"]
  point = inference.inference_point(config, 32, v3, slice_.devices()[0])
  budget = v3.per_device(v3.hbm_bytes) * (1 - memory_fit.HEADROOM)
  fitting = [c for c in point.compiles if c.fits]
  assert point.largest_batch == max(c.batch for c in fitting) > max(inference.PROBE_BATCHES)
  # The extrapolated batch fills the budget to within a few percent: memory ~ linear.
  largest = next(c for c in fitting if c.batch == point.largest_batch)
  assert 0.9 * budget < largest.bytes_needed <= budget
  small, large = point.compiles[0], point.compiles[1]
  assert small.bytes_needed < large.bytes_needed
  assert point.images_per_s == pytest.approx(max(c.batch / c.bound_s for c in fitting), rel=1e-12)
