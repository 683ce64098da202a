"""Weights from where they live now: timm and Hugging Face checkpoints (written here with
random weights by timm and transformers themselves), `hf-hub:` through a pre-filled cache,
official names through the package's table, `vit_jax.convert`, and refused pickles.

Checked: our import gives the source library's logits; `config.pretrained` fine-tunes from
each source with a new head at another resolution; convert -> .npz equals the import bit
for bit; `hf-hub:` works offline from the cache and fails with one line on an empty one.
"""

from __future__ import annotations

import functools
import importlib.resources
import importlib.util
import logging
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
from flax import traverse_util

from configs import vit
from tests import fresh_python, train_fixtures
from tests import interop_fixtures as fx
from vit_jax import models, weights
from vit_jax.infra import errors
from vit_jax.weights import hub, npz
from vit_jax.weights import sources as weight_sources

sys.modules.setdefault("triton", None)  # see tests/test_export.py: triton beside TensorFlow
torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")


# name -> (timm architecture, tiny keyword arguments, image size). The hybrids keep timm's
# ResNet stages (R50 (3, 4, 9), R26 (2, 2, 2, 2), root only) under a 1-layer encoder.
TIMM_MODELS = {
  "vit": ("vit_tiny_patch16_224", dict(depth=2), 32),
  "vit_gap_tanh": (
    "vit_tiny_patch16_224",
    dict(depth=1, class_token=False, global_pool="avg", fc_norm=False, act_layer="gelu_tanh"),
    32,
  ),
  "r50": ("vit_base_r50_s16_224", dict(depth=1, embed_dim=64, num_heads=2), 32),
  "r26": ("vit_small_r26_s32_224", dict(depth=1), 64),
  "r_ti": ("vit_tiny_r_s16_p8_224", dict(depth=1), 64),
}
SOURCES = [f"timm_{n}" for n in TIMM_MODELS] + ["hf_vit"]


def _randomise(model) -> None:
  """Norm scales and biases away from 1 and 0 (timm zero-inits some), so each array counts,
  and dense kernels 5x their init (std 0.1): MLP inputs of order 1, where the two GELUs
  differ measurably."""
  gen = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for p in model.parameters():
      if p.ndim == 1:
        p.add_(0.1 * torch.randn(p.shape, generator=gen))
      elif p.ndim == 2:
        p.mul_(5.0)


@functools.lru_cache(maxsize=None)
def _source(name: str, root: str):
  """(checkpoint folder, torch model, image size, source's GELU is tanh) written once."""
  torch.manual_seed(0)
  directory = os.path.join(root, name)
  if name == "hf_vit":
    # 1e-6: the official epsilon; google/vit-* configs say 1e-12 (tests/test_vit_family.py)
    model = fx.hf_vit_classifier(layer_norm_eps=1e-6, num_labels=fx.NUM_CLASSES)
    _randomise(model)
    model.save_pretrained(directory)
    return directory, model, 32, False
  arch, kwargs, size = TIMM_MODELS[name.removeprefix("timm_")]
  model = timm.create_model(
    arch, pretrained=False, img_size=size, num_classes=fx.NUM_CLASSES, **kwargs
  ).eval()
  _randomise(model)
  timm.models.save_for_hf(model, directory, safe_serialization=True)  # the hub's layout
  return directory, model, size, kwargs.get("act_layer") == "gelu_tanh"


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("sources"))
  return lambda name: _source(name, root)


_theirs, _ours = fx.torch_logits, fx.our_logits


def _flat(tree) -> dict[str, np.ndarray]:
  return traverse_util.flatten_dict(npz.scanned_to_layers(tree), sep="/")


@pytest.mark.parametrize("name", SOURCES)
def test_import_gives_the_source_librarys_logits(sources, name):
  directory, model, size, tanh = sources(name)
  loaded = weight_sources.load(directory)
  assert loaded.image_size == (size, size) and loaded.num_classes == fx.NUM_CLASSES
  assert loaded.config.gelu_approximate is tanh  # the source's GELU, recorded
  images = fx.images(2, size)
  want = _theirs(model, images)
  assert fx.relative_error(_ours(loaded, images), want) <= fx.TOLERANCE
  if name in ("timm_vit", "timm_vit_gap_tanh", "hf_vit"):  # a wrong GELU would be seen
    other = _ours(loaded, images, gelu_approximate=not tanh)
    assert fx.relative_error(other, want) > 5 * fx.TOLERANCE
  # The bare .safetensors file reads the same (its config.json beside it).
  weights = weight_sources.load(os.path.join(directory, "model.safetensors"))
  for key, value in _flat(loaded.params).items():
    np.testing.assert_array_equal(_flat(weights.params)[key], value, err_msg=key)


@pytest.mark.parametrize("name", SOURCES)
def test_convert_writes_the_import_bit_for_bit(sources, name, tmp_path):
  from vit_jax import convert  # pylint: disable=g-import-not-at-top

  directory = sources(name)[0]
  imported = _flat(weight_sources.load(directory).params)
  for scanned in (False, True):
    out = tmp_path / f"scanned_{scanned}.npz"
    convert.convert(directory, str(out), scanned=scanned)
    stored = npz.load_npz(out)
    assert npz.is_scanned(stored) is scanned
    stored = _flat(stored)
    assert stored.keys() == imported.keys()
    for key, value in imported.items():
      np.testing.assert_array_equal(stored[key], value, err_msg=key)


def _finetune_config(loaded: weight_sources.LoadedModel, source: str, digits_dir: str, crop: int):
  config = vit.get_config("ti16,digits")  # the fine-tuning recipe (SGD), shrunk
  config.model = models.to_config(loaded.config)
  config.model.gelu_approximate = True  # the official training's (a note is logged)
  config.data_dir = digits_dir
  config.pp.crop = crop
  config.pretrained = source
  config.batch, config.batch_eval, config.shuffle_buffer = 8, 32, 64
  config.test_split = "test[:32]"
  config.total_steps, config.lr.warmup_steps = 2, 1
  config.log_every, config.eval_every, config.checkpoint_every = 1, 100, 100
  return config


# name -> the fine-tuning resolution (a bigger grid of the same patches). The R26 and R50
# runs compile a deep ResNet: about 2 minutes each on the development CPU.
FINETUNE = {"timm_vit": 48, "hf_vit": 48, "timm_r_ti": 64, "timm_r26": 96, "timm_r50": 48}
_SLOW = pytest.mark.slow


@pytest.mark.parametrize(
  "name", [pytest.param(n, marks=_SLOW) if n in ("timm_r26", "timm_r50") else n for n in FINETUNE]
)
def test_config_pretrained_finetunes_from_each_source(
  sources, name, digits_dir, tmp_path, monkeypatch, caplog
):
  directory, _, size, _ = sources(name)
  loaded = weight_sources.load(directory)
  crop = FINETUNE[name]
  config = _finetune_config(loaded, directory, digits_dir, crop)
  weights.check_source(config.pretrained, fetch=True)

  adapted = {}
  real_load = weights.load_pretrained

  def spy(*args, **kwargs):
    adapted.update(_flat(real_load(*args, **kwargs)))
    return traverse_util.unflatten_dict(dict(adapted), sep="/")

  monkeypatch.setattr(weights, "load_pretrained", spy)
  with caplog.at_level(logging.INFO, logger="absl"):  # absl verbosity may be WARNING here
    _, losses = train_fixtures.fit_and_learn(config)
  # The sources compute the exact GELU, the fine-tuned model the official tanh: said once.
  assert "the checkpoint's library computes the exact (erf) GELU, the model the tanh" in (
    caplog.text
  )

  imported = _flat(loaded.params)
  assert adapted["head/kernel"].shape[-1] == 10 and not adapted["head/kernel"].any()
  posemb = "Transformer/posembed_input/pos_embedding"
  stride = size // int(np.sqrt(imported[posemb].shape[1] - ("cls" in imported)))
  grid = (crop // stride) ** 2
  assert adapted[posemb].shape == (1, grid + ("cls" in imported), imported[posemb].shape[-1])
  for key, value in imported.items():
    if not key.startswith("head/") and key != posemb:
      np.testing.assert_array_equal(adapted[key], value, err_msg=key)
  assert losses[-1] < losses[0], losses


def _fill_hf_cache(hf_home: str, repo: str, directory: str) -> None:
  """The cache layout huggingface_hub reads: refs/main -> snapshots/<commit>/<files>."""
  commit = "0123456789abcdef0123456789abcdef01234567"
  root = os.path.join(hf_home, "hub", "models--" + repo.replace("/", "--"))
  os.makedirs(os.path.join(root, "refs"))
  with open(os.path.join(root, "refs", "main"), "w") as f:
    f.write(commit)
  shutil.copytree(directory, os.path.join(root, "snapshots", commit))


def test_hf_hub_reads_the_offline_cache_and_names_the_fix_when_empty(sources, tmp_path):
  directory = sources("timm_r_ti")[0]
  hf_home = str(tmp_path / "hf_home")
  _fill_hf_cache(hf_home, "someone/tiny-vit", directory)
  env = fresh_python.clean_env(HF_HOME=hf_home, HF_HUB_OFFLINE="1")

  def convert(source: str, out: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "vit_jax.convert", source, f"--out={out}"]
    return subprocess.run(
      command, cwd=fresh_python.REPO, env=env, capture_output=True, text=True, timeout=300
    )

  done = convert("hf-hub:someone/tiny-vit", str(tmp_path / "cached.npz"))
  assert done.returncode == 0, done.stderr[-3000:]
  stored, imported = (
    _flat(npz.load_npz(tmp_path / "cached.npz")),
    _flat(weight_sources.load(directory).params),
  )
  for key, value in imported.items():
    np.testing.assert_array_equal(stored[key], value, err_msg=key)

  failed = convert("hf-hub:someone/absent@v1", str(tmp_path / "absent.npz"))
  assert failed.returncode == 2 and not (tmp_path / "absent.npz").exists()
  message = failed.stderr.strip().splitlines()[-1]  # one line (vit_jax.cli)
  assert message.startswith("Error: hf-hub:someone/absent: not in the Hugging Face cache")
  assert os.path.join(hf_home, "hub") in message and "HF_HUB_OFFLINE" in message
  assert "hf download someone/absent --revision v1" in message
  assert "huggingface-cli download" in message


def _hub_names_script():
  path = os.path.join(fresh_python.REPO, "tools", "hub_names.py")
  spec = importlib.util.spec_from_file_location("hub_names", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_name_table_resolves_every_official_name_timm_lists(monkeypatch):
  listed = set(_hub_names_script().official_names())
  assert len(listed) >= 40
  for name, repo, classes in listed:
    copy = hub.official_copy(name)
    assert (copy.repo, copy.num_classes) == (repo, classes), name
    assert hub.official_copy(f"gs://vit_models/{name}.npz") == copy
  header = importlib.resources.files("vit_jax.weights").joinpath(hub.TABLE).read_text()
  assert f"timm {timm.__version__}" in header.splitlines()[1]

  # Short names: the ImageNet-21k pre-training file where several folders have one.
  assert hub.official_copy("ViT-B_16").repo == "timm/vit_base_patch16_224.orig_in21k"
  assert hub.official_copy("R50+ViT-B_16").repo == "timm/vit_base_r50_s16_224.orig_in21k"
  stem = "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0"
  assert hub.official_copy(stem).repo == "timm/vit_base_patch16_224.augreg_in21k"

  fetched = []
  monkeypatch.setattr(hub, "download", lambda repo, revision=None: fetched.append(repo) or "/x")
  assert hub.resolve("imagenet21k+imagenet2012/ViT-B_16") == "/x"
  assert fetched == ["timm/vit_base_patch16_384.orig_in21k_ft_in1k"]
  with pytest.raises(errors.MissingError, match=r"'ViT-B_8': no hub copy.*augreg/B_8-i21k"):
    hub.resolve("ViT-B_8")
  assert hub.resolve("/no/such/ViT-B_8.npz") == "/no/such/ViT-B_8.npz"  # a path stays a path

  # A plan (fetch=False) checks hub names in config.pretrained without touching the network.
  for source in ("hf-hub:org/name", "ViT-B_16", "gs://vit_models/imagenet21k/ViT-B_16.npz"):
    weights.check_source(source, fetch=False)
  with pytest.raises(errors.MissingError, match="no hub copy"):
    weights.check_source("ViT-B_8", fetch=False)


def test_pickles_are_refused_unread(sources, tmp_path, monkeypatch):
  directory, model, _, _ = sources("timm_vit")
  torch.save(model.state_dict(), tmp_path / "model.bin")
  pickled = tmp_path / "pickled"
  pickled.mkdir()
  shutil.copy(os.path.join(directory, "config.json"), pickled / "config.json")
  torch.save(model.state_dict(), pickled / "pytorch_model.bin")

  def unpickling(*args, **kwargs):
    raise AssertionError("a pickle was opened")

  for module, attr in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")):
    monkeypatch.setattr(module, attr, unpickling)
  with pytest.raises(errors.CheckpointError, match=r"model\.bin' is a pickle.*safetensors"):
    weight_sources.load(str(tmp_path / "model.bin"))
  with pytest.raises(errors.CheckpointError, match=r"pytorch_model\.bin is not read"):
    weight_sources.load(str(pickled))
  with pytest.raises(errors.CheckpointError, match="is a pickle"):
    weight_sources.read_params(str(tmp_path / "model.bin"))
