"""Small models with random weights, written as official `.npz` files, for the predict and
export tests: a ViT-Ti/16-shaped ViT (2 layers), an R26+ViT-S/32-shaped hybrid and a
root-only R+ViT-Ti/16 hybrid (1 layer each), all in the official layout; and what the
model-family tests share (random trees of any config, perturbed timm models, logits,
the logical-axes check)."""

from __future__ import annotations

import functools
import json
import os

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from flax import traverse_util

from vit_jax import models
from vit_jax.infra import sharding
from vit_jax.weights import npz

NUM_CLASSES = 5
TOLERANCE = 1e-5  # relative logit difference, float32, of an import or export


def vit_ti16_config() -> ml_collections.ConfigDict:
  config = models.get_model_config("ViT-Ti_16")
  config.transformer.num_layers = 2
  return config


def r26_s32_config() -> ml_collections.ConfigDict:
  config = models.get_model_config("R26+ViT-S_32")
  config.transformer.num_layers = 1
  return config


def r_ti16_config() -> ml_collections.ConfigDict:
  config = models.get_model_config("R+ViT-Ti_16")
  config.transformer.num_layers = 1
  return config


# name -> (config, image size: a 2x2 token grid)
CONFIGS = {
  "vit_ti16": (vit_ti16_config, 32),
  "r26_s32": (r26_s32_config, 64),
  "r_ti16": (r_ti16_config, 64),
}


def _config(name: str, overrides: tuple) -> ml_collections.ConfigDict:
  config = CONFIGS[name][0]()
  for key, value in overrides:
    config[key] = value
  return config


@functools.lru_cache(maxsize=None)
def _random_params(name: str, num_classes: int, seed: int, overrides: tuple) -> dict:
  # Small values: the official models' activations stay of order 1 through every layer.
  return random_tree(_config(name, overrides), num_classes, CONFIGS[name][1], seed, std=0.05)


def random_model(name: str, num_classes: int = NUM_CLASSES, seed: int = 0, **overrides):
  """(config, params, image size) of a named test model; ``overrides`` set config fields.
  The params are cached: do not change them."""
  items = tuple(sorted(overrides.items()))
  return (_config(name, items), _random_params(name, num_classes, seed, items), CONFIGS[name][1])


def write_npz(path, name: str, **overrides) -> tuple[ml_collections.ConfigDict, dict, int]:
  config, params, size = random_model(name, **overrides)
  npz.save_npz(path, params)
  return config, params, size


def images(n: int, size: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
  """max |got - want| / max |want|."""
  return float(np.max(np.abs(np.asarray(got) - want)) / np.max(np.abs(want)))


def torch_logits(model, images: np.ndarray) -> np.ndarray:
  """A timm model's or a transformers classifier's logits on NHWC ``images`` (torch is
  imported here: the rest of this module does not need it)."""
  import torch  # pylint: disable=g-import-not-at-top

  x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
  with torch.no_grad():
    hf = type(model).__module__.startswith("transformers.")
    out = model(pixel_values=x) if hf else model(x)
  return (out.logits if hasattr(out, "logits") else out).numpy()


def our_logits(loaded, images: np.ndarray, **overrides) -> np.ndarray:
  """A `weights.sources.LoadedModel`'s logits, its module built with ``overrides``."""
  module = loaded.module(**overrides)
  return np.asarray(jax.jit(lambda p, x: module.apply({"params": p}, x))(loaded.params, images))


def hf_vit_classifier(layer_norm_eps: float, num_labels: int = NUM_CLASSES):
  """A transformers `ViTForImageClassification` of width 64, 2 layers, 32x32 inputs."""
  import transformers  # pylint: disable=g-import-not-at-top

  config = transformers.ViTConfig(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=128,
    image_size=32,
    patch_size=16,
    num_labels=num_labels,
    layer_norm_eps=layer_norm_eps,
  )
  return transformers.ViTForImageClassification(config).eval()


def random_tree(config, num_classes: int, size: int, seed: int = 0, std: float = 0.2) -> dict:
  """Random parameters of any model config at ``size`` x ``size`` inputs, without running
  init (seconds for a hybrid): norm scales (the only leaves named 'scale') near 1,
  everything else N(0, std), so that each array counts."""
  model = models.create_model(config, num_classes=num_classes)
  dummy = jax.ShapeDtypeStruct((1, size, size, 3), np.float32)
  shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), dummy)["params"])
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map_with_path(
    lambda path, s: ((path[-1].key == "scale") + rng.normal(0.0, std, s.shape)).astype(np.float32),
    shapes,
  )


def logits(config, params, images: np.ndarray, num_classes: int, **overrides) -> np.ndarray:
  """The logits of ``config``'s model (built with ``overrides``) with ``params``."""
  model = models.create_model(config, num_classes=num_classes, **overrides)
  return np.asarray(jax.jit(lambda p, x: model.apply({"params": p}, x))(params, images))


def perturb_torch(net) -> None:
  """Every array of a torch model away from its init: vectors (norms, biases) plus noise,
  kernels 5x plus noise (timm's heads start at zero)."""
  import torch  # pylint: disable=g-import-not-at-top

  gen = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for p in net.parameters():
      noise = torch.randn(p.shape, generator=gen)
      p.add_(0.1 * noise) if p.ndim == 1 else p.mul_(5.0).add_(0.1 * noise)


def save_timm_hub_folder(directory, model, config: dict) -> None:
  """A timm ``model``'s state dict as `model.safetensors` beside a hub `config.json` of
  ``config`` (its ``architecture`` and whatever else the test states)."""
  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top

  state = {k: v.contiguous() for k, v in model.state_dict().items()}
  save_file(state, os.path.join(directory, "model.safetensors"))
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f)


def timm_rebuilt(spec: dict, tensors: dict):
  """timm's model of an export's ``spec`` (`timm.create_model(model_name, **kwargs)`) with
  ``tensors`` (numpy or torch) loaded strictly."""
  import timm  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  rebuilt = timm.create_model(spec["model_name"], pretrained=False, **spec["kwargs"]).eval()
  rebuilt.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()}, strict=True)
  return rebuilt


def check_logical_axes(model, size: int, strategy: str, sharded: dict[str, int]) -> None:
  """Every parameter of ``model`` has logical axis names, and under ``strategy`` dimension
  ``sharded[key]`` of each named one goes to the strategy's mesh axis."""
  dummy = np.zeros((1, size, size, 3), np.float32)
  boxed = jax.eval_shape(model.init, jax.random.key(0), dummy)["params"]
  flat = traverse_util.flatten_dict(boxed, sep="/")
  assert all(isinstance(v, nn.LogicallyPartitioned) for v in flat.values())
  rules = sharding.logical_rules(strategy)
  mesh_axis = sharding.DATA_AXIS if strategy == "fsdp" else sharding.MODEL_AXIS
  for key, dim in sharded.items():
    axes = nn.logical_to_mesh_axes(flat[key].names, rules)
    assert axes[dim] == mesh_axis, (key, axes)


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
  """uint8 [H, W, 3]: smooth gradients and edges with sensor-like noise, so that the
  interpolation kind and a one-pixel shift both show."""
  y, x = np.mgrid[0:height, 0:width].astype(np.float64)
  image = np.stack(
    [
      128 + 100 * np.sin(x / 7 + y / 13),
      128 + 100 * np.cos(x / 5) * np.sin(y / 9),
      np.where((x // 16 + y // 16) % 2 == 0, 40.0, 210.0),
    ],
    axis=-1,
  )
  noise = np.random.default_rng(seed).normal(0, 20, image.shape)
  return np.clip(image + noise, 0, 255).astype(np.uint8)


def timm_crop_folder(directory: str):
  """(directory, timm model): a tiny timm ViT (32x32 inputs, 2 layers) whose
  pretrained_cfg says crop_pct=0.9, bicubic and ImageNet mean/std, saved in the hub's
  layout (`timm.models.save_for_hf`) into ``directory``."""
  import timm  # pylint: disable=g-import-not-at-top

  net = timm.create_model(
    "vit_tiny_patch16_224",
    pretrained=False,
    num_classes=NUM_CLASSES,
    img_size=32,
    depth=2,
    pretrained_cfg_overlay=dict(
      input_size=(3, 32, 32),
      crop_pct=0.9,
      interpolation="bicubic",
      mean=(0.485, 0.456, 0.406),
      std=(0.229, 0.224, 0.225),
    ),
  ).eval()
  perturb_torch(net)
  timm.models.save_for_hf(net, directory, safe_serialization=True)
  return directory, net


def repo_tool(name: str):
  """The module of ``tools/<name>.py`` (the generators the tests hold their outputs to)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top

  path = pathlib.Path(__file__).resolve().parent.parent / "tools" / f"{name}.py"
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def assert_predict_matches_timm(loaded, model, size: int, directory) -> None:
  """The predict command's classifier on a random PNG gives timm ``model``'s top-1 and
  its probabilities within what the logits' TOLERANCE allows (the same prepared pixels
  fed to both): softmax's Jacobian, diag(p) - p p^T, has rows of absolute sum
  2 p_i (1 - p_i) <= 1/2, so |dp| <= |dz| / 2 for logits z within TOLERANCE * max |z|."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  from vit_jax import predict  # pylint: disable=g-import-not-at-top

  pixels = np.random.default_rng(4).integers(0, 256, (size, size, 3), dtype=np.uint8)
  path = os.path.join(str(directory), "image.png")
  tf.io.write_file(path, tf.io.encode_png(pixels))
  classifier = predict.Classifier(loaded, (size, size))
  prepared = classifier.prepare(path)[None]
  ours = classifier.probabilities(prepared)
  logits = torch_logits(model, prepared)
  theirs = torch.softmax(torch.from_numpy(logits), -1).numpy()
  assert ours.argmax() == theirs.argmax()
  bound = max(TOLERANCE * np.abs(logits).max() / 2, 1e-6)  # 1e-6: float32 rounding
  assert np.abs(ours - theirs).max() <= bound, (np.abs(ours - theirs).max(), bound)
