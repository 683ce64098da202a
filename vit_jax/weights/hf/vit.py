"""Hugging Face `transformers` ViT <-> our parameters, with numpy and safetensors only.

A `ViTForImageClassification` directory holds `config.json`, `model.safetensors` and
`preprocessor_config.json`. HF's ViT has a class token, a learned 1-D position table
(class row first) and no representation layer before the head, so only such models
export; `ViTModel` directories (no head, a tanh pooler = our `pre_logits`) import too.
Read: `detect`, `read`, `read_data_config`; written: `writer` (`to_hf`'s files).

Layouts (ours -> torch): Dense kernels [in, out] -> weight [out, in]; attention
query/key/value [D, H, Dh] -> [H*Dh, D] and out [H, Dh, D] -> [D, H*Dh]; the patch
convolution [ph, pw, C, D] -> [D, C, ph, pw]. Every mapping is a transpose or a
reshape, so a round trip is bit-exact.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import numpy as np
from flax import traverse_util

from vit_jax import models
from vit_jax.data import data_config as data_config_lib
from vit_jax.infra import errors
from vit_jax.infra.aliases import Params
from vit_jax.models import settings
from vit_jax.weights import architecture, files
from vit_jax.weights.hf import folder

_BASE = "vit."  # ViTForImageClassification's prefix of the ViTModel inside it
# hidden_act <-> our GELU: the tanh approximation (official weights) or exact erf GELU.
_HIDDEN_ACT = {True: "gelu_pytorch_tanh", False: "gelu"}
_APPROXIMATE = {"gelu_pytorch_tanh": True, "gelu_new": True, "gelu": False}
_IGNORED = ("embeddings.mask_token",)  # masked-image-modelling only

Mapping = tuple[str, str, Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]


def _same(x: np.ndarray) -> np.ndarray:
  return x


def _t(x: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(x.T)


def _mappings(depth: int, width: int, heads: int, pre_logits: bool) -> list[Mapping]:
  """(our path, HF key without 'vit.', ours -> HF, HF -> ours) for every array."""
  dh = width // heads
  conv = (
    lambda k: np.ascontiguousarray(k.transpose(3, 2, 0, 1)),
    lambda w: np.ascontiguousarray(w.transpose(2, 3, 1, 0)),
  )
  qkv_w = (lambda k: _t(k.reshape(width, width)), lambda w: _t(w).reshape(width, heads, dh))
  qkv_b = (lambda b: b.reshape(width), lambda b: b.reshape(heads, dh))
  out_w = (lambda k: _t(k.reshape(width, width)), lambda w: _t(w).reshape(heads, dh, width))
  dense = (_t, _t)
  same = (_same, _same)
  maps = [
    ("cls", "embeddings.cls_token", *same),
    ("Transformer/posembed_input/pos_embedding", "embeddings.position_embeddings", *same),
    ("embedding/kernel", "embeddings.patch_embeddings.projection.weight", *conv),
    ("embedding/bias", "embeddings.patch_embeddings.projection.bias", *same),
    ("Transformer/encoder_norm/scale", "layernorm.weight", *same),
    ("Transformer/encoder_norm/bias", "layernorm.bias", *same),
  ]
  if pre_logits:
    maps += [
      ("pre_logits/kernel", "pooler.dense.weight", *dense),
      ("pre_logits/bias", "pooler.dense.bias", *same),
    ]
  for i in range(depth):
    ours, hf = f"Transformer/encoderblock_{i}/", f"encoder.layer.{i}."
    att = ours + "MultiHeadDotProductAttention_1/"
    for name in ("query", "key", "value"):
      maps += [
        (f"{att}{name}/kernel", f"{hf}attention.attention.{name}.weight", *qkv_w),
        (f"{att}{name}/bias", f"{hf}attention.attention.{name}.bias", *qkv_b),
      ]
    maps += [
      (f"{att}out/kernel", f"{hf}attention.output.dense.weight", *out_w),
      (f"{att}out/bias", f"{hf}attention.output.dense.bias", *same),
      (f"{ours}LayerNorm_0/scale", f"{hf}layernorm_before.weight", *same),
      (f"{ours}LayerNorm_0/bias", f"{hf}layernorm_before.bias", *same),
      (f"{ours}LayerNorm_2/scale", f"{hf}layernorm_after.weight", *same),
      (f"{ours}LayerNorm_2/bias", f"{hf}layernorm_after.bias", *same),
      (f"{ours}MlpBlock_3/Dense_0/kernel", f"{hf}intermediate.dense.weight", *dense),
      (f"{ours}MlpBlock_3/Dense_0/bias", f"{hf}intermediate.dense.bias", *same),
      (f"{ours}MlpBlock_3/Dense_1/kernel", f"{hf}output.dense.weight", *dense),
      (f"{ours}MlpBlock_3/Dense_1/bias", f"{hf}output.dense.bias", *same),
    ]
  return maps


# The optional model fields that `ViTForImageClassification` holds (`to_hf`'s config) or
# that do not change the function it computes; any other that differs from the official
# value cannot be exported.
_HF_CARRIES = frozenset(
  {"layer_norm_epsilon", "input_mean", "input_std", "activation", "class_token"}
  | {"stoch_depth", "head_bias_init", "axial"}
)


def check_exportable(config: models.Settings, num_classes: Optional[int]) -> None:
  """One ValueError listing what `ViTForImageClassification` cannot represent."""
  problems = []
  if config.get("resnet") is not None:
    problems.append("a ResNet hybrid (transformers has no hybrid ViT; export it to timm)")
  if config.get("classifier", "token") != "token":
    problems.append(
      f"classifier {config.classifier!r} (HF's ViT classifies the class token; "
      "classifier='token' models only)"
    )
  if config.get("posemb", "learn") != "learn":
    problems.append(
      f"position embeddings {config.posemb!r} (HF's ViT has a learned 1-D table, posemb='learn')"
    )
  if config.get("representation_size") is not None:
    problems.append(
      "a representation layer (pre_logits) before the head, which "
      "ViTForImageClassification does not have"
    )
  for key, official in settings.optional_fields().items():
    if key not in _HF_CARRIES and config.get(key, official) not in (official, None):
      problems.append(f"{key}={config.get(key)!r} (HF's ViT has none; export it to timm)")
  if config.get("activation", settings.ModelSettings.activation) != "gelu":
    problems.append(f"activation {config.activation!r} (HF's ViT: GELU)")
  if not num_classes:
    problems.append("no classification head")
  if problems:
    raise errors.ConfigError(
      "This model cannot be exported as a Hugging Face "
      "ViTForImageClassification: " + "; ".join(problems) + "."
    )


def to_hf(
  params: Params,
  config: models.Settings,
  *,
  image_size: tuple[int, int],
  class_names: list[str],
  data_config: Optional[data_config_lib.DataConfig] = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, Any]]:
  """(safetensors arrays, config.json, preprocessor_config.json) of a per-layer tree;
  the image processor states ``data_config`` (default: the official recipe at
  ``image_size`` with the model config's mean and std)."""
  num_classes = len(class_names)
  check_exportable(config, num_classes)
  flat = traverse_util.flatten_dict(params, sep="/")
  t = config.transformer
  tensors = {
    _BASE + hf: np.asarray(to(np.asarray(flat[ours], np.float32)))
    for ours, hf, to, _ in _mappings(
      t.num_layers, config.hidden_size, t.num_heads, pre_logits=False
    )
  }
  tensors["classifier.weight"] = _t(np.asarray(flat["head/kernel"], np.float32))
  tensors["classifier.bias"] = np.asarray(flat["head/bias"], np.float32)
  square = lambda hw: hw[0] if hw[0] == hw[1] else list(hw)
  patch = tuple(config.patches.size)
  hf_config = {
    "architectures": ["ViTForImageClassification"],
    "model_type": "vit",
    "hidden_size": config.hidden_size,
    "num_hidden_layers": t.num_layers,
    "num_attention_heads": t.num_heads,
    "intermediate_size": t.mlp_dim,
    "hidden_act": _HIDDEN_ACT[config.gelu_approximate],
    "layer_norm_eps": config.get("layer_norm_epsilon", settings.ModelSettings.layer_norm_epsilon),
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "image_size": square(image_size),
    "patch_size": square(patch),
    "num_channels": 3,
    "qkv_bias": True,
    "encoder_stride": patch[0],
    "torch_dtype": "float32",
    "id2label": {str(i): n for i, n in enumerate(class_names)},
    "label2id": {n: i for i, n in enumerate(class_names)},
  }
  if data_config is None:
    data_config = data_config_lib.official(
      image_size,
      tuple(config.get("input_mean", settings.OFFICIAL_INPUT_MEAN)),
      tuple(config.get("input_std", settings.OFFICIAL_INPUT_STD)),
    )
  preprocessor = data_config.to_hf_processor()
  return tensors, hf_config, preprocessor


def writer(
  model: Any,
  *,
  image_size: tuple[int, int],
  class_names: Optional[list[str]],
  data_config: data_config_lib.DataConfig,
) -> Callable[[str], None]:
  """Checks that ``model`` (a `sources.LoadedModel`) can be written as a
  `ViTForImageClassification` folder; returns what writes it into a folder."""
  family = models.family_of(model.config)
  if family.hf_refusal:
    raise errors.CommandLineError(
      f"{family.hf_refusal}: export this model as timm, npz, saved_model or stablehlo."
    )
  names = class_names or [str(i) for i in range(model.num_classes or 0)]  # id2label's
  tensors, hf_config, processor = to_hf(
    model.params, model.config, image_size=image_size, class_names=names,
    data_config=data_config,
  )  # fmt: skip
  configs = {folder.CONFIG: hf_config, folder.PREPROCESSOR: processor}
  return lambda directory: folder.write_files(directory, tensors, configs)


def detect(path: str) -> bool:
  """Whether ``path`` is a `ViTForImageClassification` / `ViTModel` folder (config.json's
  model_type 'vit') or the `.safetensors` file of one."""
  directory = folder.directory(path)
  return directory is not None and folder.model_type(directory) == "vit"


def _normalization(
  directory: str, config: models.Settings
) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """(mean, std) of the folder's image processor (`preprocessor_config.json`); without
  one, the model config's (the official [-1, 1])."""
  path = os.path.join(directory, folder.PREPROCESSOR)
  if not os.path.lexists(path):
    return tuple(config.input_mean), tuple(config.input_std)
  processor = files.read_json(path)
  if not processor.get("do_normalize", True):
    return (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)

  def rgb(key: str) -> tuple[float, ...]:
    value = processor.get(key, [0.5] * 3)
    values = value if isinstance(value, list) else [value] * 3
    if len(values) != 3 or not all(folder.is_number(v) for v in values):
      raise errors.CheckpointError(f"{path!r}: {key} is {value!r}, not a number or 3 numbers.")
    return tuple(float(v) for v in values)

  return rgb("image_mean"), rgb("image_std")


def read_data_config(
  directory: str, config: models.Settings, image_size: tuple[int, int]
) -> data_config_lib.DataConfig:
  """The folder's image processor (`preprocessor_config.json`) as a `DataConfig`; without
  one, the official recipe with the model config's mean and std."""
  path = os.path.join(directory, folder.PREPROCESSOR)
  if not os.path.lexists(path):
    return data_config_lib.official(image_size, tuple(config.input_mean), tuple(config.input_std))
  return data_config_lib.from_hf_processor(files.read_json(path), image_size, repr(path))


def read(
  path: str,
) -> tuple[models.ModelSettings, Params, Optional[list[str]], tuple[int, int]]:
  """(model settings, per-layer params, class names or None, image size) of an HF ViT folder
  (``path``, or the `.safetensors` file in it)."""
  directory = folder.directory(path) or path
  config_path = os.path.join(directory, folder.CONFIG)
  hf_config = files.read_json(config_path)
  act = hf_config.get("hidden_act", "gelu")
  if act not in _APPROXIMATE:
    raise errors.CheckpointError(
      f"{directory!r}: hidden_act {act!r} is not a GELU this model has ({', '.join(_APPROXIMATE)})."
    )
  stored = folder.read_tensors(directory)
  tensors = {k[len(_BASE) :] if k.startswith(_BASE) else k: v for k, v in stored.items()}
  depth, width, heads = (
    files.field(hf_config, key, int, config_path)
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads")
  )
  maps = _mappings(depth, width, heads, pre_logits="pooler.dense.weight" in tensors)
  maps += [
    ("head/kernel", "classifier.weight", _t, _t),
    ("head/bias", "classifier.bias", _same, _same),
  ]
  missing = [hf for _, hf, _, _ in maps[:-2] if hf not in tensors]
  if missing:
    raise errors.CheckpointError(
      f"{directory!r} is missing {len(missing)} ViT arrays: {missing[:5]}..."
    )
  unused = set(tensors) - {hf for _, hf, _, _ in maps} - set(_IGNORED)
  if unused:
    raise errors.CheckpointError(
      f"{directory!r}: {len(unused)} arrays have no place in this ViT: {sorted(unused)}."
    )
  params = traverse_util.unflatten_dict(
    {
      ours: from_hf(np.asarray(tensors[hf], np.float32))
      for ours, hf, _, from_hf in maps
      if hf in tensors
    },
    sep="/",
  )
  config = architecture.infer_settings(params)
  mean, std = _normalization(directory, config)
  config = config.replace(
    gelu_approximate=_APPROXIMATE[act],
    layer_norm_epsilon=folder.layer_norm_eps(hf_config, config_path),
    input_mean=mean,
    input_std=std,
  )
  size = hf_config.get("image_size", 224)
  size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
  names = None
  if "classifier.weight" in tensors and "id2label" in hf_config:
    labels = files.field(hf_config, "id2label", dict, config_path)
    names = [labels.get(str(i)) for i in range(len(labels))]
    if not all(isinstance(name, str) for name in names):
      raise errors.CheckpointError(f"{config_path!r}: id2label must map 0..K-1 to names.")
  return config, params, names, size
