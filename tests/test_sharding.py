"""vit_jax.infra.sharding: the mesh, the logical rules, state shardings (also on 8 fake devices)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from tests import fresh_python
from vit_jax.infra import sharding
from vit_jax.models import create_model, get_model_config

# ----------------------------------------------------------------------------- mesh


def test_make_mesh_single_device():
  for axes in ({"data": -1, "model": 1}, (("data", -1), ("model", 1)), [("data", 1)]):
    mesh = sharding.make_mesh(axes)
    assert mesh.devices.size == 1
    assert all(t == AxisType.Auto for t in mesh.axis_types)
  mesh = sharding.make_mesh({"data": -1, "model": 1})
  assert dict(mesh.shape) == {"data": 1, "model": 1}
  assert sharding.replicated(mesh).spec == P()
  assert sharding.batch_sharding(mesh).spec == P("data")


@pytest.mark.parametrize(
  "axes,match",
  [
    ({"data": 2, "model": 1}, r"multiply to 2 but there are 1 devices"),
    ({"data": -1, "model": 3}, r"multiply to 3.*1 devices"),
    ({"data": -1, "model": -1}, r"at most one -1"),
    ({"data": 0}, r"positive"),
    ([("data", 1), ("data", 1)], r"repeat a name"),
  ],
)
def test_make_mesh_errors(axes, match):
  with pytest.raises(ValueError, match=match):
    sharding.make_mesh(axes)


def test_batch_sharding_needs_a_data_axis():
  with pytest.raises(ValueError, match=r"'data' axis"):
    sharding.batch_sharding(sharding.make_mesh({"batch": 1}))


# ----------------------------------------------------------------------------- rules


def test_rules_per_strategy():
  assert sharding.STRATEGIES == ("data_parallel", "fsdp", "tensor_parallel")
  dp, fsdp, tp = (dict(sharding.logical_rules(s)) for s in sharding.STRATEGIES)
  names = {"layers", "embed", "mlp", "heads", "kv"}
  assert set(dp) == set(fsdp) == set(tp) == names
  assert set(dp.values()) == {None}
  assert fsdp["embed"] == "data" and fsdp["layers"] is None
  assert tp["heads"] == tp["mlp"] == "model"
  assert tp["embed"] is tp["kv"] is tp["layers"] is None
  # As flax applies them (a mesh axis at most once per array; earlier rules win):
  fsdp_rules, tp_rules = sharding.logical_rules("fsdp"), sharding.logical_rules("tensor_parallel")
  assert nn.logical_to_mesh_axes(("layers", "mlp", "embed"), fsdp_rules) == P(None, None, "data")
  assert nn.logical_to_mesh_axes(("mlp",), fsdp_rules) == P("data")
  assert nn.logical_to_mesh_axes(("embed", "heads", "kv"), tp_rules) == P(None, "model", None)
  assert nn.logical_to_mesh_axes(("heads", "kv", "embed"), tp_rules) == P("model", None, None)


def test_model_parameters_carry_only_the_rules_names():
  """A logical name the rules lack would leave its dimension whole without a word."""
  used = set()
  for overrides in ({}, {"scan": True}):  # scanned: the stacked layers carry LAYERS
    model = create_model(get_model_config("testing"), num_classes=10, **overrides)
    boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 3)))
    for leaf in jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned)):
      assert isinstance(leaf, nn.LogicallyPartitioned), leaf
      used.update(name for name in leaf.names if name is not None)
  assert used == {name for name, _ in sharding.logical_rules("fsdp")}


def test_unknown_strategy():
  with pytest.raises(ValueError, match=r"'zero3'.*data_parallel.*fsdp.*tensor_parallel"):
    sharding.logical_rules("zero3")


def _init_fn(model, tx):
  def init(rng):
    params = model.init({"params": rng}, jnp.zeros((1, 8, 8, 3)))["params"]
    return {
      "params": params,
      "opt_state": tx.init(params),
      "step": jnp.zeros((), jnp.int32),
      "rng": rng,
    }

  return init


def test_state_shardings_single_device_mesh():
  model = create_model(get_model_config("testing"), num_classes=10)
  init = _init_fn(model, optax.adamw(1e-3))
  abstract = jax.eval_shape(init, jax.random.PRNGKey(0))
  mesh = sharding.make_mesh({"data": -1, "model": 1})
  for strategy in sharding.STRATEGIES:
    shardings = sharding.state_shardings(abstract, mesh, strategy)
    assert jax.tree.structure(shardings) == jax.tree.structure(nn.unbox(abstract))
  state = jax.jit(lambda r: nn.unbox(init(r)), out_shardings=shardings)(jax.random.PRNGKey(0))
  kernel = state["params"]["Transformer"]["encoderblock_0"]["MlpBlock_3"]["Dense_0"]["kernel"]
  assert kernel.sharding.spec == P(None, "model")  # tensor_parallel, last in the loop
  assert state["step"].sharding.spec == P()


def test_missing_mesh_axis_is_replicated_and_logged_once(caplog):
  model = create_model(get_model_config("testing"), num_classes=10)
  abstract = jax.eval_shape(_init_fn(model, optax.sgd(0.1, momentum=0.9)), jax.random.PRNGKey(0))
  mesh = sharding.make_mesh({"data": -1})  # no 'model' axis for tensor_parallel
  with caplog.at_level("WARNING"):
    shardings = sharding.state_shardings(abstract, mesh, "tensor_parallel")
  assert {s.spec for s in jax.tree.leaves(shardings)} == {P()}
  records = [r for r in caplog.records if "left whole" in r.getMessage()]
  assert len(records) == 1
  assert "no mesh axis ['model']" in records[0].getMessage()


# ----------------------------------------------------------------------------- 8 devices

_EIGHT_DEVICES = """
import json
import flax.linen as nn, jax, jax.numpy as jnp, optax
from configs import common
from vit_jax.infra import sharding
from vit_jax.run import optim
from vit_jax.models import create_model, get_model_config

def specs(tree):
  return {jax.tree_util.keystr(p): str(tuple(s.spec)) for p, s in
          jax.tree_util.tree_flatten_with_path(tree)[0]}

out = {"device_count": jax.device_count()}
# name: (strategy, mesh axes, model overrides, whether to also jit the init)
cases = {
    "fsdp": ("fsdp", {"data": 8, "model": 1}, {}, True),
    "fsdp_2d": ("fsdp", {"data": 4, "model": 2}, {}, False),
    "tensor_parallel": ("tensor_parallel", {"data": 4, "model": 2}, {}, True),
    # Scanned, and 3 heads on a 'model' axis of 2: the heads dimension must stay whole.
    "tensor_parallel_3heads": ("tensor_parallel", {"data": 4, "model": 2},
                               {"hidden_size": 24, "num_heads": 3, "scan": True}, True),
    "data_parallel": ("data_parallel", {"data": -1, "model": 1}, {}, False),
}
for name, (strategy, axes, overrides, run_jit) in cases.items():
  model_config = get_model_config("testing")
  heads = overrides.pop("num_heads", None)
  if heads:
    model_config.transformer.num_heads = heads
  model_config.update(overrides)
  model = create_model(model_config, num_classes=10)
  # The optimizer as train.py builds it: clip -> Adam -> masked decay -> lr; state[1] is Adam.
  config = common.get_config()
  config.optim.update(name="adamw", weight_decay=1e-4, grad_clip_norm=1.0)
  tx, _ = optim.make_optimizer(optim.OptimizerSettings.from_config(config))
  def init(rng):
    params = model.init({"params": rng}, jnp.zeros((1, 8, 8, 3)))["params"]
    return {"params": params, "opt_state": tx.init(params),
            "step": jnp.zeros((), jnp.int32), "rng": rng}
  mesh = sharding.make_mesh(axes)
  abstract = jax.eval_shape(init, jax.random.PRNGKey(0))
  shardings = sharding.state_shardings(abstract, mesh, strategy)
  out[name] = {
      "mesh": dict(mesh.shape),
      "wanted": specs(shardings),
      "mu_equals_params": specs(shardings["opt_state"][1].mu) == specs(shardings["params"]),
  }
  if run_jit:
    state = jax.jit(lambda r: nn.unbox(init(r)), out_shardings=shardings)(
        jax.random.PRNGKey(0))
    out[name]["actual"] = specs(jax.tree.map(lambda x: x.sharding, state))
    out[name]["shard_shapes"] = {
        jax.tree_util.keystr(p): list(x.addressable_shards[0].data.shape)
        for p, x in jax.tree_util.tree_flatten_with_path(state)[0]}
mesh = sharding.make_mesh({"data": -1, "model": 2})
batch = jax.device_put(jnp.zeros((16, 8, 8, 3)), sharding.batch_sharding(mesh))
out["batch_shard"] = list(batch.addressable_shards[0].data.shape)
out["mesh_-1"] = dict(mesh.shape)
try:
  sharding.make_mesh({"data": 3, "model": -1})
except ValueError as e:
  out["mesh_error"] = str(e)
print(json.dumps(out))
"""

_MLP0 = "['params']['Transformer']['encoderblock_0']['MlpBlock_3']['Dense_0']['kernel']"
_MLP1 = "['params']['Transformer']['encoderblock_0']['MlpBlock_3']['Dense_1']['kernel']"
_ATT = "['params']['Transformer']['encoderblock_0']['MultiHeadDotProductAttention_1']"


@pytest.fixture(scope="module")
def eight():
  env = fresh_python.clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=8")
  return fresh_python.run_json(_EIGHT_DEVICES, env, timeout=240)


def test_eight_device_mesh(eight):
  assert eight["device_count"] == 8
  assert eight["mesh_-1"] == {"data": 4, "model": 2}
  assert eight["batch_shard"] == [4, 8, 8, 3]
  assert "multiply to 3" in eight["mesh_error"] and "8 devices" in eight["mesh_error"]


@pytest.mark.parametrize(
  "case", ["fsdp", "fsdp_2d", "tensor_parallel", "tensor_parallel_3heads", "data_parallel"]
)
def test_state_shardings_and_jit(eight, case):
  result = eight[case]
  if "actual" in result:  # jax.jit(init, out_shardings=...) produced exactly these
    assert result["actual"] == result["wanted"]
  assert result["mu_equals_params"]  # the Adam moments are sharded like the parameters
  # Plain leaves (step, rng, optax counts) are replicated.
  for path, spec in result["wanted"].items():
    if "count" in path or path in ("['step']", "['rng']"):
      assert spec == "()", path


def test_fsdp_shards_every_kernel_over_data(eight):
  for case, n in (("fsdp", 8), ("fsdp_2d", 4)):
    wanted = eight[case]["wanted"]
    kernels = [p for p in wanted if p.startswith("['params']") and p.endswith("['kernel']")]
    assert kernels
    for path in kernels:
      assert "'data'" in wanted[path] and "'model'" not in wanted[path], (path, wanted[path])
    assert wanted[_MLP0] == "('data',)"  # [D, M]: the width D is split
    assert wanted[_ATT + "['out']['kernel']"] == "(None, None, 'data')"
    assert wanted["['params']['cls']"] == "(None, None, 'data')"
    assert wanted["['params']['head']['kernel']"] == "('data',)"  # [D, K]: the width D is split
  shapes = eight["fsdp"]["shard_shapes"]
  assert shapes[_MLP0] == [32 // 8, 64] and shapes[_MLP1] == [64, 32 // 8]


def test_tensor_parallel_megatron_layout(eight):
  wanted, shapes = eight["tensor_parallel"]["wanted"], eight["tensor_parallel"]["shard_shapes"]
  for proj in ("query", "key", "value"):  # [D, H, Dh]: heads split
    assert wanted[f"{_ATT}['{proj}']['kernel']"] == "(None, 'model')"
    assert shapes[f"{_ATT}['{proj}']['kernel']"] == [32, 1, 16]
  assert wanted[f"{_ATT}['out']['kernel']"] == "('model',)"  # [H, Dh, D]
  assert wanted[_MLP0] == "(None, 'model')"  # [D, M]
  assert wanted[_MLP1] == "('model',)"  # [M, D]
  assert shapes[_MLP1] == [32, 32]
  for path, spec in wanted.items():  # nothing is split over 'data'
    assert "'data'" not in spec, path


def test_non_divisible_dimension_falls_back_to_replicated(eight):
  wanted = eight["tensor_parallel_3heads"]["wanted"]
  block = "['params']['Transformer']['encoderblock']"  # scanned: [L, ...]
  att = f"{block}['MultiHeadDotProductAttention_1']"
  assert wanted[f"{att}['query']['kernel']"] == "()"  # 3 heads over 2 devices: whole
  assert wanted[f"{att}['out']['kernel']"] == "()"
  assert wanted[f"{block}['MlpBlock_3']['Dense_0']['kernel']"] == "(None, None, 'model')"
  assert wanted[f"{block}['MlpBlock_3']['Dense_1']['kernel']"] == "(None, 'model')"
  shapes = eight["tensor_parallel_3heads"]["shard_shapes"]
  assert shapes[f"{block}['MlpBlock_3']['Dense_0']['kernel']"] == [2, 24, 32]


def test_data_parallel_replicates_everything(eight):
  assert set(eight["data_parallel"]["wanted"].values()) == {"()"}
