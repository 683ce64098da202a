"""`vit_jax.plan`: TPU slices by name and their compile-only devices, HLO collectives."""

from __future__ import annotations

import importlib.util

import pytest

from vit_jax.plan import hlo, topology

needs_libtpu = pytest.mark.skipif(
  importlib.util.find_spec("libtpu") is None,
  reason='libtpu is not installed (pip install -e ".[tpu]"): nothing compiles for a TPU',
)


@pytest.mark.parametrize(
  "name, grid, chips, devices, processes, kind",
  [
    ("v3-8", "v3:2x2", 4, 8, 1, "TPU v3"),
    ("v3-256", "v3:8x16", 128, 256, 32, "TPU v3"),
    ("v3:8x16", "v3:8x16", 128, 256, 32, "TPU v3"),
    ("v2-32", "v2:4x4", 16, 32, 4, "TPU v2"),
    ("v4-32", "v4:2x2x4", 16, 16, 4, "TPU v4"),
    ("v4-128", "v4:4x4x4", 64, 64, 16, "TPU v4"),
    ("v5litepod-16", "v5e:4x4", 16, 16, 4, "TPU v5 lite"),
    ("v5e-8", "v5e:2x4", 8, 8, 1, "TPU v5 lite"),
    ("v5p-128", "v5p:4x4x4", 64, 64, 16, "TPU v5"),
    ("v6e-64", "v6e:8x8", 64, 64, 16, "TPU v6 lite"),
  ],
)
def test_topology_names(name, grid, chips, devices, processes, kind):
  slice_ = topology.parse(name)
  assert (slice_.libtpu_name, slice_.chips, slice_.num_devices) == (grid, chips, devices)
  assert (slice_.num_processes, slice_.chip.device_kind) == (processes, kind)


@needs_libtpu
@pytest.mark.parametrize("name", ["v3:2x2", "v5e:2x2", "v4-8", "v3-256"])
def test_topology_devices_are_libtpus(name):
  slice_ = topology.parse(name)
  devices = slice_.devices()
  assert len(devices) == slice_.num_devices
  assert {d.device_kind for d in devices} == {slice_.chip.device_kind}
  assert len({d.process_index for d in devices}) == slice_.num_processes


@pytest.mark.parametrize("name", ["v7-8", "v3-12", "v3-7", "v4:2x2", "tpu", "v5e:0x4"])
def test_unknown_topology_lists_the_valid_forms(name):
  with pytest.raises(topology.errors.UserError, match="Valid forms: a Cloud name"):
    topology.parse(name)


# Hand-written XLA:TPU-style HLO: a loop of 3 iterations whose body all-gathers a bf16
# weight (split over a start and a done fusion sharing channel 8) and reduce-scatters
# its f32 gradient; then one all-reduce of 1000 f32 over 4 devices.
_MESH_GROUPS = "replica_groups=mesh['axis_0'=4,'axis_1'=1] {'axis_0'}"
_HLO = "\n".join(
  [
    "%all-reduce-scatter.1 (input.2: f32[256,256]) -> f32[64,256] {",
    "  %all-reduce.4 = f32[256,256]{1,0} all-reduce(%input.2), channel_id=6, "
    "replica_groups={{0,1,2,3}}, to_apply=%add",
    "  ROOT %dynamic-slice.33 = f32[64,256]{1,0} dynamic-slice(%all-reduce.4, %a, %b)",
    "}",
    "%gather_start (p: bf16[1,64,256]) -> (bf16[1,64,256], bf16[1,256,256]) {",
    "  %all-gather.19 = bf16[1,256,256]{2,1,0} all-gather(%p), channel_id=8, "
    + _MESH_GROUPS
    + ", dimensions={1}",
    "  ROOT %t = (bf16[1,64,256], bf16[1,256,256]) tuple(%p, %all-gather.19)",
    "}",
    "%gather_done (p: bf16[1,64,256]) -> bf16[1,256,256] {",
    "  ROOT %all-gather.23 = bf16[1,256,256]{2,1,0} all-gather(%p), channel_id=8, "
    + _MESH_GROUPS
    + ", dimensions={1}",
    "}",
    "%body (w: (s32[], f32[256,256])) -> (s32[], f32[256,256]) {",
    "  %f1 = (bf16[1,64,256], bf16[1,256,256]) fusion(%x), kind=kCustom, calls=%gather_start",
    "  %f2 = bf16[1,256,256]{2,1,0} fusion(%f1), kind=kCustom, calls=%gather_done",
    "  %f3 = f32[64,256]{1,0} fusion(%g), kind=kCustom, calls=%all-reduce-scatter.1",
    "  ROOT %r = (s32[], f32[256,256]) tuple(%i, %g)",
    "}",
    "%cond (w: (s32[], f32[256,256])) -> pred[] {",
    "  %constant.55 = s32[]{:T(128)} constant(3)",
    "  %i = s32[] get-tuple-element(%w), index=0",
    "  ROOT %lt = pred[] compare(%i, %constant.55), direction=LT",
    "}",
    "ENTRY %main (x: f32[1000]) -> f32[1000] {",
    "  %while.30 = (s32[], f32[256,256]) while(%t0), condition=%cond, body=%body",
    "  ROOT %all-reduce.9 = f32[1000]{0} all-reduce(%x), channel_id=9, "
    "replica_groups=[1,4]<=[4], to_apply=%add",
    "}",
  ]
)


def test_hlo_collectives_counts_loops_channels_and_reduce_scatter():
  totals = hlo.totals(_HLO, num_devices=4)
  assert totals.runs == {
    "all-reduce": 1,
    "all-gather": 3,
    "reduce-scatter": 3,
    "all-to-all": 0,
    "collective-permute": 0,
  }
  assert totals.bytes["all-gather"] == 3 * 256 * 256 * 2
  assert totals.bytes["reduce-scatter"] == 3 * 256 * 256 * 4
  assert totals.bytes["all-reduce"] == 4000
  assert totals.traffic_bytes["all-reduce"] == pytest.approx(2 * 0.75 * 4000)
  assert totals.traffic_bytes["all-gather"] == pytest.approx(0.75 * 3 * 256 * 256 * 2)
  assert totals.unknown_trip_counts == 0
