"""Axial-ViT (paper Appendix D.6): one block against an independent numpy version, the
variants, the options it refuses, its FLOPs against XLA's, the quickstart trained with a
tiny one, its sharding and a plan for a TPU slice."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.markers import needs_libtpu
from vit_jax.infra import errors, sharding
from vit_jax.models import create_model, get_model_config, model_settings
from vit_jax.models.vit import AxialEncoderBlock
from vit_jax.run import step_cost


def _layer_norm(x, p):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-6) * p["scale"] + p["bias"]


def _attention(seq, p, heads):
  """Softmax attention of one sequence [S, D] with the official q/k/v/out layout."""
  q, k, v = (np.einsum("sd,dhk->hsk", seq, p[n]["kernel"]) + p[n]["bias"][:, None] for n in "qkv")
  logits = np.einsum("hqk,hsk->hqs", q, k) / np.sqrt(q.shape[-1])
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum("hqs,hsk,hkd->qd", weights, v, p["o"]["kernel"]) + p["o"]["bias"]


def _mlp(x, p):
  h = x @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"]
  h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))  # tanh GELU
  return h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"]


def _half(seq, p, heads):
  """x + MSA(LN(x)), then x + MLP(LN(x)) on one row or column [S, D]."""
  a = p["MultiHeadDotProductAttention_1"]
  attention = {"q": a["query"], "k": a["key"], "v": a["value"], "o": a["out"]}
  seq = seq + _attention(_layer_norm(seq, p["LayerNorm_0"]), attention, heads)
  return seq + _mlp(_layer_norm(seq, p["LayerNorm_2"]), p["MlpBlock_3"])


def _numpy_axial_block(x, p, grid_hw, heads):
  """Every row of the grid through the row block, then every column through the column
  block, one sequence at a time."""
  b, _, d = x.shape
  grid = x.reshape(b, *grid_hw, d).copy()
  for i in range(b):
    for r in range(grid_hw[0]):
      grid[i, r] = _half(grid[i, r], p["row"], heads)
    for c in range(grid_hw[1]):
      grid[i, :, c] = _half(grid[i, :, c], p["column"], heads)
  return grid.reshape(b, -1, d)


def test_one_block_is_the_papers_row_then_column_block():
  grid_hw = (3, 4)
  config = get_model_config("testing")  # width 8, MLP 16, 2 heads, tanh GELU
  config.hidden_size = 8
  config.transformer.update(mlp_dim=16, num_heads=2)
  block = AxialEncoderBlock(model_settings(config), grid_hw=grid_hw)
  x = jax.random.normal(jax.random.key(0), (2, 12, 8))
  params = nn.unbox(block.init(jax.random.key(1), x, True)["params"])
  assert set(params) == {"row", "column"}
  # Perturb the LayerNorms' and biases' initial values so that every parameter shows.
  params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(2), p.shape), params)
  got, _ = block.apply({"params": params}, x, True)
  as_numpy = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  want = _numpy_axial_block(np.asarray(x, np.float64), as_numpy, grid_hw, 2)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  # Rows and columns are not interchangeable: the transposed order differs.
  swapped = {"row": as_numpy["column"], "column": as_numpy["row"]}
  other = _numpy_axial_block(np.asarray(x, np.float64), swapped, grid_hw, 2)
  assert np.abs(other - want).max() > 1e-2


def _tiny_axial(**changes):
  config = get_model_config("testing")
  config.update({"axial": True, "classifier": "gap", **changes})
  return config


def test_the_variants_and_the_options_it_refuses():
  for name, patch in (("Axial-ViT-B_32", 32), ("Axial-ViT-B_16", 16)):
    config = get_model_config(name)
    assert config.axial and config.classifier == "gap" and config.patches.size == (patch, patch)
    assert config.hidden_size == 768 and config.transformer.num_layers == 12
    # The activation bound: two block inputs per block, the ViT's one (with remat).
    vit = get_model_config(f"ViT-B_{patch}-gap-norep")
    vit.remat = config.remat = True
    bounds = [step_cost.vit_activation_bytes(c, 224, 8) for c in (config, vit)]
    assert bounds[0] == 2 * bounds[1]
  for changes in (dict(classifier="token"), dict(num_registers=2), dict(class_token=True)):
    with pytest.raises(errors.ConfigError, match="config.model.axial=True.*no prefix tokens"):
      create_model(_tiny_axial(**changes), num_classes=3)


def test_layouts_dtypes_and_relative_positions_give_the_same_model():
  images = jax.random.uniform(jax.random.key(3), (2, 16, 12, 3), minval=-1, maxval=1)
  for posemb in ("learn", "relative"):
    config = _tiny_axial(posemb=posemb)
    model = create_model(config, num_classes=5)
    params = nn.unbox(model.init(jax.random.key(0), images)["params"])
    want = model.apply({"params": params}, images)
    from vit_jax.weights import npz  # pylint: disable=g-import-not-at-top

    scanned = npz.to_layout(params, scanned=True)
    for execution in (dict(scan=True), dict(scan=True, remat=True, dtype=jnp.bfloat16)):
      other = create_model(config, num_classes=5, **execution)
      atol = 0.1 if "dtype" in execution else 1e-5
      np.testing.assert_allclose(other.apply({"params": scanned}, images), want, atol=atol)
  # A 4x3 grid: the row tables hold 2 x 3 - 1 offsets, the column tables 2 x 4 - 1.
  block = params["Transformer"]["encoderblock_0"]
  assert block["row"]["MultiHeadDotProductAttention_1"]["relative_embedding"].shape == (5, 2, 16)
  assert block["column"]["MultiHeadDotProductAttention_1"]["relative_embedding"].shape[0] == 7


def test_every_parameter_has_logical_axes_the_rules_shard():
  model = create_model(get_model_config("Axial-ViT-B_32"), num_classes=10, scan=True)
  boxed = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 64, 64, 3)))["params"]
  specs = nn.get_partition_spec(boxed)
  kernel = specs["Transformer"]["encoderblock"]["row"]["MlpBlock_3"]["Dense_0"]["kernel"]
  assert tuple(kernel) == (sharding.LAYERS, sharding.EMBED, sharding.MLP)
  for leaf in jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned)):
    assert isinstance(leaf, nn.Partitioned), leaf


@pytest.mark.parametrize(
  "changes",
  [dict(axial=True, classifier="gap"), dict(axial=True, classifier="gap", posemb="relative")]
  + [dict(posemb="relative")],  # relative position embeddings in the plain ViT
)
def test_the_analytic_count_matches_xla(changes):
  config = get_model_config("testing")
  config.update(dict(hidden_size=64, **changes))
  config.transformer.mlp_dim, config.transformer.num_heads = 256, 4
  model = create_model(config, num_classes=10)
  images = jnp.zeros((2, 32, 32, 3))
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), images))["params"]
  forward = lambda p, x: model.apply({"params": p}, x).sum()
  compiled = jax.jit(forward).lower(params, images).compile()
  analytic = step_cost.vit_flops_per_image(config, 32, 10, train=False)
  # XLA also counts the elementwise work (softmax, LayerNorm, GELU): a little more.
  assert 1.0 <= step_cost.compiled_flops(compiled) / 2 / analytic < 1.25
  assert step_cost.vit_flops_per_image(config, 32, 10, train=True) == 3 * analytic
  config.update(dict(axial=False, classifier="token", posemb="learn"))
  assert analytic > step_cost.vit_flops_per_image(config, 32, 10, train=False)  # the plain ViT


# A TPU compile of minutes: the slow tier (the planner's paths: tests/test_plan.py).
@pytest.mark.slow
@needs_libtpu
def test_plan_compiles_an_axial_vit_for_a_tpu_slice():
  from configs import pretrain  # pylint: disable=g-import-not-at-top
  from vit_jax.plan import planner, topology  # pylint: disable=g-import-not-at-top

  config = pretrain.get_config("b16,imagenet21k")  # Adam, batch 4096 -> shrunk below
  config.model = _tiny_axial(hidden_size=256)
  config.model.transformer.mlp_dim, config.model.transformer.num_heads = 1024, 4
  config.num_classes, config.pp.crop, config.batch, config.batch_eval = 10, 32, 64, 64
  plan = planner.make_plan(config, topology.parse("v5e:2x2"))
  assert plan.fits and plan.flops_source == "xla"
  assert plan.step_flops == pytest.approx(plan.model_flops_per_image * plan.batch, rel=0.1)
