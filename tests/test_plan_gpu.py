"""`vit_jax.plan` for NVIDIA GPUs: node names, target descriptions, the padded cuDNN
attention, and tiny runs planned for compile-only H100s (needs JAX's CUDA plugin, the
`gpu-plan` extra; the cuDNN compile also needs the cuDNN wheel)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import fresh_python, test_plan
from vit_jax import run as run_lib
from vit_jax.infra import hardware, platforms, sharding
from vit_jax.models import attention, create_model, execution, get_model_config
from vit_jax.plan import cli, gpu_topology, gpus, planner, topology

needs_cuda_plugin = pytest.mark.skipif(
  not any(map(platforms.installed, platforms.CUDA_PLUGINS)),
  reason='JAX\'s CUDA plugin is not installed (pip install -e ".[gpu-plan]"): nothing '
  "compiles for a GPU",
)
needs_cudnn = pytest.mark.skipif(
  not platforms.installed("nvidia.cudnn"),
  reason="the cuDNN wheel (nvidia-cudnn-cu13) is not installed: cuDNN attention cannot compile",
)


@pytest.mark.parametrize(
  "name, slice_name, devices, processes, kind",
  [
    ("h100x8", "1x1x8", 8, 1, "NVIDIA H100 80GB HBM3"),
    ("H100x8x4", "1x4x8", 32, 4, "NVIDIA H100 80GB HBM3"),
    ("h200x8", "1x1x8", 8, 1, "NVIDIA H200"),
    ("a100x4x2", "1x2x4", 8, 2, "NVIDIA A100-SXM4-80GB"),
    ("h100x1", "1x1x1", 1, 1, "NVIDIA H100 80GB HBM3"),
  ],
)
def test_gpu_names(name, slice_name, devices, processes, kind):
  nodes = topology.parse(name)
  assert isinstance(nodes, gpu_topology.GpuTopology)
  assert (nodes.slice_name, nodes.num_devices, nodes.num_processes) == (
    slice_name,
    devices,
    processes,
  )
  assert nodes.chip.device_kind == kind


@pytest.mark.parametrize("name", ["h100x9", "h100x0", "a100x8x0"])
def test_impossible_gpu_nodes_list_the_valid_forms(name):
  with pytest.raises(topology.errors.UserError, match="Valid forms: a GPU node"):
    topology.parse(name)


def test_an_unknown_gpu_lists_the_gpu_forms_too():
  with pytest.raises(topology.errors.UserError, match="h100x8, h200x8, a100x8"):
    topology.parse("b200x8")


def _field(text: str, name: str) -> str:
  (value,) = re.findall(rf"^\s*{name}: \"?([^\"\n]*)\"?$", text, re.M)
  return value


@pytest.mark.parametrize("name", list(hardware.GPUS))
def test_target_descriptions_agree_with_the_gpu_table(name):
  gpu = hardware.GPUS[name]
  text = gpus.target_config(gpu)
  assert _field(text, "device_description_str") == gpu.device_kind
  assert int(_field(text, "device_memory_size")) == gpu.hbm_bytes
  assert int(_field(text, "memory_bandwidth")) == pytest.approx(gpu.hbm_bytes_per_s, rel=1e-3)
  assert _field(text, "platform_name") == "CUDA"


def test_memory_jax_may_use_follows_its_variable(monkeypatch):
  nodes = topology.parse("h100x8")
  monkeypatch.delenv(gpu_topology.MEM_FRACTION_VARIABLE, raising=False)
  # Unset: the share the commands give JAX (they set the variable to it when unset).
  assert nodes.device_memory_bytes == pytest.approx(0.9 * hardware.GPUS["h100"].hbm_bytes)
  monkeypatch.setenv(gpu_topology.MEM_FRACTION_VARIABLE, ".75")
  assert nodes.device_memory_bytes == pytest.approx(0.75 * hardware.GPUS["h100"].hbm_bytes)
  monkeypatch.setenv(gpu_topology.MEM_FRACTION_VARIABLE, "most")
  with pytest.raises(topology.errors.ConfigError, match="XLA_PYTHON_CLIENT_MEM_FRACTION"):
    nodes.device_memory_bytes


def test_commands_give_jax_ninety_percent_of_each_gpu_unless_told(monkeypatch):
  """The share the plan budgets with is the one every command sets before JAX starts."""
  from vit_jax import cli as commands  # pylint: disable=g-import-not-at-top

  seen = []

  def command(parsed):
    seen.append(os.environ.get(gpu_topology.MEM_FRACTION_VARIABLE))

  monkeypatch.delenv(gpu_topology.MEM_FRACTION_VARIABLE, raising=False)
  assert commands.run_command([], lambda argv: None, command) == 0
  monkeypatch.setenv(gpu_topology.MEM_FRACTION_VARIABLE, "0.6")
  assert commands.run_command([], lambda argv: None, command) == 0
  assert seen == [str(gpu_topology.DEFAULT_MEM_FRACTION), "0.6"]


@pytest.mark.parametrize("multiple", [2, 8, 64])
def test_padded_attention_is_the_attention(multiple):
  """197 tokens padded (keys masked by length, padded queries dropped): the same values
  and gradients as the unpadded attention, on the CPU with XLA's implementation."""
  q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, 2, 197, 4, 16))  # [B, N, H, Dh]
  cotangent = jax.random.normal(jax.random.PRNGKey(1), (2, 197, 4, 16))

  def loss(attention, q, k, v):
    return jnp.sum(attention(q, k, v) * cotangent)

  plain = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="xla")
  padded = lambda q, k, v: attention.padded_dot_product_attention(q, k, v, "xla", multiple)
  np.testing.assert_allclose(jax.jit(padded)(q, k, v), plain(q, k, v), rtol=1e-5, atol=1e-6)
  gradients = jax.jit(jax.grad(loss, argnums=(1, 2, 3)), static_argnums=0)
  want, got = gradients(plain, q, k, v), gradients(padded, q, k, v)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_model_with_padded_attention_computes_the_einsum_model(monkeypatch):
  """A ViT whose fused attention is padded to 8 (here XLA's, standing in for cuDNN's on
  the CPU) gives the loss and gradients of the default einsum attention."""
  monkeypatch.setitem(attention.SEQUENCE_MULTIPLE, "xla", 8)
  config = get_model_config("testing")
  images = jax.random.normal(jax.random.PRNGKey(0), (2, 16, 16, 3))  # 4x4 patches: 17 tokens
  einsum, padded = (
    create_model(config, num_classes=5, attention_impl=a) for a in (execution.EINSUM, "xla")
  )
  params = jax.jit(lambda x: einsum.init(jax.random.PRNGKey(1), x, train=False))(images)

  @jax.jit
  def losses_and_gradients(params, images):
    return [
      jax.value_and_grad(lambda p: jnp.sum(m.apply(p, images, train=False) ** 2))(params)
      for m in (padded, einsum)
    ]

  got, want = losses_and_gradients(params, images)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


@needs_cuda_plugin
def test_gpu_devices_come_from_the_plugin():
  nodes = topology.parse("h100x4x2")
  devices = nodes.devices()
  assert len(devices) == 8 and {d.device_kind for d in devices} == {"NVIDIA H100 80GB HBM3"}
  assert sorted({d.process_index for d in devices}) == [0, 1]
  mesh = sharding.make_mesh((("data", -1), ("model", 4)), devices=devices)
  # A 'model' group of 4 lies on one node: the mesh keeps nodes together.
  for row in mesh.devices:
    assert len({d.process_index for d in row}) == 1


@needs_cuda_plugin
@pytest.mark.parametrize("name", ["h100x8", "h100x4x2"])
def test_gpu_plan_of_a_data_parallel_step(name):
  plan = planner.make_plan(test_plan.tiny_config(), topology.parse(name))
  assert plan.fits and plan.flops_source == "analytic" and plan.devices == 8
  assert plan.step_flops == pytest.approx(plan.model_flops_per_image * plan.batch)
  assert plan.hbm_bytes == pytest.approx(topology.parse(name).device_memory_bytes)
  # Data parallel: the gradients are all-reduced, one per parameter, in the compute dtype
  # (the GPU's default, bfloat16: half the f32 parameters' bytes).
  assert plan.dtype == "bfloat16"
  half = plan.params_bytes / 2
  assert plan.train.collectives.bytes["all-reduce"] == pytest.approx(half, rel=0.02)
  assert plan.train.xla_bytes_accessed > plan.params_bytes  # XLA's traffic, run on the CPU
  t = plan.time
  assert t.bound_s > 0 and 0 < t.mfu <= 1 and t.hbm_s > 0
  if plan.processes == 1:  # 8 GPUs on NVLink
    assert t.network_s == 0 and t.ici_s > 0
  else:  # the all-reduce over both nodes crosses the network, 18x slower than NVLink
    assert t.ici_s == 0 and t.network_s > 0
  text = planner.format_plan(plan)
  assert "NVLink" in text and "memory JAX may use" in text


def _parameter_bytes(config) -> int:
  """Bytes of the model's f32 parameters, unsharded."""
  model = create_model(config.model, num_classes=config.num_classes)
  crop = config.pp.crop
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, crop, crop, 3)))
  return sum(leaf.size * 4 for leaf in jax.tree.leaves(shapes))


@needs_cuda_plugin
@pytest.mark.parametrize(
  "changes, split",
  [
    (dict(partitioning="fsdp"), 8),  # parameters split over the 8 'data' devices
    # Heads and MLP units over 'model' pairs, bf16, every block rematerialized.
    (
      dict(
        partitioning="tensor_parallel",
        mesh=(("data", -1), ("model", 2)),
        model__dtype="bfloat16",
        model__remat=True,
      ),
      2,
    ),
  ],
)
def test_gpu_plans_of_sharded_steps(changes, split):
  """The README's GPU settings compile for 8 H100s: FSDP, and tensor parallelism with
  bf16 and remat; each device holds its share of the parameters."""
  config = test_plan.tiny_config(**changes)
  plan = planner.make_plan(config, topology.parse("h100x8"))
  assert plan.fits and plan.time.bound_s > 0
  whole = _parameter_bytes(config)
  if split == 8:  # FSDP: every large kernel split; the parameters gathered in the step
    assert plan.params_bytes == pytest.approx(whole / split, rel=0.05)
    assert plan.train.collectives.runs["all-gather"] > 0
  else:  # the encoder's kernels split; embeddings, norms and head replicated
    assert whole / split < plan.params_bytes < 0.8 * whole
    assert plan.mesh == {"data": 4, "model": 2} and plan.remat and plan.dtype == "bfloat16"


@needs_cuda_plugin
def test_a_gpu_step_that_cannot_fit_exits_2_naming_the_shortfall(capsys):
  status = cli.main(
    [
      *test_plan.TINY_PRETRAINING_COMMAND,
      "--topology=h100x8",
      # A 30M-class head: 29 GiB of parameters, four times that with Adam and gradients.
      "--config.num_classes=30000000",
    ]
  )
  err = capsys.readouterr().err
  assert status == 2
  assert err.startswith("Error: the train step needs ") and err.count("\n") == 1
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION" in err and "config.partitioning=fsdp" in err


@needs_cuda_plugin
@needs_cudnn
def test_cudnn_attention_trains_at_197_tokens_on_a_compile_only_h100():
  """ViT-B/16's sequence (224 / 16 = 14x14 patches and the class token), bf16, cuDNN's
  fused attention forward and backward in the compiled train step."""
  config = test_plan.tiny_config(
    pp__crop=224,
    batch=8,
    batch_eval=8,
    model__attention_impl="cudnn",
    model__dtype="bfloat16",
    model__transformer__num_heads=4,
  )
  config.model.patches.size = (16, 16)
  nodes = topology.parse("h100x8")
  mesh = sharding.make_mesh(tuple(config.mesh), devices=nodes.devices())
  hbm = int(nodes.device_memory_bytes)
  spec = run_lib.resolve(config, mesh=mesh, memory_limit_bytes=hbm, open_data=False)
  steps = run_lib.build_steps(spec, mesh)
  compiled = steps.train_step.lower(steps.abstract_state, steps.abstract_train_batch()).compile(
    compiler_options=gpu_topology.COMPILER_OPTIONS
  )
  text = compiled.as_text()
  assert "__cudnn$fmhaSoftmax" in text and "__cudnn$fmhaSoftmaxBackward" in text
  assert "bf16[1,198,4,64]" in text  # [B, N, H, Dh] per device: 197 tokens padded to 198


@needs_cuda_plugin
@pytest.mark.parametrize("choose_cpu", [False, True])
def test_commands_start_on_the_cpu_without_the_plugins_error(choose_cpu):
  """With the plugin installed (libtpu hidden) and no GPU, JAX alone logs the plugin's
  failed CUDA check, a traceback; `platforms.quiet_start` chooses the CPU first, as the
  commands do, and nothing is logged."""
  env = fresh_python.clean_env(CUDA_VISIBLE_DEVICES="")
  del env["JAX_PLATFORMS"]
  code = (
    "import sys; sys.modules['libtpu'] = None\n"  # a host without libtpu
    + ("from vit_jax.infra import platforms; platforms.quiet_start()\n" if choose_cpu else "")
    + "import jax; print(jax.devices())"
  )
  proc = subprocess.run(
    [sys.executable, "-c", code], cwd=fresh_python.REPO, env=env, capture_output=True, text=True
  )
  assert proc.returncode == 0 and proc.stdout.strip() == "[CpuDevice(id=0)]"
  if choose_cpu:
    assert proc.stderr == ""
  else:
    assert "Jax plugin configuration error" in proc.stderr


def test_suggest_shows_the_budget_of_a_larger_allocator_share(monkeypatch):
  """--suggest on GPUs: the step measured against 95% of the GPU (no compile), then the
  compiled levers (stubbed here: each variant's plan is refused)."""
  nodes = topology.parse("h100x8")
  gib = 2**30
  step = types.SimpleNamespace(needed_bytes=73 * gib)  # over 0.9 x 79.14 = 71.23
  plan = types.SimpleNamespace(
    partitioning="data_parallel",
    remat=False,
    dtype="float32",
    mesh={"data": 8, "model": 1},
    accum_steps=1,
    batch=64,
    train=step,
    eval=types.SimpleNamespace(needed_bytes=gib),
  )
  tried = []

  def refuse(config, target):
    tried.append(config)
    raise topology.errors.ConfigError("refused")

  monkeypatch.setattr(planner, "make_plan", refuse)
  lines = cli.suggestions(test_plan.tiny_config(), nodes, plan)
  # 0.95 x 79.14 GiB = 75.19 GiB: 73 GiB fits.
  assert lines[0] == "  XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 (environment): budget 75.19 GiB, fits"
  assert lines[1] == "  config.model.dtype=bfloat16: refused"
  assert tried[0].model.dtype == "bfloat16" and len(lines) == len(tried) + 1


@needs_cuda_plugin
@needs_cudnn
def test_the_plan_says_and_compiles_the_gpus_choice_for_an_unset_config(capsys):
  """The pre-training recipe leaves the attention and dtype unset: on H100s the plan
  compiles it with cuDNN's attention in bfloat16, and says so first."""
  assert cli.main([*test_plan.TINY_PRETRAINING_COMMAND, "--topology=h100x8"]) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0] == (
    "Execution on GPU: attention cudnn (unset: the GPU's fastest measured), compute bfloat16 "
    "with float32 parameters (unset: the GPU's fastest measured)."
  )
  assert "dtype=bfloat16" in out[2]
