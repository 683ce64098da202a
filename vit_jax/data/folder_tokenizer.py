"""The tokenizer of a transformers checkpoint folder, giving the ids transformers' own
tokenizer gives with ``padding='max_length', truncation=True`` (what its zero-shot
pipeline and SigLIP's processors ask for).

    tokenizer = read_folder_tokenizer("path/to/siglip")   # tokenizer_config.json + files
    ids = tokenizer.encode(["a photo of a cat"], length=64)   # int32 [1, 64]

``tokenizer_config.json`` names the class and the special tokens; the vocabulary is
- ``spiece.model`` for ``SiglipTokenizer`` (transformers' SigLIP): read with
  `sentencepiece` after SigLIP's canonicalisation (lower case where ``do_lower_case``,
  ASCII punctuation removed, runs of white space made one space), the end token appended
  and kept last when truncating;
- ``tokenizer.json`` for every other class (CLIP, SigLIP 2's Gemma tokenizer): read with
  `tokenizers`, its own normalisation and special tokens, truncated and padded by that
  library as transformers does.
Padding takes the config's ``pad_token`` on the side its ``padding_side`` names (right
unless it says left; where it says nothing, transformers' class default: ``Siglip2Tokenizer``
and ``GemmaTokenizer``, SigLIP 2's, pad left).
Texts holding a special token's spelling (``</s>``) are tokenized as text here, where
transformers would split it out.
"""

from __future__ import annotations

import json
import os
import re
import string
from typing import Any, Hashable, Optional, Sequence

import numpy as np

from vit_jax.data import text_tokenizer
from vit_jax.infra import errors, input_files

CONFIG = "tokenizer_config.json"
SPIECE = "spiece.model"
SENTENCEPIECE_CLASSES = ("SiglipTokenizer",)  # read from SPIECE; any other: tokenizer.json
# transformers 5's classes whose padding_side attribute is 'left' (SigLIP 2 folders name
# GemmaTokenizer or Siglip2Tokenizer); a config's own padding_side is read first.
_LEFT_BY_DEFAULT = (
  "Siglip2Tokenizer", "GemmaTokenizer", "GemmaTokenizerFast", "LlamaTokenizer",
  "LlamaTokenizerFast", "CodeLlamaTokenizer", "CohereTokenizer", "XLNetTokenizer",
)  # fmt: skip
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def _token(value: Any) -> Optional[str]:
  """A special token as tokenizer_config.json writes it: a string or {'content': ...}."""
  if isinstance(value, dict):
    value = value.get("content")
  return value if isinstance(value, str) else None


class FolderTokenizer(text_tokenizer.Tokenizer):
  """A transformers folder's tokenizer (module docstring); ``eos_id`` is the end token's
  id (None: the tokenizer names none), ``pad_id`` the padding's."""

  def __init__(self, directory: str, config: dict[str, Any]):
    self.directory = directory
    self.tokenizer_class = str(config.get("tokenizer_class", ""))
    default_side = "left" if self.tokenizer_class in _LEFT_BY_DEFAULT else "right"
    self.padding_side = config.get("padding_side", default_side)
    if self.padding_side not in ("left", "right"):
      raise errors.CheckpointError(
        f"{os.path.join(directory, CONFIG)!r}: padding_side {self.padding_side!r} is not "
        "'left' or 'right'."
      )
    self._lower = bool(config.get("do_lower_case", True))
    pad, eos = _token(config.get("pad_token")), _token(config.get("eos_token"))
    if self.tokenizer_class in SENTENCEPIECE_CLASSES:
      self._init_sentencepiece(os.path.join(directory, SPIECE))
    else:
      self._init_tokenizers(os.path.join(directory, text_tokenizer.HF_FILE))
    self.eos_id = None if eos is None else self._id(eos)
    if pad is None:
      raise errors.CheckpointError(
        f"{os.path.join(directory, CONFIG)!r} names no pad_token: set one (e.g. the end "
        "token) so that texts pad to the model's length."
      )
    self.pad_id = self._id(pad)

  def _init_sentencepiece(self, path: str) -> None:
    import sentencepiece  # pylint: disable=g-import-not-at-top

    _exists(path, f"{self.tokenizer_class} reads its vocabulary from {SPIECE}")
    self._sp = sentencepiece.SentencePieceProcessor(model_file=path)
    self._hf = None
    self.vocab_size = self._sp.get_piece_size()
    self.vocabulary = text_tokenizer.digest(self._sp.serialized_model_proto())

  def _init_tokenizers(self, path: str) -> None:
    import tokenizers  # pylint: disable=g-import-not-at-top

    _exists(path, f"{self.tokenizer_class or 'this tokenizer'} reads {text_tokenizer.HF_FILE}")
    self._hf = tokenizers.Tokenizer.from_file(path)
    self._sp = None
    self.vocab_size = self._hf.get_vocab_size()
    self.vocabulary = text_tokenizer.digest(self._hf.to_str())  # before `encode` pads

  def _options(self) -> tuple[Hashable, ...]:
    return self.tokenizer_class, self.padding_side, self._lower, self.eos_id

  def _id(self, token: str) -> int:
    found = self._sp.piece_to_id(token) if self._sp is not None else self._hf.token_to_id(token)
    unknown = self._sp is not None and found == self._sp.unk_id() and token != "<unk>"
    if found is None or unknown:
      raise errors.CheckpointError(
        f"{self.directory!r}: the special token {token!r} of {CONFIG} is not in the vocabulary."
      )
    return int(found)

  def canonical(self, text: str) -> str:
    """SigLIP's text before SentencePiece (transformers' ``SiglipTokenizer``)."""
    text = text.lower() if self._lower else text
    return re.sub(r"\s+", " ", text.translate(_PUNCTUATION)).strip()

  def _ids(self, text: str) -> list[int]:
    if self._sp is not None:
      return list(self._sp.encode(self.canonical(text))) + [self.eos_id]
    self._hf.no_truncation(), self._hf.no_padding()  # what encode() set for its batch
    return self._hf.encode(text).ids

  def encode(self, texts: Sequence[str] | str, length: int) -> np.ndarray:
    if length <= 0:
      raise errors.ConfigError(f"text length={length} must be positive (e.g. 64).")
    texts = [texts] if isinstance(texts, str) else list(texts)
    if self._hf is not None:  # the library truncates and pads, keeping the special tokens
      self._hf.enable_truncation(max_length=length)
      self._hf.enable_padding(
        direction=self.padding_side, pad_id=self.pad_id, length=length,
        pad_token=self._hf.id_to_token(self.pad_id),
      )  # fmt: skip
      return np.asarray([e.ids for e in self._hf.encode_batch(texts)], np.int32).reshape(-1, length)
    out = np.full((len(texts), length), self.pad_id, np.int32)
    for row, text in enumerate(texts):
      ids = self._ids(text)
      ids = ids[: length - 1] + ids[-1:] if len(ids) > length else ids  # the end token stays
      if self.padding_side == "right":
        out[row, : len(ids)] = ids
      else:
        out[row, length - len(ids) :] = ids
    return out


def _exists(path: str, why: str) -> None:
  if not os.path.isfile(path):
    raise errors.CheckpointError(
      f"No {os.path.basename(path)} in {os.path.dirname(path)!r} ({why}): save the "
      "tokenizer into the folder with the model (processor.save_pretrained(folder))."
    )


def read_folder_tokenizer(directory: str) -> FolderTokenizer:
  """The tokenizer saved in a transformers checkpoint folder; a missing or unreadable one
  is one `CheckpointError` naming the file and the fix."""
  path = os.path.join(directory, CONFIG)
  if not os.path.isfile(path):
    raise errors.CheckpointError(
      f"No {CONFIG} in {directory!r}: an image-text checkpoint needs its tokenizer; save "
      "it into the folder (processor.save_pretrained(folder) or "
      "tokenizer.save_pretrained(folder))."
    )
  try:
    text = input_files.read_text(path, what="tokenizer config", error=errors.CheckpointError)
    config = json.loads(text)
  except json.JSONDecodeError as e:
    raise errors.CheckpointError(f"{path!r} is not valid JSON ({e}).") from None
  if not isinstance(config, dict):
    raise errors.CheckpointError(f"{path!r} is not a JSON object: not a tokenizer config.")
  try:
    return FolderTokenizer(directory, config)
  except ImportError as e:
    raise errors.UserError(f"Reading {path!r} needs {e.name}: pip install -e '.[text]'.") from None
  except (RuntimeError, OSError, ValueError) as e:
    if isinstance(e, errors.UserError):
      raise
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise errors.CheckpointError(
      f"The tokenizer in {directory!r} could not be read: {first}"
    ) from None
