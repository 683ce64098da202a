"""A two-tower model -> a transformers ``SiglipModel``, ``Siglip2Model`` or ``CLIPModel``
folder (``AutoModel.from_pretrained`` and ``AutoProcessor.from_pretrained`` load it), the
write side of `hf_two_tower`'s table.

Which class: the one a model read from transformers was (its config's name); otherwise
the one its structure is (`kind`): no image projection and attention pooling is SigLIP,
a linear image projection with a class token and a causal text tower is CLIP. Everything
else in `check_exportable`'s list cannot be held by transformers' classes and is refused
in one error. The tokenizer and image processor files are copied from the folder the
model was read from; a model with no such folder gets a `preprocessor_config.json` from
its data config and, when its tokenizer is a `tokenizers` one (a contrastive run's
caption tokenizer), a `tokenizer.json` (``PreTrainedTokenizerFast``).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Callable, Optional

from vit_jax import errors, models
from vit_jax.data import folder_tokenizer
from vit_jax.weights import hf, hf_two_tower, tensor_table

# transformers' files of a tokenizer and an image processor, copied from a source folder.
_PROCESSOR_FILES = (
  folder_tokenizer.CONFIG, folder_tokenizer.SPIECE, "tokenizer.json", "special_tokens_map.json",
  hf.PREPROCESSOR, hf_two_tower.PROCESSOR,
)  # fmt: skip
_HIDDEN_ACT = {("gelu", True): "gelu_pytorch_tanh", ("gelu", False): "gelu"}
_VIT_DEFAULTS = dict(
  posemb="learn", resnet=None, representation_size=None, num_registers=0, fc_norm=False,
  layer_scale_init=None, rope=None, mlp="mlp", mlp_norm=False, attention_norm=False,
  qkv_bias="all", axial=False, posemb_patches_only=False,
)  # fmt: skip


def kind(settings: Any) -> Optional[str]:
  """The transformers model_type that ``settings`` (two-tower) are, or None."""
  by_name = {v: k for k, v in hf_two_tower.ARCHITECTURES.items()}
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
  vit = models.family_of(image).name == "vit"
  if not vit:
    problems.append(f"a {models.family_of(image).name} image tower (transformers': a ViT)")
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
  if vit and model_type is not None:
    problems += [
      f"image {k}={getattr(image, k)!r} ({hf_two_tower.ARCHITECTURES[model_type]}: {v!r})"
      for k, v in want.items()
      if getattr(image, k, None) != v
    ]
    want_text = dict(
      pool=("eos", "argmax") if clip else ("last",), causal=(clip,), head_bias=(not clip,)
    )
    problems += [
      f"text {k}={getattr(text, k)!r} ({hf_two_tower.ARCHITECTURES[model_type]}: {v[0]!r})"
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
    "architectures": [hf_two_tower.ARCHITECTURES[model_type]],
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


def writer(model: Any, image_size: tuple[int, int]) -> Callable[[str], None]:
  """Checks that ``model`` (a `sources.LoadedModel` of a two-tower model) can be written;
  returns what writes it into a folder."""
  settings = models.model_settings(model.config)
  model_type = kind(settings)
  check_exportable(settings, model_type)
  assert model_type is not None
  if image_size[0] != image_size[1]:
    raise errors.CommandLineError(f"Image size {image_size} is not square: pass --resolution.")
  flat = tensor_table.flat_float32(model.params)
  if model_type == "clip":  # no patch bias in transformers' CLIP: on the patches' rows
    posemb = flat[hf_two_tower.POSEMB].copy()
    posemb[:, 1:] += flat.pop(hf_two_tower.PATCH_BIAS)
    flat[hf_two_tower.POSEMB] = posemb
  tensors = tensor_table.to_torch(hf_two_tower.table(model_type, settings), flat)
  config = hf_config(settings, model_type, image_size)
  source = model.source if os.path.isdir(str(model.source)) else None
  processor = model.data_config.at_size(image_size).to_hf_processor()  # without a source's

  copied = [n for n in _PROCESSOR_FILES if source and os.path.isfile(os.path.join(source, n))]

  def write(directory: str) -> None:
    from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

    save_file(tensors, os.path.join(directory, hf.WEIGHTS), metadata={"format": "pt"})
    for name, content in ((hf.CONFIG, config), (hf.PREPROCESSOR, processor)):
      if name == hf.CONFIG or not {hf.PREPROCESSOR, hf_two_tower.PROCESSOR} & set(copied):
        with open(os.path.join(directory, name), "w") as f:
          json.dump(content, f, indent=2)
    for name in copied:
      shutil.copyfile(os.path.join(source, name), os.path.join(directory, name))
    if folder_tokenizer.CONFIG not in copied:
      _write_tokenizer(model.tokenizer, directory)

  return write


def tokenizer_copier(model: Any) -> Callable[[str], None]:
  """What copies the tokenizer files of the transformers folder ``model`` was read from
  into a folder (nothing for a model read from elsewhere): an `.npz` export's."""
  source = model.source if os.path.isdir(str(model.source)) else None
  names = (folder_tokenizer.CONFIG, folder_tokenizer.SPIECE, "tokenizer.json")
  copied = [n for n in names if source and os.path.isfile(os.path.join(source, n))]

  def copy(directory: str) -> None:
    for name in copied:
      shutil.copyfile(os.path.join(source, name), os.path.join(directory, name))

  return copy


def _write_tokenizer(tokenizer: Any, directory: str) -> None:
  """A `tokenizers` tokenizer (a contrastive run's) as ``PreTrainedTokenizerFast`` files."""
  inner = getattr(tokenizer, "_tokenizer", None)
  if inner is None or not hasattr(inner, "save"):
    raise errors.CommandLineError(
      "This model's tokenizer cannot be written as transformers files: export a model read "
      "from a transformers folder, or one whose tokenizer is a tokenizer.json."
    )
  inner.save(os.path.join(directory, "tokenizer.json"))
  pad = inner.id_to_token(int(tokenizer.pad_id))
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": pad}
  with open(os.path.join(directory, folder_tokenizer.CONFIG), "w") as f:
    json.dump(config, f, indent=2)
