"""The official repository's LiT checkpoints (`vit_jax/models_lit.py`): one `.npz` with an
image tower ``img/``, a text tower ``txt/`` and the log temperature ``t``, and beside it
the SentencePiece vocabulary ``<name>.model``.

What they are here: ``img/`` is the official ViT's tree (read as any official `.npz`;
with ``out_dim[0]`` set its ``img/head`` is the image projection, our ``img_head``, else
the class token's features are the embedding: ``image_head='none'``); ``txt/`` is
models_lit's ``TextTransformer`` (``Embed_0``, ``pos_embedding``, ``Encoder_0`` with the
official blocks and ``encoder_norm``, the last position, ``head``): ours name for name
(big_vision's own text tower numbers its blocks' modules otherwise: `weights.big_vision`);
``t`` ours; no bias (LiT's softmax loss). The tokenizer appends the end token, keeps it
last when truncating and pads with it (models_lit's ``SentencepieceTokenizer``); the text
length is the position table's (16).
Not read: the BERT text towers (LiT-B16B, LiT-L16L: flaxformer's BERT).
"""

from __future__ import annotations

import math
import os
from typing import Mapping, Optional

import numpy as np
from flax import traverse_util

from vit_jax import models
from vit_jax.data import text_tokenizer
from vit_jax.infra import errors
from vit_jax.infra.aliases import Params
from vit_jax.weights import architecture, npz

_BLOCK = "txt/Encoder_0/encoderblock_"
_TOWERS = {"img", "txt", "t"}  # models_lit's layout: an image and a text tower, ``t``


def detect(path: str) -> bool:
  """Whether ``path`` is a LiT `.npz` (its keys' layout, read from the archive's listing;
  not our image-text export, which has its model config beside it)."""
  if not os.path.isfile(path) or os.path.isfile(npz.config_path(path)):
    return False
  return _TOWERS <= npz.top_keys(path)


def read_file(path: str) -> tuple[models.Settings, Params, Optional[tuple[int, int]]]:
  """(two-tower model config, our tree, image size) of the LiT `.npz` at ``path``."""
  config, params = read(npz.scanned_to_layers(npz.load_npz(path)), repr(path))
  image, image_params = models.image_settings(config), models.image_params(params, config)
  return config, params, architecture.trained_image_size(image_params, image)


def _shape(flat: Mapping[str, np.ndarray], key: str, source: str) -> tuple[int, ...]:
  if key not in flat:
    raise errors.CheckpointError(f"{source}: LiT text tower without {key!r}: not models_lit's.")
  return tuple(flat[key].shape)


def read(params: Params, source: str) -> tuple[models.TwoTowerSettings, Params]:
  """(two-tower model config, our tree) of a LiT `.npz` tree; BERT towers refused."""
  flat = traverse_util.flatten_dict(params, sep="/")
  if "txt/Embed_0/embedding" not in flat:
    raise errors.CheckpointError(
      f"{source}: a LiT text tower without Embed_0 (a BERT tower, LiT-B16B or LiT-L16L, "
      "flaxformer's), which this package does not compute; the LiT-L16S and LiT-L16Ti "
      "text transformers are read."
    )
  vocab, width = _shape(flat, "txt/Embed_0/embedding", source)
  depth = len({k[len(_BLOCK) :].split("/")[0] for k in flat if k.startswith(_BLOCK)})
  block = f"{_BLOCK}0/"
  heads = _shape(flat, block + "MultiHeadDotProductAttention_1/query/kernel", source)[1]
  mlp = _shape(flat, block + "MlpBlock_3/Dense_0/kernel", source)[1]
  length = _shape(flat, "txt/pos_embedding", source)[1]
  embed = _shape(flat, "txt/head/kernel", source)[1]
  image_params = dict(params["img"])
  head = image_params.pop("head", None)
  image = architecture.infer_settings(image_params)
  settings = models.two_tower_settings(
    image,
    text=dict(width=width, depth=depth, mlp_dim=mlp, num_heads=heads, vocab_size=vocab),
    text_len=length,
    embed_dim=embed,
    loss="softmax",
    name="LiT",
    image_head="none" if head is None else "dense",
  )
  t = float(math.exp(float(np.asarray(params["t"]).reshape(-1)[0])))
  ours = {**params, "img": image_params}
  if head is not None:
    ours["img_head"] = head
  return settings.replace(temperature_init=t), ours


def read_tokenizer(path: str) -> Optional[text_tokenizer.Tokenizer]:
  """The vocabulary beside LiT `.npz` ``path`` (``<stem>.model``) as models_lit tokenizes
  (the end token appended, kept last, and the padding); None when there is none."""
  vocab = os.path.splitext(path)[0] + ".model"
  if not os.path.isfile(vocab):
    return None
  import sentencepiece  # pylint: disable=g-import-not-at-top

  tokenizer = text_tokenizer.read_sentencepiece(vocab, eos="sticky")
  # models_lit pads with the end token
  tokenizer.pad_id = sentencepiece.SentencePieceProcessor(model_file=vocab).eos_id()
  return tokenizer
