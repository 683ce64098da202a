"""transformers' image-text models <-> our two-tower parameters: ``SiglipModel``,
``Siglip2Model`` and ``CLIPModel`` folders as ``save_pretrained`` writes them, read
(`detect`, `read`, `read_data_config`, `read_tokenizer`) and written (`writer`) here
through the one table of arrays of `two_tower_table`.

What each is here (`models.image_text`, `models.text`):
- SigLIP: a ViT without class token pooled by attention (``MAPHead_0``, transformers'
  ``head`` with torch's packed ``in_proj``), no image projection (``image_head='none'``);
  a text tower pooled at its last position and projected with a bias; ``logit_scale`` is
  our ``t``, ``logit_bias`` our ``b``. transformers' tokenizers return an attention mask
  and its text model uses it: the text settings' ``pad_id`` / ``eos_id`` mask the same keys.
- SigLIP 2 (NaFlex) at one fixed square grid: its patch embedding is a Dense on pixels
  flattened (row, column, channel) per patch, our convolution's kernel; its position table
  is resampled to that grid as transformers resamples it for a square image (an
  antialiased triangle filter, `naflex_positions`; the identity at the stored grid). The
  grid is the image processor's ``max_num_patches`` (its square root; the stored table's
  when absent). Not supported: other aspect ratios or patch counts per image (NaFlex's
  variable grids and padded patches); images are resized to the square.
- CLIP: a ViT with class token, ``pre_layrnorm`` (our ``norm_pre``) and QuickGELU; both
  projections without bias (``image_head='linear'``, text ``head_bias=False``); a causal
  text tower pooled at the first end token (``eos_token_id`` 2: the largest id, as
  transformers' legacy configs); a temperature and no bias. transformers' patch
  convolution has no bias: ours is read as zeros and, on export, added to the patches'
  position rows (the same sum).

Written back (`writer`) as the class a model read from transformers was (its config's
name), otherwise the one its structure is (`kind`): no image projection and attention
pooling is SigLIP, a linear image projection with a class token and a causal text tower
is CLIP. Everything else in `check_exportable`'s list cannot be held by transformers'
classes and is refused in one error. The tokenizer and image processor files are copied
from the folder the model was read from; a model with no such folder gets a
`preprocessor_config.json` from its data config and, when its tokenizer is a `tokenizers`
one (a contrastive run's caption tokenizer), a `tokenizer.json` (``PreTrainedTokenizerFast``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from typing import Any, Callable, Optional

import numpy as np
from flax import traverse_util

from vit_jax import models
from vit_jax.data import data_config as data_config_lib
from vit_jax.data import folder_tokenizer, tokenizer_kinds
from vit_jax.infra import errors
from vit_jax.infra.aliases import Params
from vit_jax.models.settings import PatchSettings
from vit_jax.weights import files, tensor_table
from vit_jax.weights.hf import folder
from vit_jax.weights.hf.two_tower_table import (
  ARCHITECTURES,
  PATCH_BIAS,
  POSEMB,
  naflex_positions,
  table,
)

# transformers' hidden_act -> (our activation, tanh GELU?)
_ACTIVATIONS = {
  "gelu_pytorch_tanh": ("gelu", True),
  "gelu_new": ("gelu", True),
  "gelu": ("gelu", False),
  "quick_gelu": ("quick_gelu", False),
}
_HIDDEN_ACT = {("gelu", True): "gelu_pytorch_tanh", ("gelu", False): "gelu"}
_LEGACY_CLIP_EOS = 2  # transformers' CLIP pools the largest id when eos_token_id is 2
# transformers' files of a tokenizer and an image processor, copied from a source folder.
_PROCESSOR_FILES = (
  *tokenizer_kinds.FOLDER.files, tokenizer_kinds.SPECIAL_TOKENS, folder.PREPROCESSOR,
  folder.PROCESSOR,
)  # fmt: skip
_VIT_DEFAULTS = dict(
  posemb="learn", resnet=None, representation_size=None, num_registers=0, fc_norm=False,
  layer_scale_init=None, rope=None, mlp="mlp", mlp_norm=False, attention_norm=False,
  qkv_bias="all", axial=False, posemb_patches_only=False,
)  # fmt: skip


def detect(path: str) -> bool:
  """Whether ``path`` is a ``SiglipModel``, ``Siglip2Model`` or ``CLIPModel`` folder."""
  return os.path.isdir(path) and folder.model_type(path) in ARCHITECTURES


# ---------------------------------------------------------------------- reading


def read_data_config(
  directory: str, config: models.Settings, image_size: tuple[int, int]
) -> data_config_lib.DataConfig:
  """The folder's image preprocessing; without an image processor the official recipe
  with the image tower's mean and std. SigLIP 2's processor resizes to ``image_size``."""
  return _image_data_config(directory, config.image, image_size)


def _image_data_config(
  directory: str, image: models.Settings, image_size: tuple[int, int]
) -> data_config_lib.DataConfig:
  """`read_data_config` given the image tower's settings."""
  processor, path = folder.image_processor(directory)
  if processor is None:
    return data_config_lib.official(image_size, tuple(image.input_mean), tuple(image.input_std))
  return data_config_lib.from_hf_processor(processor, image_size, repr(path))


def _sub(config: dict[str, Any], key: str, path: str) -> dict[str, Any]:
  value = config.get(key)
  if not isinstance(value, dict):
    raise errors.CheckpointError(f"{path!r}: {key} is {value!r}, not an object.")
  return value


def _activation(sub: dict[str, Any], path: str) -> tuple[str, bool]:
  act = sub.get("hidden_act", "gelu_pytorch_tanh")
  if act not in _ACTIVATIONS:
    raise errors.CheckpointError(
      f"{path!r}: hidden_act {act!r} is none this package computes ({', '.join(_ACTIVATIONS)})."
    )
  return _ACTIVATIONS[act]


def _eps(sub: dict[str, Any], path: str, default: float) -> float:
  return folder.layer_norm_eps({"layer_norm_eps": sub.get("layer_norm_eps", default)}, path)


def _ints(sub: dict[str, Any], path: str, *keys: str) -> list[int]:
  return [files.field(sub, key, int, path) for key in keys]


def _grid(directory: str, kind: str, vision: dict[str, Any], path: str) -> tuple[int, int]:
  """The image's patch grid: from image_size (SigLIP, CLIP) or, for SigLIP 2, the square
  root of the image processor's max_num_patches (else of the stored table's)."""
  patch = files.field(vision, "patch_size", int, path)
  if kind != "siglip2":
    size = files.field(vision, "image_size", int, path)
    return size // patch, size // patch
  count = files.field(vision, "num_patches", int, path)
  processor, processor_path = folder.image_processor(directory)
  count = (processor or {}).get("max_num_patches", count)
  if not isinstance(count, int) or isinstance(count, bool) or count < 1:
    raise errors.CheckpointError(f"{processor_path!r}: max_num_patches {count!r} is no count.")
  side = math.isqrt(count)
  return side, side


def _config(directory: str, kind: str) -> tuple[models.TwoTowerSettings, tuple[int, int]]:
  """Our two-tower model settings of a transformers folder, and the image grid."""
  path = os.path.join(directory, folder.CONFIG)
  config = files.read_json(path)
  vision, text = _sub(config, "vision_config", path), _sub(config, "text_config", path)
  width, mlp, depth, heads, patch = _ints(
    vision, path, "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "patch_size",
  )  # fmt: skip
  activation, approximate = _activation(vision, path)
  clip = kind == "clip"
  if not clip and vision.get("vision_use_head", True) is not True:
    raise errors.CheckpointError(
      f"{path!r}: vision_use_head is false: a {ARCHITECTURES[kind]} without its attention "
      "pooling has no image embedding."
    )
  base = models.variant_settings("ViT-B_16")  # every field at its default
  image = base.replace(
    name=f"{kind}-image",
    patches=PatchSettings((patch, patch)),
    hidden_size=width,
    transformer=dataclasses.replace(
      base.transformer, num_layers=depth, mlp_dim=mlp, num_heads=heads
    ),
    classifier="token" if clip else "map",
    activation=activation,
    gelu_approximate=approximate,
    norm_pre=clip,
    layer_norm_epsilon=_eps(vision, path, 1e-5 if clip else 1e-6),
  )
  data = _image_data_config(directory, image, (1, 1))
  image = image.replace(input_mean=tuple(data.mean), input_std=tuple(data.std))

  tokenizer = folder_tokenizer.read_folder_tokenizer(directory)
  t_width, t_mlp, t_depth, t_heads, vocab, length = _ints(
    text, path, "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "vocab_size", "max_position_embeddings",
  )  # fmt: skip
  t_act, t_approximate = _activation(text, path)
  eos = text.get("eos_token_id", tokenizer.eos_id)  # CLIP pools at the config's
  text_settings = dict(
    width=t_width, depth=t_depth, mlp_dim=t_mlp, num_heads=t_heads, vocab_size=vocab,
    activation=t_act, gelu_approximate=t_approximate,
    layer_norm_epsilon=_eps(text, path, 1e-5 if clip else 1e-6),
    pad_id=tokenizer.pad_id, eos_id=tokenizer.eos_id,
  )  # fmt: skip
  if clip:
    pool = "argmax" if eos == _LEGACY_CLIP_EOS else "eos"
    text_settings.update(pool=pool, causal=True, head_bias=False, eos_id=eos)
    embed_dim = files.field(config, "projection_dim", int, path)
  else:
    text_settings.update(pool="last")
    embed_dim = int(text.get("projection_size") or t_width)
  two_tower = models.two_tower_settings(
    image, text=text_settings, text_len=length, embed_dim=embed_dim,
    loss="softmax" if clip else "sigmoid", name=ARCHITECTURES[kind],
    image_head="linear" if clip else "none",
  )  # fmt: skip
  return two_tower, _grid(directory, kind, vision, path)


def read(
  directory: str,
) -> tuple[models.TwoTowerSettings, Params, None, tuple[int, int]]:
  """(model settings, params, no class names, image size) of a SigLIP, SigLIP 2 or CLIP
  folder; its tokenizer is `read_tokenizer`, its preprocessing `read_data_config`."""
  kind = folder.model_type(directory)
  settings, grid = _config(directory, kind)
  tensors = folder.read_tensors(directory)
  source = f"{directory!r} ({ARCHITECTURES[kind]})"
  tensors = {k: v for k, v in tensors.items() if not k.endswith("position_ids")}
  rows_ = table(kind, settings)
  params = tensor_table.from_torch(
    rows_, tensors, source, ARCHITECTURES[kind], library="transformers"
  )
  flat = tensor_table.flat_float32(params)
  if kind == "siglip2":
    flat[POSEMB] = naflex_positions(flat[POSEMB][0], grid)[None]
  if kind == "clip":
    flat[PATCH_BIAS] = np.zeros(settings.image.hidden_size, np.float32)
  patch = settings.image.patches.size
  params = traverse_util.unflatten_dict(flat, sep="/")
  return settings, params, None, (grid[0] * patch[0], grid[1] * patch[1])


def read_tokenizer(directory: str) -> folder_tokenizer.FolderTokenizer:
  """The folder's tokenizer (`data.folder_tokenizer`)."""
  return folder_tokenizer.read_folder_tokenizer(directory)


# ---------------------------------------------------------------------- writing


def kind(settings: Any) -> Optional[str]:
  """The transformers model_type that ``settings`` (two-tower) are, or None."""
  by_name = {v: k for k, v in ARCHITECTURES.items()}
  if settings.name in by_name:
    return by_name[settings.name]
  if settings.image_head == "none":
    return "siglip"
  if settings.image_head == "linear":
    return "clip"
  return None


def check_exportable(settings: Any, model_type: Optional[str]) -> None:
  """One CommandLineError listing what transformers' class of ``model_type`` cannot hold."""
  problems = []
  if model_type is None:
    problems.append(
      f"an image projection with a bias (image_head={settings.image_head!r}: SigLIP has "
      "none, 'none'; CLIP's has no bias, 'linear')"
    )
  image, text = settings.image, settings.text
  refusal = models.family_of(image).hf_refusal  # transformers' image towers are ViTs
  if refusal:
    problems.append(f"a {models.family_of(image).name} image tower ({refusal})")
  else:
    problems += [
      f"image {k}={image.get(k)!r} (transformers': {v!r})"
      for k, v in _VIT_DEFAULTS.items()
      if image.get(k) != v
    ]
    act = (image.activation, image.gelu_approximate and image.activation == "gelu")
    if model_type != "clip" and act not in _HIDDEN_ACT:
      problems.append(f"image activation {image.activation!r}")
  clip = model_type == "clip"
  want = dict(classifier="token" if clip else "map", norm_pre=clip, num_prefix_tokens=int(clip))
  if not refusal and model_type is not None:
    problems += [
      f"image {k}={getattr(image, k)!r} ({ARCHITECTURES[model_type]}: {v!r})"
      for k, v in want.items()
      if getattr(image, k, None) != v
    ]
    want_text = dict(
      pool=("eos", "argmax") if clip else ("last",), causal=(clip,), head_bias=(not clip,)
    )
    problems += [
      f"text {k}={getattr(text, k)!r} ({ARCHITECTURES[model_type]}: {v[0]!r})"
      for k, v in want_text.items()
      if getattr(text, k) not in v
    ]
    if (settings.bias_init is None) != clip:
      problems.append("a logit bias" if clip else "no logit bias (SigLIP has one)")
  if text.pool == "map":
    problems.append("text pool 'map'")
  if problems:
    raise errors.CommandLineError(
      "This two-tower model cannot be exported as a transformers image-text model: "
      + "; ".join(problems)
      + "."
    )


def _act(activation: str, approximate: bool) -> str:
  return "quick_gelu" if activation == "quick_gelu" else _HIDDEN_ACT[activation, approximate]


def hf_config(settings: Any, model_type: str, image_size: tuple[int, int]) -> dict[str, Any]:
  """config.json of ``settings`` as transformers' ``model_type``."""
  image, text = settings.image, settings.text
  t = image.transformer
  patch = image.patches.size[0]
  vision = {
    "model_type": f"{model_type}_vision_model",
    "hidden_size": image.hidden_size,
    "intermediate_size": t.mlp_dim,
    "num_hidden_layers": t.num_layers,
    "num_attention_heads": t.num_heads,
    "patch_size": patch,
    "num_channels": 3,
    "hidden_act": _act(image.activation, image.gelu_approximate),
    "layer_norm_eps": image.layer_norm_epsilon,
  }
  if model_type == "siglip2":
    vision["num_patches"] = (image_size[0] // patch) * (image_size[1] // patch)
  else:
    vision["image_size"] = image_size[0]
  eos = 2 if text.pool == "argmax" else text.eos_id
  text_config = {
    "model_type": f"{model_type}_text_model",
    "vocab_size": text.vocab_size,
    "hidden_size": text.width,
    "intermediate_size": text.mlp_dim,
    "num_hidden_layers": text.depth,
    "num_attention_heads": text.num_heads,
    "max_position_embeddings": settings.text_len,
    "hidden_act": _act(text.activation, text.gelu_approximate),
    "layer_norm_eps": text.layer_norm_epsilon,
    **({"eos_token_id": eos} if eos is not None else {}),
    **({"pad_token_id": text.pad_id} if text.pad_id is not None else {}),
  }
  config = {
    "architectures": [ARCHITECTURES[model_type]],
    "model_type": model_type,
    "text_config": text_config,
    "vision_config": vision,
    "torch_dtype": "float32",
  }
  if model_type == "clip":
    config["projection_dim"] = settings.embed_dim
  else:
    vision["vision_use_head"] = True
    text_config["projection_size"] = settings.embed_dim
  return config


def writer(
  model: Any,
  *,
  image_size: tuple[int, int],
  class_names: Optional[list[str]],  # pylint: disable=unused-argument  (none: no head)
  data_config: data_config_lib.DataConfig,
) -> Callable[[str], None]:
  """Checks that ``model`` (a `sources.LoadedModel` of a two-tower model) can be written;
  returns what writes it into a folder (the image processor: ``data_config``, unless the
  source folder's is copied)."""
  settings = models.model_settings(model.config)
  model_type = kind(settings)
  check_exportable(settings, model_type)
  assert model_type is not None
  if image_size[0] != image_size[1]:
    raise errors.CommandLineError(f"Image size {image_size} is not square: pass --resolution.")
  flat = tensor_table.flat_float32(model.params)
  if model_type == "clip":  # no patch bias in transformers' CLIP: on the patches' rows
    posemb = flat[POSEMB].copy()
    posemb[:, 1:] += flat.pop(PATCH_BIAS)
    flat[POSEMB] = posemb
  tensors = tensor_table.to_torch(table(model_type, settings), flat)
  config = hf_config(settings, model_type, image_size)
  source = model.source if os.path.isdir(str(model.source)) else None
  copied = [n for n in _PROCESSOR_FILES if source and os.path.isfile(os.path.join(source, n))]
  configs = {folder.CONFIG: config}
  if not {folder.PREPROCESSOR, folder.PROCESSOR} & set(copied):  # else the source's
    configs[folder.PREPROCESSOR] = data_config.to_hf_processor()

  def write(directory: str) -> None:
    folder.write_files(directory, tensors, configs)
    for name in copied:
      shutil.copyfile(os.path.join(source, name), os.path.join(directory, name))
    if folder_tokenizer.CONFIG not in copied:
      _write_tokenizer(model.tokenizer, directory)

  return write


def _write_tokenizer(tokenizer: Any, directory: str) -> None:
  """A `tokenizers` tokenizer (a contrastive run's) as ``PreTrainedTokenizerFast`` files."""
  inner = tokenizer.hugging_face() if tokenizer is not None else None
  if inner is None:
    raise errors.CommandLineError(
      "This model's tokenizer cannot be written as transformers files: export a model read "
      "from a transformers folder, or one whose tokenizer is a tokenizer.json."
    )
  inner.save(os.path.join(directory, tokenizer_kinds.HF_FILE))
  pad = inner.id_to_token(int(tokenizer.pad_id))
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": pad}
  with open(os.path.join(directory, folder_tokenizer.CONFIG), "w") as f:
    json.dump(config, f, indent=2)
