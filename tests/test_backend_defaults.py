"""The attention and compute dtype a run gets when its config leaves them unset: cuDNN and
bfloat16 on a GPU (with the einsum attention where cuDNN cannot run), the einsum attention
in float32 on a CPU or TPU, an explicit setting always kept; the resolver applies the
choice and the run's first line says it (a faked GPU backend)."""

from __future__ import annotations

import jax
import pytest

from tests import finished_run
from vit_jax import main, models, run
from vit_jax.infra import sharding
from vit_jax.models import backend_defaults, execution, get_model_config, model_settings


def vit(**changes):
  """ViT-B/16's settings (64-value heads) with ``changes`` to its config."""
  config = get_model_config("ViT-B_16")
  for key, value in changes.items():
    node, *path = key.split("__")
    target = config
    for part in path:
      target, node = target[node], part
    target[node] = value
  return model_settings(config)


@pytest.mark.parametrize(
  "platform, attention, dtype",
  [
    ("gpu", "cudnn", "bfloat16"),
    ("cuda", "cudnn", "bfloat16"),  # the plan's compile-only GPUs
    ("cpu", "einsum", "float32"),
    ("tpu", "einsum", "float32"),
  ],
)
def test_unset_attention_and_dtype_take_the_backends_choice(platform, attention, dtype):
  settings = vit()
  assert (settings.attention_impl, settings.dtype) == (execution.UNSET, execution.UNSET)
  chosen = backend_defaults.choose(settings, platform).apply(settings)
  assert (chosen.attention_impl, chosen.dtype) == (attention, dtype)
  # The model built from the choice computes in it; parameters stay float32.
  options = chosen.execution_options()
  assert options.dtype == jax.numpy.dtype(dtype) and options.param_dtype == jax.numpy.float32


@pytest.mark.parametrize(
  "changes, why",
  [
    (dict(posemb="relative"), "relative position logits"),
    (dict(transformer__attention_dropout_rate=0.1), "attention dropout"),
    (dict(dtype="float32"), "16-bit compute"),
    # 768 / 4 = 192 values per head: more than cuDNN takes.
    (dict(transformer__num_heads=4), "not 192"),
    (dict(hidden_size=120, transformer__num_heads=4), "not 30"),  # not a multiple of 8
  ],
)
def test_on_a_gpu_the_einsum_attention_where_cudnn_cannot_run(changes, why):
  choice = backend_defaults.choose(vit(**changes), "gpu")
  assert choice.attention_impl == execution.EINSUM
  assert why in choice.attention_why and "not cuDNN's" in choice.describe()


@pytest.mark.parametrize("platform", ["gpu", "cpu"])
def test_explicit_settings_always_win(platform):
  settings = vit(attention_impl="xla", dtype="float16")
  choice = backend_defaults.choose(settings, platform)
  chosen = choice.apply(settings)
  assert (chosen.attention_impl, chosen.dtype) == ("xla", "float16")
  assert "set by config.model.attention_impl" in choice.describe()
  assert "set by config.model.dtype" in choice.describe()
  # cuDNN asked for on a GPU in float32 is the user's: kept (the attention layer says).
  kept = backend_defaults.choose(vit(attention_impl="cudnn", dtype="float32"), "gpu")
  assert (kept.attention_impl, kept.dtype) == ("cudnn", "float32")


def test_a_two_tower_model_takes_the_choice_in_its_image_tower_and_a_mixer_only_a_dtype():
  image = get_model_config("ViT-B_16")
  text = dict(width=64, depth=1, mlp_dim=128, num_heads=1, vocab_size=100)
  config = models.two_tower_config(image, text=text, text_len=8, embed_dim=32)
  settings = model_settings(config)
  chosen = backend_defaults.choose(settings, "gpu").apply(settings)
  assert (chosen.image.attention_impl, chosen.dtype) == ("cudnn", "bfloat16")
  mixer = model_settings(get_model_config("Mixer-B_16"))  # its config states float32
  choice = backend_defaults.choose(mixer.replace(dtype=None), "gpu")
  assert choice.attention_impl is None and choice.dtype == "bfloat16"
  assert "attention" not in choice.describe()


def test_the_resolver_applies_the_choice_of_a_faked_gpu_backend(monkeypatch, tiny_config):
  tiny_config.num_classes = 10
  mesh = sharding.make_mesh(tuple(tiny_config.mesh))
  spec = run.resolve(tiny_config, mesh=mesh, open_data=False)
  assert (spec.model.attention_impl, spec.model.dtype) == ("einsum", "float32")
  # config.json records the dtype chosen, as runs from before the unset default recorded
  # theirs, so that such a run resumes; the attention stays unset, as it always was.
  assert spec.config_json["model"]["dtype"] == "float32"
  assert spec.config_json["model"]["attention_impl"] is None
  monkeypatch.setattr(backend_defaults, "platform", lambda devices: "gpu")
  spec = run.resolve(tiny_config, mesh=mesh, open_data=False)
  assert spec.model.dtype == "bfloat16"
  head = spec.model.hidden_size // spec.model.transformer.num_heads
  assert spec.model.attention_impl == ("cudnn" if head % 8 == 0 else "einsum")
  assert spec.config_json["model"]["dtype"] == "bfloat16"


def test_the_runs_first_line_says_the_choice(monkeypatch, caplog, tmp_path, digits_dir):
  """A faked GPU: the dtype unset (bfloat16 chosen), the attention set to 'xla' (kept), so
  that the step also runs on this CPU."""
  monkeypatch.setattr(backend_defaults, "platform", lambda devices: "gpu")
  caplog.set_level("INFO")
  argv = [
    "main",
    *finished_run.tiny_flags(digits_dir),
    "--config.total_steps=3",
    "--config.model.attention_impl=xla",
    f"--workdir={tmp_path / 'run'}",
  ]
  assert main.main(argv) == 0
  # The first line after the start-up's (which says whether jax.distributed had to start).
  run_lines = [m for m in caplog.messages if not m.startswith("initialize_distributed")]
  assert run_lines[0] == (
    "Execution on GPU: attention xla (set by config.model.attention_impl), compute bfloat16 "
    "with float32 parameters (unset: the GPU's fastest measured)."
  )
