"""`vit_jax.plan` of the 2026 families and of image-text runs: a tiny rotary ViT (DINOv3's
options) and a tiny LiT (two towers, the chunked sigmoid loss, a locked image tower)
planned for v5e:2x2; each figure the plan prints is checked against XLA's analyses of the
compiled step (needs libtpu, the `tpu` extra)."""

from __future__ import annotations

import jax
import pytest

from configs import lit
from tests.markers import needs_libtpu
from tests.test_plan import tiny_config
from vit_jax import models
from vit_jax.data import randaug
from vit_jax.infra import hardware
from vit_jax.models import image_text
from vit_jax.plan import hlo, loop_cost, planner, report, topology

SLICE = "v5e:2x2"  # 4 chips, one device each
WIDTH = 256  # wide enough that matrix products are all but the whole FLOP count


def _rotary_config():
  """The pre-training recipe on a 1-layer DINOv3 (RoPE, registers, LayerScale) with the
  SwiGLU of its S+ and H+ sizes at 32x32 (at this width XLA counts the exact GELU's erf
  polynomial as 4% more FLOPs; `tests/test_step_cost.py` checks the GELU MLP's count at
  DINOv3-L's width)."""
  config = tiny_config()
  model = models.get_model_config("DINOv3-S_16")
  model.mlp = "swiglu"
  model.hidden_size, model.transformer.mlp_dim, model.transformer.num_heads = WIDTH, 1024, 4
  model.transformer.num_layers, model.patches.size = 1, (4, 4)
  config.model = model
  return config


def _lit_config():
  """LiT on a 1-layer image tower and a 1-layer text tower, 16 tokens, 64 pairs a step."""
  config = lit.get_config("digits")
  image = models.get_model_config("testing")
  image.hidden_size, image.transformer.mlp_dim, image.transformer.num_heads = WIDTH, 1024, 4
  text = dict(width=WIDTH, depth=1, mlp_dim=1024, num_heads=4, vocab_size=1000, pool="last")
  config.model = models.two_tower_config(
    image, text=text, text_len=16, embed_dim=WIDTH, name="LiT-tiny"
  )
  config.model.bias_init = lit.BIAS_INIT
  config.pretrained = "ViT-B_16"  # required by a locked tower; a plan reads no weights
  config.num_classes, config.pp.crop, config.batch, config.batch_eval = 10, 32, 64, 64
  return config


_PLANNED: dict[str, planner.Plan] = {}


def _plan(name: str) -> planner.Plan:
  """The plan of ``PLANS[name]`` for the slice, compiled once per session."""
  if name not in _PLANNED:
    _PLANNED[name] = planner.make_plan(PLANS[name](), topology.parse(SLICE))
  return _PLANNED[name]


PLANS = {"rotary": _rotary_config, "lit": _lit_config}
V5E = hardware.CHIPS["v5e"]


def _check_bound(plan: planner.Plan, hbm_bytes: float):
  """The bound is max(FLOPs / peak, HBM bytes / bandwidth, ring traffic / ICI) per device."""
  t, n = plan.time, plan.devices
  peak = V5E.peak_flops_for(plan.dtype)
  assert t.compute_s == pytest.approx(plan.step_flops / n / peak, rel=1e-12)
  assert t.hbm_s == pytest.approx(hbm_bytes / V5E.per_device(V5E.hbm_bytes_per_s), rel=1e-12)
  ici = sum(plan.train.collectives.traffic_bytes.values())
  assert t.ici_s == pytest.approx(2 * ici / V5E.per_device(V5E.ici_bytes_per_s), rel=1e-12)
  assert t.bound_s == max(t.compute_s, t.hbm_s, t.ici_s)
  mfu = plan.model_flops_per_image * plan.batch / (t.bound_s * n * peak)
  assert t.mfu == pytest.approx(mfu, rel=1e-12)


def _check_memory(plan: planner.Plan):
  """The printed totals are XLA's memory analysis, and "fits" is that against 90% of HBM."""
  for m in (plan.train, plan.eval):
    mem = m.memory
    assert mem.total == mem.arguments + mem.outputs - mem.aliased + mem.temporaries + mem.code
    assert m.needed_bytes == mem.total
  assert plan.budget_bytes == 0.9 * V5E.per_device(V5E.hbm_bytes)
  assert plan.fits == (max(plan.train.needed_bytes, plan.eval.needed_bytes) <= plan.budget_bytes)
  printed = next(line for line in planner.format_plan(plan).splitlines() if "  total" in line)
  assert printed.split() == ["total", *report.gib(plan.train.memory.total).split()] + [
    *report.gib(plan.eval.memory.total).split()
  ]


@needs_libtpu
@pytest.mark.slow  # a TPU compile of minutes (the planner's paths: tests/test_plan.py)
def test_a_rotary_vit_plan_is_xlas_count_and_within_3_percent_of_the_analytic_one():
  plan = _plan("rotary")
  assert plan.flops_source == "xla" and not plan.train.has_loops
  assert plan.step_flops == plan.train.xla_flops * plan.devices
  analytic = plan.model_flops_per_image * plan.batch
  assert 1.0 <= plan.step_flops / analytic < 1.03
  assert f"FLOPs per step {plan.step_flops:.4g} (xla count), per image" in (
    planner.format_plan(plan)
  )
  _check_bound(plan, plan.train.xla_bytes_accessed)
  _check_memory(plan)
  # Data parallel: one all-reduce of the gradients, as many bytes as the parameters.
  assert plan.train.collectives.bytes["all-reduce"] == pytest.approx(plan.params_bytes, rel=0.02)


# XLA:TPU's ring loss, shortened: the forward scan sends bf16 texts to the next device, its
# transpose sends their f32 gradients back; JAX gives both permutes channel 1.
_RING_HLO = "\n".join(
  [
    "%cond (w: (s32[])) -> pred[] {",
    "  %constant.1 = s32[]{:T(128)} constant(3)",
    "  ROOT %lt = pred[] compare(%i, %constant.1), direction=LT",
    "}",
    "%forward (w: (s32[])) -> (s32[]) {",
    "  %collective-permute-start = (bf16[16,256]{1,0}, bf16[16,256]{1,0}, u32[]{:S(2)}, "
    "u32[]{:S(2)}) collective-permute-start(%t), channel_id=1, "
    "source_target_pairs={{0,1},{1,2},{2,3},{3,0}}",
    "  %collective-permute-done = bf16[16,256]{1,0} collective-permute-done("
    "%collective-permute-start)",
    "}",
    "%backward (w: (s32[])) -> (s32[]) {",
    "  %collective-permute-start.1 = (f32[16,256]{1,0}, f32[16,256]{1,0}, u32[]{:S(2)}, "
    "u32[]{:S(2)}) collective-permute-start(%g), channel_id=1, "
    "source_target_pairs={{1,0},{2,1},{3,2},{0,3}}",
    "}",
    "ENTRY %main (x: f32[16,256]) -> f32[16,256] {",
    "  %while.1 = (s32[]) while(%a), condition=%cond, body=%forward",
    "  %while.2 = (s32[]) while(%b), condition=%cond, body=%backward",
    "}",
  ]
)


# XLA:GPU's form of the same loops: the bound inside a fused compare, the trip count in
# the loop's backend_config.
_GPU_RING_HLO = _RING_HLO.replace("  %constant.1 = s32[]{:T(128)} constant(3)\n", "").replace(
  ", body=%forward", ', body=%forward, backend_config={"known_trip_count":{"n":"3"}}'
)


@pytest.mark.parametrize("text", [_RING_HLO, _GPU_RING_HLO], ids=["tpu", "gpu"])
def test_hlo_counts_a_ring_and_its_transpose_on_one_channel_apart(text):
  totals = hlo.totals(text, num_devices=4)
  backward_runs = 3 if text is _RING_HLO else 1  # no bound to read: counted once
  assert totals.runs["collective-permute"] == 3 + backward_runs
  assert totals.unknown_trip_counts == (backward_runs == 1)
  data = 3 * 16 * 256 * 2 + backward_runs * 16 * 256 * 4  # bf16 texts, f32 gradients
  assert totals.bytes["collective-permute"] == data  # no u32 contexts
  assert totals.traffic_bytes["collective-permute"] == totals.bytes["collective-permute"]


def _cpu_cost(fn, *shapes) -> tuple[float, float, str]:
  lowered = jax.jit(fn).lower(*[jax.ShapeDtypeStruct(s, jax.numpy.float32) for s in shapes])
  compiled = lowered.compile()
  cost = compiled.cost_analysis()
  return cost["flops"], cost["bytes accessed"], compiled.as_text()


@pytest.mark.parametrize("outer", [1, 3])
def test_loop_cost_multiplies_each_loop_body_by_its_trip_count(outer):
  """A scan of 4 products (inside a scan of ``outer``) costs what the unrolled products
  cost; XLA's own analysis counts each body once."""

  def scanned(a, b):
    inner = lambda c: jax.lax.scan(lambda x, _: (jax.numpy.tanh(x @ b), None), c, length=4)[0]
    return jax.lax.scan(lambda c, _: (inner(c), None), a, length=outer)[0]

  def unrolled(a, b):
    for _ in range(4 * outer):
      a = jax.numpy.tanh(a @ b)
    return a

  shapes = ((64, 128), (128, 128))
  flops, bytes_, text = _cpu_cost(scanned, *shapes)
  want_flops, want_bytes, _ = _cpu_cost(unrolled, *shapes)
  extra = loop_cost.loop_cost(text)
  assert (extra.loops, extra.unknown_trip_counts) == (1 + (outer > 1), 0)
  assert flops < want_flops
  assert flops + extra.extra_flops == pytest.approx(want_flops, rel=0.01)
  assert bytes_ + extra.extra_bytes >= want_bytes  # the loop's carries are read and written


def test_loop_cost_counts_randaugments_switch_at_the_mean_of_its_branches():
  """XLA counts a switch as its most expensive branch; RandAugment's (in its name scope,
  as `randaug.apply_rounds` runs it) runs one branch, drawn uniformly: the mean. A switch
  outside the scope keeps XLA's count."""
  branches = [lambda x: x + 1.0, lambda x: jax.numpy.tanh(x @ x), lambda x: x @ x @ x @ x]

  def cost(scope: str) -> tuple[float, int]:
    def looped(x, ops):
      def body(k, x):
        with jax.named_scope(scope):
          return jax.lax.switch(ops[k], branches, x)

      return jax.lax.fori_loop(0, 4, body, x)

    x, ops = jax.numpy.ones((128, 128)), jax.numpy.zeros((4,), jax.numpy.int32)
    compiled = jax.jit(looped).lower(x, ops).compile()
    extra = loop_cost.loop_cost(compiled.as_text())
    return compiled.cost_analysis()["flops"] + extra.extra_flops, extra.loops

  each = [_cpu_cost(b, (128, 128))[0] for b in branches]
  # The two programs differ only in their ops' names, which JAX's persistent compilation
  # cache leaves out of its key by default: the second would be read back as the first.
  key_option = "jax_compilation_cache_include_metadata_in_key"
  was = getattr(jax.config, key_option)
  jax.config.update(key_option, True)
  try:
    assert cost("elsewhere") == (pytest.approx(4 * max(each), rel=0.01), 1)
    assert cost(randaug.SCOPE) == (pytest.approx(4 * sum(each) / 3, rel=0.01), 1)
  finally:
    jax.config.update(key_option, was)


def _tree_bytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


# A TPU compile of minutes: the slow tier (the ring count: the HLO test above).
@pytest.mark.slow
@needs_libtpu
def test_a_lit_plan_counts_the_ring_loss_and_no_state_for_the_locked_tower():
  plan = _plan("lit")
  config = _lit_config()
  settings = models.model_settings(config.model)
  image = models.create_model(settings.image, num_classes=None)
  image_bytes = _tree_bytes(
    jax.eval_shape(image.init, jax.random.key(0), jax.numpy.zeros((1, 32, 32, 3)))
  )
  trained = plan.params_bytes - image_bytes  # the text tower, both projections, t and b
  # Adam's two moments of the trained parameters only (and its step counts).
  assert 2 * trained <= plan.opt_state_bytes < 2 * trained + 64
  assert "image tower locked (no gradient, no optimizer state)" in planner.format_plan(plan)
  # The chunked loss loops over the ring: XLA's count with the loop multiplied out, within
  # 3% of the analytic one (the image tower forward only).
  assert plan.train.has_loops and plan.flops_source == "xla, loops multiplied out"
  assert plan.step_flops == plan.train.xla_flops * plan.devices
  per_pair = image_text.flops_per_image(
    settings, 32, None, train=True, image_family=models.family_of(settings.image),
    batch=64, lock_image=True,
  )  # fmt: skip
  assert plan.model_flops_per_image == per_pair
  assert 1.0 <= plan.step_flops / (per_pair * plan.batch) < 1.03
  # Each device passes its 16 texts' embeddings [16, E] around the ring of 4, 3 times (in
  # bf16: XLA:TPU converts them for the bf16 product before sending), and their f32
  # gradients back in the backward pass.
  permutes = plan.train.collectives
  assert permutes.runs["collective-permute"] == 2 * 3
  assert permutes.bytes["collective-permute"] == 3 * 16 * WIDTH * (2 + 4)
  _check_bound(plan, plan.train.xla_bytes_accessed)
  _check_memory(plan)
