"""The Python face (`vit_jax.load`, `vit_jax.create`, `vit_jax.Model`) used as a user
writes it, against timm's own output on a tiny timm folder made here (timm's
`vit_tiny_patch16_224` class at width 32, depth 2, 32x32 inputs)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import shutil

import jax
import numpy as np
import optax
import pytest

import vit_jax
from tests import fresh_python, interop_fixtures
from vit_jax import models
from vit_jax.api import analysis
from vit_jax.infra import errors
from vit_jax.weights import load_pretrained
from vit_jax.weights.timm import create as timm_create

timm = pytest.importorskip("timm")
torch = pytest.importorskip("torch")

TINY_ARGS = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
LABELS = ["ant", "bee", "cat", "dog", "eel"]


@pytest.fixture(scope="module")
def timm_folder(tmp_path_factory):
  """(timm model, folder with its model.safetensors and config.json, 4 model inputs)."""
  net = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=5, **TINY_ARGS)
  interop_fixtures.perturb_torch(net)
  net.eval()
  folder = tmp_path_factory.mktemp("timm_tiny")
  timm.models.save_for_hf(
    net,
    str(folder),
    safe_serialization=True,
    model_args=TINY_ARGS,
    model_config={"label_names": LABELS},
  )
  return net, str(folder), interop_fixtures.images(4, 32)


@pytest.fixture(scope="module")
def model(timm_folder):
  return vit_jax.load(timm_folder[1])


def _torch(x: np.ndarray):
  return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


def test_load_and_classify_a_timm_folder(timm_folder, model):
  net, _, x = timm_folder
  assert model.class_names == LABELS and model.image_size == (32, 32)
  want = interop_fixtures.torch_logits(net, x)
  assert interop_fixtures.relative_error(model(x), want) < 1e-5
  image = np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8)
  (top,) = model.predict(image, top_k=3)
  probs = np.asarray(jax.nn.softmax(model(model.prepare(image)), axis=-1))[0]
  assert [name for name, _ in top] == [LABELS[i] for i in np.argsort(-probs)[:3]]
  assert [p for _, p in top] == pytest.approx(sorted(probs)[::-1][:3], rel=1e-6)


def test_prepare_takes_paths_bytes_and_arrays_alike(model, tmp_path):
  from PIL import Image

  image = np.random.default_rng(1).integers(0, 256, (24, 24, 3), dtype=np.uint8)
  path = tmp_path / "x.png"
  Image.fromarray(image).save(path)
  prepared = [model.prepare(v) for v in (str(path), path.read_bytes(), Image.open(path), image)]
  assert prepared[0].shape == (1, 32, 32, 3) and prepared[0].dtype == np.float32
  for other in prepared[1:]:
    np.testing.assert_array_equal(other, prepared[0])


def test_features_are_timms_pre_logits_and_tokens(timm_folder, model):
  net, _, x = timm_folder
  with torch.no_grad():
    tokens = net.forward_features(_torch(x))
    pooled = net.forward_head(tokens, pre_logits=True).numpy()
  assert model.features(x).shape == (4, 32)
  assert interop_fixtures.relative_error(model.features(x), pooled) < 1e-5
  assert interop_fixtures.relative_error(model.forward_features(x), tokens.numpy()) < 1e-5


def _timm_attention(net, x: np.ndarray) -> np.ndarray:
  """timm's attention probabilities [L, B, H, N, N], read at each block's attn_drop."""
  maps = []
  hooks = []
  for block in net.blocks:
    block.attn.fused_attn = False  # the path that forms the probabilities
    hooks.append(block.attn.attn_drop.register_forward_hook(lambda m, i, o: maps.append(o)))
  with torch.no_grad():
    net(_torch(x))
  for hook in hooks:
    hook.remove()
  return np.stack([m.numpy() for m in maps])


def test_attention_and_rollout_are_timms(timm_folder, model):
  net, _, x = timm_folder
  want = _timm_attention(net, x)
  got = model.attention(x)
  assert got.shape == (2, 4, 2, 17, 17)
  np.testing.assert_allclose(got, want, atol=1e-6)
  rollout = model.rollout(x)  # [B, 4, 4]
  np.testing.assert_allclose(
    rollout, analysis.attention_rollout(want, num_prefix=1, grid_hw=(4, 4)), atol=1e-6
  )


def test_save_reloads_bitwise_and_exports_to_timm(timm_folder, model, tmp_path):
  net, _, x = timm_folder
  again = vit_jax.load(model.save(tmp_path / "npz"))
  assert again.config == model.config and again.class_names == LABELS
  flat = lambda m: dict(zip(*_flat(m.params)))  # noqa: E731
  assert all(np.array_equal(v, flat(model)[k]) for k, v in flat(again).items())
  np.testing.assert_array_equal(again(x), model(x))

  out = model.save(tmp_path / "timm", format="timm")
  spec = json.loads((tmp_path / "timm" / "timm_model.json").read_text())
  overlay = dict(spec["pretrained_cfg_overlay"], file=f"{out}/model.safetensors")
  back = timm.create_model(
    spec["model_name"], pretrained=True, pretrained_cfg_overlay=overlay, **spec["kwargs"]
  ).eval()
  want = interop_fixtures.torch_logits(net, x)
  assert interop_fixtures.relative_error(interop_fixtures.torch_logits(back, x), want) < 1e-5


def _flat(params) -> tuple[list[str], list[np.ndarray]]:
  from flax import traverse_util

  flat = traverse_util.flatten_dict(params, sep="/")
  return list(flat), [np.asarray(v) for v in flat.values()]


def test_with_head_and_at_resolution_fit_as_fine_tuning_does(timm_folder, model):
  _, folder, x = timm_folder
  headless = model.with_head(0)
  np.testing.assert_array_equal(headless(x), model.features(x))
  new_head = model.with_head(7)
  assert new_head(x).shape == (4, 7) and not np.any(new_head(x))  # a fresh zero head
  assert new_head.class_names is None

  bigger = model.at_resolution(48)
  assert bigger.image_size == (48, 48)
  module = models.create_model(model.config, num_classes=5)
  fresh = jax.jit(module.init)(jax.random.PRNGKey(0), np.zeros((1, 48, 48, 3), np.float32))
  want = load_pretrained(folder, fresh["params"], model.config)  # the run's fit
  got = dict(zip(*_flat(bigger.params)))
  for key, value in zip(*_flat(want)):
    np.testing.assert_array_equal(got[key], value)
  assert bigger(interop_fixtures.images(2, 48)).shape == (2, 5)


# Names whose registered options differ (registers, avg pooling, LayerScale, no class
# token, patches-only position table, pre-norm, CLIP epsilon, MAP head, QuickGELU, fc_norm).
TIMM_NAMES = [
  "vit_tiny_patch16_224",
  "vit_wee_patch16_reg1_gap_256",
  "vit_xsmall_patch16_clip_224",
  "vit_base_patch16_siglip_224",
  "vit_base_patch16_clip_quickgelu_224",
  "vit_medium_patch16_gap_256",
  # no final norm; SigLIP 2's tanh GELU; no patch bias before norm_pre; Eva names
  "vit_intern300m_patch14_448",
  "vit_so400m_patch16_siglip_256",
  "vit_base_patch16_clip_224",
  "eva02_tiny_patch14_224",
  "vit_small_patch16_dinov3",
]


@pytest.mark.parametrize("name", TIMM_NAMES)
def test_create_by_timm_name_is_timms_architecture(name, tmp_path):
  """timm builds ``name`` (depth 1: the blocks are alike), its weights are read back;
  that config, depth set back, is `create(name)`'s, and so are the arrays' shapes."""
  net = timm.create_model(name, pretrained=False, depth=1, num_classes=3)
  timm.models.save_for_hf(net, str(tmp_path), safe_serialization=True, model_args={"depth": 1})
  read = vit_jax.load(str(tmp_path))
  config, size = timm_create.config_from_name(name)
  assert size == tuple(net.pretrained_cfg["input_size"][1:])
  layers = dataclasses.replace(read.config.transformer, num_layers=config.transformer.num_layers)
  read_config = models.to_config(read.config.replace(transformer=layers, name=config.name))
  # The input mean/std are timm's pretrained_cfg (the weights'), not the architecture's:
  # a created model is fresh, with the official normalisation.
  fields = lambda c: models.to_config(models.model_settings(c)).to_dict()  # noqa: E731
  arch = lambda c: {k: v for k, v in fields(c).items() if "input_" not in k}  # noqa: E731
  assert arch(read_config) == arch(config)


def test_create_gives_a_seeded_model_of_our_names_and_timms():
  a = vit_jax.create("testing", num_classes=3, image_size=16, seed=1)
  b = vit_jax.create_model("testing", num_classes=3, image_size=16, seed=1)
  c = vit_jax.create("testing", num_classes=3, image_size=16, seed=2)
  x = interop_fixtures.images(2, 16)
  assert a(x).shape == (2, 3)
  np.testing.assert_array_equal(a.features(x), b.features(x))
  assert not np.allclose(a.features(x), c.features(x))
  tiny = vit_jax.create("vit_tiny_patch16_224", num_classes=0)
  assert tiny.image_size == (224, 224) and tiny.num_classes is None


def test_bad_input_gets_one_error_with_the_fix(model):
  with pytest.raises(errors.ConfigError, match=r"'vit_tinny_patch16_224' is neither a model"):
    vit_jax.create("vit_tinny_patch16_224")
  with pytest.raises(errors.ConfigError, match=r"model\.prepare\(images\)"):
    model(np.zeros((1, 32, 32, 3), np.uint8))
  with pytest.raises(errors.ConfigError, match="top_k=0"):
    model.predict(np.zeros((32, 32, 3), np.uint8), top_k=0)
  assert len(model.predict(np.zeros((32, 32, 3), np.uint8), top_k=9)[0]) == 5  # all there are


def test_import_vit_jax_is_cheap_and_the_face_loads_on_first_use():
  out = fresh_python.run_json(
    """
    import json, sys
    import vit_jax
    heavy = ("tensorflow", "vit_jax.api.model", "vit_jax.weights")
    before = sorted(m for m in heavy if m in sys.modules)
    face = vit_jax.load.__module__, vit_jax.from_pretrained is vit_jax.load
    try:
      vit_jax.nothing
      missing = None
    except AttributeError as e:
      missing = str(e)
    print(json.dumps({"before": before, "face": face, "missing": missing,
                      "tf": "tensorflow" in sys.modules}))
    """,
    fresh_python.clean_env(),
  )
  assert out == {
    "before": [],
    "face": ["vit_jax.api.model", True],
    "missing": "module 'vit_jax' has no attribute 'nothing'",
    "tf": False,
  }


def _readme_python_blocks() -> list[str]:
  readme = (pathlib.Path(fresh_python.REPO) / "README.md").read_text()
  section = readme.split("\n## From Python\n", 1)[1].split("\n## ", 1)[0]
  return re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)


def test_the_readme_from_python_section_runs_as_written(timm_folder, tmp_path, monkeypatch):
  """The seven tasks of the README's "From Python", executed in order on the tiny timm
  folder (as ``timm_vit``) and two images, with what each line says checked after."""
  from PIL import Image

  net, folder, _ = timm_folder
  shutil.copytree(folder, tmp_path / "timm_vit")
  rng = np.random.default_rng(2)
  for name in ("cat.jpg", "dog.png"):
    Image.fromarray(rng.integers(0, 256, (50, 40, 3), dtype=np.uint8)).save(tmp_path / name)
  monkeypatch.chdir(tmp_path)
  blocks = _readme_python_blocks()
  lengths = sorted(len(b.strip().splitlines()) for b in blocks)
  assert len(blocks) == 7 and lengths[-2] <= 5 and lengths[-1] <= 10  # the optax loop: 10
  scope: dict = {}
  exec(compile("\n".join(blocks), "README.md (From Python)", "exec"), scope)  # noqa: S102
  model, x = scope["model"], scope["x"]
  assert x.shape == (2, 32, 32, 3)
  want = interop_fixtures.torch_logits(net, x)
  assert interop_fixtures.relative_error(scope["logits"], want) < 1e-5
  assert scope["features"].shape == (2, 32) and scope["tokens"].shape == (2, 17, 32)
  assert scope["tuned"].num_classes == 4 and (tmp_path / "tuned_run" / "checkpoints").is_dir()
  loss = lambda m: optax.softmax_cross_entropy_with_integer_labels(m(x), scope["y"]).mean()  # noqa: E731
  assert float(loss(scope["trained"])) < float(loss(model))  # the README's own optax loop
  np.testing.assert_array_equal(scope["again"](x), model(x))
  spec = json.loads((tmp_path / "my_vit_timm" / "timm_model.json").read_text())
  assert spec["kwargs"]["img_size"] == [64, 64]
  assert scope["maps"].shape == (2, 4, 4) and scope["overlay"].shape == (32, 32)


def test_a_mixer_runs_saves_and_reloads_through_the_same_face(tmp_path):
  config = models.get_model_config("Mixer-B_16")
  config.hidden_dim, config.num_blocks, config.patches.size = 16, 1, (8, 8)
  config.tokens_mlp_dim, config.channels_mlp_dim = 8, 32
  mixer = vit_jax.create(config, num_classes=3, image_size=16)
  x = interop_fixtures.images(2, 16)
  assert mixer(x).shape == (2, 3) and mixer.features(x).shape == (2, 16)
  np.testing.assert_array_equal(vit_jax.load(mixer.save(tmp_path / "m"))(x), mixer(x))
  assert mixer.with_head(5)(x).shape == (2, 5)
  with pytest.raises(errors.ConfigError, match=r"features\(pool=False\) needs a plain or hybrid"):
    mixer.features(x, pool=False)
