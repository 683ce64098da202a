"""big_vision's checkpoints both ways: the SigLIP, SigLIP 2 and LiT image-text `.npz` files
and its plain ViTs, with their SentencePiece tokenizers.

What big_vision saves (`big_vision/utils.py`: the tree flattened with '/' into `np.savez`;
releases under ``params/``, which its `load_params` strips, as here):

- the image tower (`big_vision/models/vit.py`) under ``img/``, a plain ViT at the root:
  ``embedding``, ``pos_embedding`` at the tower's root (added before the class token, so it
  has no class-token row: our ``posemb_patches_only``), ``cls`` (``pool_type='tok'``),
  ``Transformer/encoderblock_<i>`` (or ``encoderblock`` stacked over a leading layer axis,
  ``scan=True``: SigLIP 2), ``Transformer/encoder_norm``, ``MAPHead_0`` (``'map'``),
  ``pre_logits``, ``head`` (a two-tower's image projection: our ``img_head``);
- the text tower (`models/proj/image_text/text_transformer.py`) under ``txt/``:
  ``Embed_0``, ``pos_embedding``, ``Encoder_0/encoderblock_<i>`` (or stacked),
  ``Encoder_0/encoder_norm``, ``MAPHead_0`` (``pool_type='map'``), ``head``;
- ``t`` (log temperature) and, for SigLIP, ``b`` (`two_towers.py`).

A block holds ``LayerNorm_0``, ``MultiHeadDotProductAttention_0``, ``LayerNorm_1``,
``MlpBlock_0``; ours (the official ViT's numbering) ``LayerNorm_0``,
``MultiHeadDotProductAttention_1``, ``LayerNorm_2``, ``MlpBlock_3``: the arrays are the
same, only those names differ (`_BLOCK_NAMES`). Both towers compute tanh GELU, LayerNorm
1e-6 and attend to padding (no mask); the text tower pools its last position ('map' when
it has ``MAPHead_0``; big_vision's 'first' and 'gap' leave no trace in the arrays and are
read as 'last').

The tokenizer: the ``.model`` beside the file (``<stem>.model``, else the folder's only
``.model``) or named, as big_vision's ``tokenize`` op runs it for these models: ASCII
lower-cased, the end token appended and kept last when truncating ('sticky'), padded with
id 1 (SigLIP's ``pad_value=1``), or with the model's pad piece for Gemma's 256,000-token
vocabulary (SigLIP 2's ``tok`` op).

NaFlex image towers (``proj.image_text.naflex_vit``, SigLIP 2 NaFlex) are read as the ViT
they are, whose table is resampled to each image's grid (`_naflex_as_vit`). Not read:
``posemb='sincos2d'``
(big_vision's frequencies are not `models.posemb.sincos_2d`'s), text towers without a
projection (``out_dim`` None). Written: ViT image towers with learned positions that
big_vision's `vit.py` computes (tanh GELU; no registers, LayerScale, other norms or biases).
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import re
import zipfile
from typing import Any, Callable, Mapping, Optional

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from vit_jax import models
from vit_jax.data import data_config as data_config_lib
from vit_jax.data import text_tokenizer
from vit_jax.infra import errors
from vit_jax.infra.aliases import Params
from vit_jax.weights import architecture, npz

PREFIX = "params/"  # releases keep the parameters under it (big_vision's saved train state)
EXPORT_FILE = npz.EXPORT_FILE  # what an export writes, with `TOKENIZER_FILE` beside it
TOKENIZER_FILE = "model.model"  # `<stem>.model`, found by `find_vocabulary`
GEMMA_VOCAB = 256_000  # SigLIP 2's vocabulary: padded with its pad piece, not id 1
SIGLIP_PAD_ID = 1  # big_vision's SigLIP and LiT configs: tokenize(..., pad_value=1)
# big_vision's block modules -> ours (the official ViT's numbering).
_BLOCK_NAMES = {
  "LayerNorm_0": "LayerNorm_0",
  "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
  "LayerNorm_1": "LayerNorm_2",
  "MlpBlock_0": "MlpBlock_3",
}
_OUR_BLOCK_NAMES = {ours: theirs for theirs, ours in _BLOCK_NAMES.items()}
# A block's module in a flat key: (tower path)(encoderblock or encoderblock_<i>)/(module)/
_BLOCK = re.compile(r"^(.*?(?:Transformer|Encoder_0)/encoderblock(?:_\d+)?/)([^/]+)(/.*)$")
_STACKED = re.compile(r"^(.*?(?:Transformer|Encoder_0)/encoderblock)(/.*)$")
_OUR_POSEMB = "Transformer/posembed_input/pos_embedding"
_IMAGE_MARK = re.compile(r"^(img/)?Transformer/encoderblock(_0)?/MlpBlock_0/")
_TEXT_MARK = re.compile(r"^txt/Encoder_0/encoderblock(_0)?/MlpBlock_0/")


# ------------------------------------------------------------------------ detection


def _listing(path: str) -> set[str]:
  """The archive's flat keys without `PREFIX`, read from its listing (no arrays)."""
  try:
    with zipfile.ZipFile(path) as archive:
      names = [n.removesuffix(".npy") for n in archive.namelist()]
  except (OSError, zipfile.BadZipFile):
    return set()
  return {n.removeprefix(PREFIX) for n in names}


def detect(path: str) -> bool:
  """Whether ``path`` is a big_vision `.npz`: its blocks' ``MlpBlock_0`` (the official
  layout's is ``MlpBlock_3``), in an image tower at the root or under ``img/``, or in a
  text tower under ``txt/``."""
  if not os.path.isfile(path):
    return False
  return any(_IMAGE_MARK.match(k) or _TEXT_MARK.match(k) for k in _listing(path))


# ---------------------------------------------------------------- names both ways


def _unstack(flat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Stacked ``encoderblock/...`` arrays [L, ...] split into ``encoderblock_<i>/...``."""
  out = {}
  for key, value in flat.items():
    match = _STACKED.match(key)
    if match is None:
      out[key] = value
      continue
    for i in range(np.shape(value)[0]):
      out[f"{match.group(1)}_{i}{match.group(2)}"] = np.asarray(value[i])
  return out


def _rename_blocks(flat: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
  def rename(key: str) -> str:
    match = _BLOCK.match(key)
    if match is None or match.group(2) not in names:
      return key
    return match.group(1) + names[match.group(2)] + match.group(3)

  return {rename(k): v for k, v in flat.items()}


def to_ours(flat: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """A big_vision tree (flat '/' keys, no `PREFIX`, either encoder layout) in our names,
  per layer. Older text towers kept a second position table in ``Encoder_0``: it is
  added to the first, as big_vision's text `load` does."""
  out = _rename_blocks(_unstack(dict(flat)), _BLOCK_NAMES)
  for tower in ("", "img/"):
    if tower + "pos_embedding" in out:
      out[tower + _OUR_POSEMB] = out.pop(tower + "pos_embedding")
  if "txt/Encoder_0/pos_embedding" in out:
    out["txt/pos_embedding"] = out["txt/pos_embedding"] + out.pop("txt/Encoder_0/pos_embedding")
  if "img/head/kernel" in out:  # big_vision's image classifier is the projection
    out["img_head/kernel"] = out.pop("img/head/kernel")
    out["img_head/bias"] = out.pop("img/head/bias")
  return out


def _image_to_theirs(flat: dict[str, np.ndarray], tower: str, prefix_rows: int) -> None:
  """Our image tower at ``tower`` in big_vision's names, in place: the position table at
  the root; a class token's row (``prefix_rows`` 1) folded into the token (big_vision adds
  positions before the class token: cls + row 0, then the patches' rows, is the same sum)."""
  posemb = flat.pop(tower + _OUR_POSEMB, None)
  if posemb is None:
    return
  if prefix_rows:
    flat[tower + "cls"] = flat[tower + "cls"] + posemb[:, :prefix_rows]
    posemb = posemb[:, prefix_rows:]
  flat[tower + "pos_embedding"] = posemb


def _image_prefix(config: models.Settings) -> str:
  """Where the image model's keys start in the flat tree of ``config``'s model: ``img/``
  in a two-tower one (`models.Family.image_tree`), the root in a ViT."""
  tree = models.family_of(config).image_tree
  return f"{tree}/" if tree else ""


def to_theirs(params: Params, config: models.Settings) -> dict[str, np.ndarray]:
  """Our tree (a two-tower model or a ViT, of ``config``) as big_vision's flat keys, per
  layer."""
  flat = traverse_util.flatten_dict(nn.unbox(dict(params)), sep="/")
  flat = _unstack({k: np.asarray(v, np.float32) for k, v in flat.items()})
  tower = _image_prefix(config)
  _image_to_theirs(flat, tower, architecture.num_prefix_rows(models.image_settings(config)))
  if tower and "img_head/kernel" in flat:  # big_vision's image classifier is the projection
    flat["img/head/kernel"] = flat.pop("img_head/kernel")
    flat["img/head/bias"] = flat.pop("img_head/bias")
  return _rename_blocks(flat, _OUR_BLOCK_NAMES)


# ------------------------------------------------------------------------- reading


def _float32(value: np.ndarray) -> np.ndarray:
  """big_vision saves bfloat16 arrays as 2-byte void (its `recover_dtype` views them back)."""
  if value.dtype.kind == "V" and value.dtype.itemsize == 2:
    return value.view(jnp.bfloat16).astype(np.float32)
  return value


def load_flat(path: str) -> dict[str, np.ndarray]:
  """The archive's arrays by flat key, `PREFIX` removed (`npz.load_npz`'s checks)."""
  flat = traverse_util.flatten_dict(npz.load_npz(path), sep="/")
  prefixed = all(k.startswith(PREFIX) for k in flat)
  return {k.removeprefix(PREFIX) if prefixed else k: _float32(v) for k, v in flat.items()}


def _image_settings(tree: Params, source: str) -> models.ModelSettings:
  """The ViT settings of an image tower in our names: its shapes, tanh GELU. A tower
  without a learned table has big_vision's 'sincos2d', whose frequencies (exponents over
  D/4 - 1) are not this package's (over D/4, MoCo v3's): refused."""
  if _OUR_POSEMB not in traverse_util.flatten_dict(tree, sep="/"):
    raise errors.CheckpointError(
      f"{source}: an image tower without learned position embeddings (big_vision's "
      "posemb='sincos2d', whose frequencies this package does not compute)."
    )
  settings = architecture.infer_settings(tree)
  return settings.replace(
    # big_vision adds the positions before the class token
    posemb_patches_only=True if "cls" in tree else settings.posemb_patches_only,
    gelu_approximate=True,
    name=f"big_vision {settings.name}",
  )


def _naflex_as_vit(flat: dict[str, Any], source: str) -> Optional[tuple[int, int]]:
  """A NaFlex image tower (``proj.image_text.naflex_vit``) in the ViT's layout, in place:
  its Dense on flattened patches [P * P * 3, D] (each patch's pixels in (row, column,
  channel) order, `tf.image.extract_patches`') as the patch kernel [P, P, 3, D], its
  table [n, n, D] as the rows [1, n * n, D] of an n x n grid, which it returns (None: no
  NaFlex tower). The ViT then takes NaFlex inputs (`vit_jax.models.naflex`) and square
  images alike."""
  for tower in ("", "img/"):
    kernel = flat.get(tower + "embedding/kernel")
    if kernel is None or np.ndim(kernel) != 2:
      continue
    side = math.isqrt(kernel.shape[0] // 3)
    table = flat.get(tower + "pos_embedding")
    if side * side * 3 != kernel.shape[0] or table is None or np.ndim(table) != 3:
      raise errors.CheckpointError(
        f"{source}: a 2-D patch kernel {tuple(kernel.shape)} without a square patch of RGB "
        "pixels or a 2-D position table is not a NaFlex ViT this package reads."
      )
    flat[tower + "embedding/kernel"] = kernel.reshape(side, side, 3, kernel.shape[1])
    flat[tower + "pos_embedding"] = table.reshape(1, -1, table.shape[-1])
    return table.shape[0], table.shape[1]
  return None


def read(path: str) -> tuple[models.Settings, Params, Optional[tuple[int, int]]]:
  """(model settings, our per-layer tree, image size) of the big_vision `.npz` at ``path``:
  a two-tower model (``img/``, ``txt/``, ``t``) or a plain ViT."""
  source = repr(path)
  flat = load_flat(path)
  table_grid = _naflex_as_vit(flat, source)
  tree = traverse_util.unflatten_dict(to_ours(flat), sep="/")
  settings = (_two_tower_settings if "txt" in tree else _image_settings)(tree, source)
  image = models.image_settings(settings)
  size = architecture.trained_image_size(models.image_params(tree, settings), image)
  if table_grid is not None:  # resized to each input as big_vision does (the defaults)
    settings = settings.replace(posemb_grid=table_grid)  # a two-tower model's image tower
  return settings, tree, size


def _two_tower_settings(tree: Params, source: str) -> models.TwoTowerSettings:
  """Our two-tower settings of a big_vision image-text tree (in our names)."""
  for key in ("img", "t"):
    if key not in tree:
      raise errors.CheckpointError(f"{source}: a big_vision text tower without {key!r}.")
  text = traverse_util.flatten_dict(tree["txt"], sep="/")
  if "head/kernel" not in text:
    raise errors.CheckpointError(
      f"{source}: its text tower has no projection (big_vision's out_dim None, the "
      "So400m/16 i18n release), which this package's two-tower model always has."
    )
  vocab, width = text["Embed_0/embedding"].shape
  depth = len({k.split("/")[1] for k in text if k.startswith("Encoder_0/encoderblock_")})
  block = "Encoder_0/encoderblock_0/"
  heads = text[block + "MultiHeadDotProductAttention_1/query/kernel"].shape[1]
  mlp = text[block + "MlpBlock_3/Dense_0/kernel"].shape[1]
  embed = text["head/kernel"].shape[1]
  image = _image_settings(tree["img"], source)
  head = "dense" if "img_head" in tree else "none"
  image_width = tree["img_head"]["kernel"].shape[1] if head == "dense" else image.hidden_size
  if image_width != embed:
    raise errors.CheckpointError(
      f"{source}: image embeddings of width {image_width}, text embeddings of {embed}: "
      "not one shared width."
    )
  bias = "b" in tree
  settings = models.two_tower_settings(
    image,
    text=dict(
      width=width, depth=depth, mlp_dim=mlp, num_heads=heads, vocab_size=vocab,
      pool="map" if "MAPHead_0/probe" in text else "last",
    ),
    text_len=tree["txt"]["pos_embedding"].shape[1],
    embed_dim=embed,
    loss="sigmoid" if bias else "softmax",
    name="big_vision SigLIP" if bias else "big_vision LiT",
    image_head=head,
  )  # fmt: skip
  return settings.replace(
    temperature_init=float(math.exp(float(np.asarray(tree["t"]).reshape(-1)[0]))),
    bias_init=float(np.asarray(tree["b"]).reshape(-1)[0]) if bias else None,
  )


def read_tree(path: str) -> tuple[Params, models.Settings]:
  """The tree in our names and its settings (for fine-tuning: `fit`)."""
  config, params, _ = read(path)
  return params, config


def find_vocabulary(path: str) -> Optional[str]:
  """The SentencePiece model beside ``path``: ``<stem>.model``, else the folder's only
  ``.model``; None when there is none (or several)."""
  beside = os.path.splitext(path)[0] + ".model"
  if os.path.isfile(beside):
    return beside
  found = glob.glob(os.path.join(glob.escape(os.path.dirname(path) or "."), "*.model"))
  return found[0] if len(found) == 1 else None


def tokenizer(vocabulary: str, config: models.Settings) -> text_tokenizer.Tokenizer:
  """``vocabulary`` (a ``.model``) as big_vision tokenizes for the image-text model of
  ``config`` (module docstring): lower-cased, sticky end token, pad id 1 (Gemma's
  vocabulary: its pad piece)."""
  gemma = config.text.vocab_size == GEMMA_VOCAB
  pad = None if gemma else SIGLIP_PAD_ID
  return text_tokenizer.read_sentencepiece(vocabulary, eos="sticky", lower=True, pad_id=pad)


def read_tokenizer(path: str, config: models.Settings) -> Optional[Any]:
  """An image-text model's tokenizer found beside ``path`` (`find_vocabulary`), or None."""
  vocabulary = find_vocabulary(path) if models.is_two_tower(config) else None
  return None if vocabulary is None else tokenizer(vocabulary, config)


# ------------------------------------------------------------------------- writing


def check_writable(config: models.Settings) -> None:
  """One error naming what big_vision's modules do not compute of ``config`` (a config or
  settings)."""
  config = models.model_settings(config)
  image = models.image_settings(config)
  problems = []
  if models.family_of(image).name != "vit":
    problems.append(f"a {models.family_of(image).name} image tower")
  else:
    expected = dict(
      activation="gelu", gelu_approximate=True, num_registers=0, layer_scale_init=None,
      norm_pre=False, fc_norm=False, final_norm=True, qkv_bias="all", patch_bias=True,
      mlp="mlp", attention_norm=False, mlp_norm=False, rope=None, axial=False,
      layer_norm_epsilon=1e-6, resnet=None, map_num_heads=None, map_mlp_dim=None,
      map_include_prefix=False,
    )  # fmt: skip
    problems += [
      f"{k}={image.get(k)!r}" for k, want in expected.items() if image.get(k, want) != want
    ]
    if image.get("posemb") != "learn":
      problems.append(f"posemb={image.get('posemb')!r}")
    if image.get("classifier") not in ("token", "gap", "map"):
      problems.append(f"classifier={image.get('classifier')!r}")
  if models.is_two_tower(config):  # its text tower
    text, head = dataclasses.asdict(config.text), config.image_head
    if head == "linear":
      problems.append("image_head='linear'")
    if text.get("pool", "last") not in ("last", "first", "gap", "map"):
      problems.append(f"text pool={text['pool']!r}")
    computed = dict(
      activation="gelu", gelu_approximate=True, causal=False, pad_id=None, head_bias=True,
      layer_norm_epsilon=1e-6,
    )  # fmt: skip
    for key, want in computed.items():
      if text.get(key, want) != want:
        problems.append(f"text {key}={text[key]!r}")
  if problems:
    raise errors.CheckpointError(
      "big_vision's vit.py and text_transformer.py do not compute this model: "
      + ", ".join(problems)
      + "; export it as npz or hf instead."
    )


def keeps_naflex_layout(config: models.Settings) -> bool:
  """Whether ``config``'s image tower is big_vision's ``naflex_vit``: a square table
  resized to each input (``posemb_grid``) as big_vision resizes it (antialiased bilinear,
  not keeping the aspect), no class token, MAP or mean pooling. Such a model is written in
  that layout, its table at its own grid; any other at the export's fixed grid."""
  image = models.image_settings(config)
  grid = image.get("posemb_grid")
  return (
    grid is not None
    and grid[0] == grid[1]
    and image.get("posemb_resample", "bilinear") == "bilinear"
    and image.get("posemb_antialias", True)
    and not image.get("posemb_keep_aspect", False)
    and image.get("classifier") in ("map", "gap")
  )


def _vit_as_naflex(flat: dict[str, Any], config: models.Settings) -> None:
  """The inverse of `_naflex_as_vit`, in place: the patch kernel [P, P, 3, D] as the Dense
  on flattened patches [P * P * 3, D], the table rows [1, n * n, D] as [n, n, D]."""
  tower, image = _image_prefix(config), models.image_settings(config)
  kernel = flat[tower + "embedding/kernel"]
  flat[tower + "embedding/kernel"] = kernel.reshape(-1, kernel.shape[-1])
  table = flat[tower + "pos_embedding"]
  flat[tower + "pos_embedding"] = table.reshape(*image.posemb_grid, table.shape[-1])


def save(path: str, params: Params, config: models.Settings) -> None:
  """Our tree of ``config`` written as a released big_vision `.npz` (`PREFIX`, per layer,
  float32): a NaFlex tower (`keeps_naflex_layout`) as ``naflex_vit``'s."""
  flat = to_theirs(params, config)
  if keeps_naflex_layout(config):
    _vit_as_naflex(flat, config)
  arrays = {PREFIX + k: v for k, v in flat.items()}
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "wb") as f:
    np.savez(f, **arrays)


def writer(
  model: Any,
  *,
  image_size: tuple[int, int],  # pylint: disable=unused-argument  (the arrays say it)
  class_names: Optional[list[str]],  # pylint: disable=unused-argument  (labels.txt: writers)
  data_config: data_config_lib.DataConfig,  # pylint: disable=unused-argument  (not stored)
) -> Callable[[str], None]:
  """What writes ``model`` (a `sources.LoadedModel`) into a folder: `EXPORT_FILE` and,
  for an image-text model with a SentencePiece tokenizer, its ``.model`` as
  `TOKENIZER_FILE` (found beside the file when read back)."""
  check_writable(model.config)
  proto = model.tokenizer.model_proto() if model.tokenizer is not None else None

  def write(directory: str) -> None:
    save(os.path.join(directory, EXPORT_FILE), model.params, model.config)
    if proto is not None:
      with open(os.path.join(directory, TOKENIZER_FILE), "wb") as f:
        f.write(proto)

  return write
