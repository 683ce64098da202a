"""The 2026 backbones' model options in the ViT (``rope``, ``mlp``, ``qkv_bias``): every
attention path computes the same model, the shapes tell what they can, bad values are one
error, the tensor-parallel rules shard the new kernels, and the analytic FLOP count stays
within 3% of XLA's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import fresh_python
from tests import interop_fixtures as fx
from vit_jax import models
from vit_jax.infra import errors
from vit_jax.run import step_cost
from vit_jax.weights import architecture


def _config(mlp: str = "swiglu", **changes):
  """DINOv3-S/16's options (RoPE without a table, registers, LayerScale) at a tiny size,
  with q+v biases and the MLP ``mlp``."""
  config = models.get_model_config("DINOv3-S_16")
  config.hidden_size, config.transformer.num_heads, config.transformer.mlp_dim = 32, 2, 48
  config.transformer.num_layers, config.patches.size = 2, (4, 4)
  config.num_registers, config.mlp, config.qkv_bias = 2, mlp, "qv"
  config.update(changes)
  return config


@pytest.mark.parametrize(
  "mlp, changes",
  [
    ("swiglu", {}),
    ("swiglu_fused", {"rope": "eva", "rope_rotate_half": False}),
    ("mlp", {"attention_norm": True}),
    # RoPE-ViT's learned mixed frequencies (a parameter per layer), columns first, with
    # Perception Encoder's attention pooling over every token (its own heads and MLP).
    (
      "mlp",
      {
        "rope": "mixed",
        "rope_rotate_half": False,
        "rope_grid_indexing": "xy",
        "classifier": "map",
        "map_include_prefix": True,
        "map_num_heads": 4,
        "map_mlp_dim": 40,
      },
    ),
  ],
)
def test_every_path_computes_the_same_model(mlp, changes):
  config = _config(mlp, **changes)
  params = fx.random_tree(config, 3, 32)
  images = fx.images(2, 32)
  want = fx.logits(config, params, images, 3)
  for overrides in (dict(attention_impl="xla"), dict(remat=True)):
    np.testing.assert_allclose(fx.logits(config, params, images, 3, **overrides), want, atol=2e-5)
  blocks = [params["Transformer"].pop(f"encoderblock_{i}") for i in range(2)]
  scanned = dict(params, Transformer=dict(params["Transformer"]))
  scanned["Transformer"]["encoderblock"] = jax.tree_util.tree_map(lambda *a: np.stack(a), *blocks)
  got = fx.logits(config, scanned, images, 3, scan=True, remat=True)
  np.testing.assert_allclose(got, want, atol=2e-5)
  for i, b in enumerate(blocks):
    params["Transformer"][f"encoderblock_{i}"] = b
  half = fx.logits(config, params, images, 3, dtype=jnp.bfloat16)
  assert fx.relative_error(half, want) < 0.05
  # RoPE is part of the function: without it the logits move.
  unrotated = config.copy_and_resolve_references()
  unrotated.rope = None
  assert fx.relative_error(fx.logits(unrotated, params, images, 3), want) > 1e-3


def test_the_shapes_tell_the_mlp_and_the_biases():
  for mlp, bias in (("swiglu", "qv"), ("swiglu_fused", "none"), ("mlp", "all")):
    norm = mlp == "swiglu"
    config = _config(mlp, qkv_bias=bias, mlp_norm=norm, attention_norm=norm, posemb="learn")
    inferred = architecture.infer_settings(fx.random_tree(config, 3, 32))
    assert (inferred.mlp, inferred.qkv_bias, inferred.mlp_norm) == (mlp, bias, norm)
    assert inferred.attention_norm == norm
    assert inferred.transformer.mlp_dim == 48


@pytest.mark.parametrize(
  "changes, fragment",
  [
    ({"mlp": "geglu"}, "config.model.mlp='geglu'"),
    ({"mlp": "mlp", "mlp_norm": True}, "config.model.mlp_norm=True"),
    ({"qkv_bias": "k"}, "config.model.qkv_bias='k'"),
    ({"rope": "alibi"}, "config.model.rope='alibi'"),
    ({"rope": "mixed"}, "set rotate_half=False"),
    ({"rope_grid_indexing": "yx"}, "grid_indexing='yx'"),
    ({"classifier": "map", "map_num_heads": 5}, "config.model.map_num_heads=5"),
    ({"classifier": "map", "map_mlp_dim": 0}, "config.model.map_mlp_dim=0"),
    ({"fc_norm": True, "final_norm": False}, "the norm after pooling is the final norm"),
    ({"rope_ref_grid": 0}, "config.model.rope_ref_grid=0"),
    ({"posemb": "relative"}, "posemb != 'relative'"),
    ({"hidden_size": 36}, "head width divisible by 4"),
  ],
)
def test_bad_values_are_one_error_naming_them(changes, fragment):
  with pytest.raises(errors.ConfigError, match=fragment.replace("(", r"\(")):
    models.model_settings(_config(**changes))


@pytest.mark.parametrize("mlp", ["swiglu", "swiglu_fused", "mlp"])
def test_tensor_parallel_shards_the_swiglu_hidden_units_and_the_heads(mlp):
  """(The GELU MLP's case with mixed RoPE: its frequencies split by head as the queries.)"""
  block = "Transformer/encoderblock_0/"
  first = {"swiglu": "fc1_g", "swiglu_fused": "fc1", "mlp": "Dense_0"}[mlp]
  attention = f"{block}MultiHeadDotProductAttention_1/"
  sharded = {
    f"{block}MlpBlock_3/{first}/kernel": 1,
    f"{block}MlpBlock_3/{'Dense_1' if mlp == 'mlp' else 'fc2'}/kernel": 0,
    f"{attention}query/kernel": 1,
  }
  mixed = dict(rope="mixed", rope_rotate_half=False) if mlp == "mlp" else {}
  if mixed:
    sharded[f"{attention}rope_freqs"] = 1
  model = models.create_model(_config(mlp, mlp_norm=mlp == "swiglu", **mixed), num_classes=5)
  fx.check_logical_axes(model, 32, "tensor_parallel", sharded)


_PE_POOL = dict(classifier="map", map_include_prefix=True, map_num_heads=8, map_mlp_dim=512)


@pytest.mark.parametrize("mlp, changes", [("swiglu", {}), ("swiglu_fused", _PE_POOL)])
def test_analytic_flops_are_within_3_percent_of_xlas(mlp, changes):
  """SwiGLU's three products counted (the GELU MLP's count: tests/test_step_cost.py, whose
  exact GELU XLA counts as a polynomial), and Perception Encoder's attention pooling."""
  config = _config(mlp, **changes)
  config.hidden_size, config.transformer.num_heads, config.transformer.mlp_dim = 256, 4, 1024
  config.patches.size = (4, 4)
  model = models.create_model(config, num_classes=10)
  images = jnp.zeros((2, 32, 32, 3))
  params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), images))["params"]
  forward = jax.jit(lambda p, x: model.apply({"params": p}, x).sum()).lower(params, images)
  analytic = step_cost.vit_flops_per_image(models.model_settings(config), 32, 10, train=False)
  ratio = step_cost.compiled_flops(forward.compile()) / 2 / analytic
  assert 1.0 <= ratio < 1.03, ratio


_TENSOR_PARALLEL = """
import json
import jax, numpy as np
from tests import fresh_python
from tests import interop_fixtures as fx
from tests.test_rope_model import _config
from vit_jax import models
from vit_jax.infra import sharding

mesh = sharding.make_mesh({"data": 4, "model": 2})
out = {}
mixed = dict(rope="mixed", rope_rotate_half=False)
for mlp, impl, extra in (("swiglu", None, {}), ("swiglu_fused", "xla", {}), ("mlp", "xla", mixed)):
  config = _config(mlp, mlp_norm=mlp == "swiglu", attention_impl=impl, **extra)
  params = fx.random_tree(config, 3, 32)
  images = fx.images(8, 32)
  want = fx.logits(config, params, images, 3)
  model = models.create_model(config, num_classes=3)
  abstract = jax.eval_shape(model.init, jax.random.key(0), images[:1])["params"]
  placed = jax.device_put(params, sharding.state_shardings(abstract, mesh, "tensor_parallel"))
  query = placed["Transformer"]["encoderblock_0"]["MultiHeadDotProductAttention_1"]["query"]
  batch = jax.device_put(images, sharding.batch_sharding(mesh))
  got = jax.jit(lambda p, x: model.apply({"params": p}, x))(placed, batch)
  out[mlp] = {
    "error": fx.relative_error(np.asarray(got), want),
    "query_heads_per_device": query["kernel"].addressable_shards[0].data.shape[1],
  }
print(json.dumps(out))
"""


def test_tensor_parallel_heads_compute_the_same_model():
  """On 8 host devices, heads and SwiGLU hidden units split over a 'model' axis of 2: the
  rotation is per head and channel pair (mixed RoPE's learned frequencies split by head
  with the queries), so the logits are the single device's."""
  env = fresh_python.clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=8")
  result = fresh_python.run_json(_TENSOR_PARALLEL, env, timeout=240)
  for mlp in ("swiglu", "swiglu_fused", "mlp"):
    assert result[mlp]["query_heads_per_device"] == 1  # 2 heads over 'model' = 2
    assert result[mlp]["error"] < 1e-5, result
