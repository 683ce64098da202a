"""Text to fixed-length token ids for an image-text model's text tower.

    tokenizer = read_sentencepiece("path/to/spiece.model")   # or read_hugging_face(...)
    ids = tokenizer.encode(["a photo of a cat", "a dog"], length=64)   # int32 [2, 64]

Two formats, each read by its own library (the `text` extra); which one a path holds is
`tokenizer_kinds`' question:
- SentencePiece models (``*.model``: big_vision's SigLIP and LiT, T5, Gemma) through
  `sentencepiece`;
- Hugging Face ``tokenizer.json`` (CLIP, SigLIP 2 through transformers, most hub
  checkpoints) through `tokenizers`, with the file's own pre- and post-processing (CLIP's
  start and end tokens included).

Every text becomes exactly ``length`` ids: longer ones are truncated, shorter ones padded
with the tokenizer's pad id (0 where it names none). ``eos``, for SentencePiece models
(whose encoders add no end token): 'none' adds nothing; 'yes' appends the end token, which
truncation may cut; 'sticky' (big_vision's SigLIP) keeps it as the last id even then.
``lower`` lower-cases ASCII letters first (big_vision's default, `tf.strings.lower`, which
leaves other letters as they are); ``pad_id`` replaces the model's pad piece (big_vision's
SigLIP pads with id 1, its end token).
"""

from __future__ import annotations

import abc
import hashlib
import os
from typing import Any, Callable, Hashable, Optional, Sequence

import numpy as np

from vit_jax.infra import errors

EOS_MODES = ("none", "yes", "sticky")
HF_FILE = "tokenizer.json"
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def check_eos(eos: str) -> None:
  if eos not in EOS_MODES:
    raise errors.ConfigError(f"eos={eos!r}: choose one of {EOS_MODES}.")


def digest(vocabulary: bytes | str) -> str:
  """A vocabulary's serialised form as a short value (what `Tokenizer.fingerprint` holds)."""
  data = vocabulary.encode() if isinstance(vocabulary, str) else vocabulary
  return hashlib.sha256(data).hexdigest()


class Tokenizer(abc.ABC):
  """Texts -> int32 [N, length] ids, padded with `pad_id`."""

  pad_id: int
  vocab_size: int
  vocabulary: str  # `digest` of the vocabulary as read (before any padding is set on it)

  def fingerprint(self) -> tuple[Hashable, ...]:
    """The tokenizer by value (class, vocabulary, options): equal for two reads of one
    file, so that two loads of one model are one JAX type (`vit_jax.api.model_facts`)."""
    return (type(self).__qualname__, self.vocabulary, self.pad_id, *self._options())

  def _options(self) -> tuple[Hashable, ...]:
    """What changes the ids besides the vocabulary."""
    return ()

  def model_proto(self) -> Optional[bytes]:
    """A SentencePiece model's bytes (what big_vision's export writes beside the weights);
    None for other kinds."""
    return None

  def hugging_face(self) -> Optional[Any]:
    """The `tokenizers.Tokenizer` of a ``tokenizer.json`` (what the hf export writes as
    transformers files); None for other kinds."""
    return None

  @abc.abstractmethod
  def _ids(self, text: str) -> list[int]:
    """One text's ids, with whatever start and end tokens the format adds."""

  def _fit(self, ids: list[int], length: int) -> list[int]:
    return ids[:length]

  def num_ids(self, text: str) -> int:
    """How many ids ``text`` has before `encode` fits it to a length."""
    return len(self._ids(text))

  def encode(self, texts: Sequence[str] | str, length: int) -> np.ndarray:
    if length <= 0:
      raise errors.ConfigError(f"text length={length} must be positive (e.g. 64).")
    texts = [texts] if isinstance(texts, str) else list(texts)
    out = np.full((len(texts), length), self.pad_id, np.int32)
    for row, text in enumerate(texts):
      ids = self._fit(self._ids(text), length)
      out[row, : len(ids)] = ids
    return out


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece ``.model``; ``eos``, ``lower`` and ``pad_id`` as the module says."""

  def __init__(
    self, path: str, eos: str = "none", *, lower: bool = False, pad_id: Optional[int] = None
  ):
    import sentencepiece  # pylint: disable=g-import-not-at-top

    check_eos(eos)
    self._model = sentencepiece.SentencePieceProcessor(model_file=path)
    self._eos = eos
    self._lower = lower
    self.vocab_size = self._model.get_piece_size()
    self.vocabulary = digest(self._model.serialized_model_proto())
    # -1: the model has no pad piece
    self.pad_id = max(self._model.pad_id(), 0) if pad_id is None else pad_id

  def model_proto(self) -> bytes:
    """The ``.model`` file's bytes (what an export writes beside the weights)."""
    return self._model.serialized_model_proto()

  def _options(self) -> tuple[Hashable, ...]:
    return self._eos, self._lower

  def _ids(self, text: str) -> list[int]:
    ids = self._model.encode(text.translate(_ASCII_LOWER) if self._lower else text)
    return ids + [self._model.eos_id()] if self._eos != "none" else ids

  def _fit(self, ids: list[int], length: int) -> list[int]:
    if self._eos == "sticky" and len(ids) > length:
      return ids[: length - 1] + [self._model.eos_id()]
    return ids[:length]


class HuggingFaceTokenizer(Tokenizer):
  """A ``tokenizer.json``, with its own normalisation and special tokens."""

  def __init__(self, path: str):
    import tokenizers  # pylint: disable=g-import-not-at-top

    self._tokenizer = tokenizers.Tokenizer.from_file(path)
    self._tokenizer.no_padding()
    self._tokenizer.no_truncation()
    self.vocab_size = self._tokenizer.get_vocab_size()
    self.vocabulary = digest(self._tokenizer.to_str())
    padding = self._tokenizer.padding
    self.pad_id = int(padding["pad_id"]) if padding else 0

  def hugging_face(self) -> Any:
    return self._tokenizer

  def _ids(self, text: str) -> list[int]:
    return self._tokenizer.encode(text).ids


def _read(path: str, eos: str, make: Callable[[], Tokenizer]) -> Tokenizer:
  """``make()``, the tokenizer in the file ``path``; a missing or unreadable one is one
  error naming it."""
  check_eos(eos)
  if not os.path.isfile(path):
    raise errors.MissingError(f"Tokenizer file {path!r} does not exist: name an existing file.")
  try:
    return make()
  except ImportError as e:
    raise errors.UserError(f"Reading {path!r} needs {e.name}: pip install -e '.[text]'.") from None
  except (RuntimeError, OSError, ValueError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise errors.InputFileError(f"Tokenizer {path!r} could not be read: {first}") from None


def read_sentencepiece(
  path: str, eos: str = "none", *, lower: bool = False, pad_id: Optional[int] = None
) -> Tokenizer:
  """The SentencePiece model in the file ``path``, with ``eos``, ``lower`` and ``pad_id``."""
  return _read(path, eos, lambda: SentencePieceTokenizer(path, eos, lower=lower, pad_id=pad_id))


def read_hugging_face(
  path: str, eos: str = "none", *, lower: bool = False, pad_id: Optional[int] = None
) -> Tokenizer:
  """The ``tokenizer.json`` file ``path`` (``eos`` is checked; the file says the rest)."""
  del lower, pad_id
  return _read(path, eos, lambda: HuggingFaceTokenizer(path))
