"""The kinds of tokenizer a text tower reads, one `Kind` record each: how a path is
recognised as one, the files that hold it, how it pads, and whether ``config.text``'s
SentencePiece options apply. Every reader asks here, so a kind is detected in one place:

    kind, tokenizer = load("path/to/checkpoint")   # a folder, a .model or tokenizer.json
    files("path/to/checkpoint")                   # what says how it splits (a run's identity)

Adding a kind is its reader module and one record in `KINDS`, placed before any kind whose
``find`` would also claim its paths (with ``file`` set, `load_tokenizer` reads it too).
"""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import Callable, Optional

from vit_jax.data import folder_tokenizer, text_tokenizer
from vit_jax.data.folder_tokenizer import CONFIG, SPIECE
from vit_jax.data.text_tokenizer import HF_FILE, Tokenizer
from vit_jax.infra import errors

SPECIAL_TOKENS = "special_tokens_map.json"  # saved by transformers beside its tokenizer

# (what ``find`` gave, eos, lower, pad_id) -> the tokenizer
Reader = Callable[[str, str, bool, Optional[int]], Tokenizer]


@dataclasses.dataclass(frozen=True)
class Kind:
  """One kind of tokenizer."""

  name: str  # in words, for messages
  files: tuple[str, ...]  # in a folder: the files (glob patterns) its reader reads
  find: Callable[[str], Optional[str]]  # a path -> what its reader reads (None: not one)
  read: Reader
  padding: str  # where its pad id comes from, in words
  options: bool = False  # config.text's lower and pad_id apply (a SentencePiece model)
  # Files saved beside it that also say how it splits (hashed by `files`, not read).
  sidecars: tuple[str, ...] = ()
  # Read from one file, or a folder holding one (`load_tokenizer`'s kinds): how a message
  # names that file; None for a kind that is a whole folder.
  file: Optional[str] = None


def _folder(path: str) -> Optional[str]:
  return path if os.path.isfile(os.path.join(path, CONFIG)) else None


def _hugging_face(path: str) -> Optional[str]:
  if os.path.isdir(path):
    return os.path.join(path, HF_FILE) if os.path.isfile(os.path.join(path, HF_FILE)) else None
  return path if os.path.isfile(path) and path.endswith(".json") else None


def _sentencepiece(path: str) -> Optional[str]:
  if os.path.isdir(path):
    found = sorted(glob.glob(os.path.join(glob.escape(path), "*.model")))
    return found[0] if found else None
  return path if os.path.isfile(path) and not path.endswith(".json") else None


def _read_folder(path: str, eos: str, lower: bool, pad_id: Optional[int]) -> Tokenizer:
  del eos, lower, pad_id  # its tokenizer_config.json says how it splits
  return folder_tokenizer.read_folder_tokenizer(path)


def _read_hugging_face(path: str, eos: str, lower: bool, pad_id: Optional[int]) -> Tokenizer:
  return text_tokenizer.read_hugging_face(path, eos, lower=lower, pad_id=pad_id)


def _read_sentencepiece(path: str, eos: str, lower: bool, pad_id: Optional[int]) -> Tokenizer:
  return text_tokenizer.read_sentencepiece(path, eos, lower=lower, pad_id=pad_id)


# A transformers checkpoint folder: the ids its processor gives (`folder_tokenizer`).
FOLDER = Kind(
  name="a transformers tokenizer folder",
  files=(CONFIG, SPIECE, HF_FILE),
  find=_folder,
  read=_read_folder,
  padding="its pad_token, on its padding_side",
  sidecars=(SPECIAL_TOKENS, "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt"),
)
HUGGING_FACE = Kind(
  name=f"a Hugging Face {HF_FILE}",
  files=(HF_FILE,),
  find=_hugging_face,
  read=_read_hugging_face,
  padding="the file's pad id (0 where it names none)",
  file=f"a {HF_FILE}",
)
SENTENCEPIECE = Kind(
  name="a SentencePiece .model",
  files=("*.model",),
  find=_sentencepiece,
  read=_read_sentencepiece,
  padding="its pad piece (0 where it has none), or config.text.pad_id",
  options=True,
  file="a SentencePiece .model",
)
KINDS: tuple[Kind, ...] = (FOLDER, HUGGING_FACE, SENTENCEPIECE)  # tried in this order
FILE_KINDS: tuple[Kind, ...] = tuple(k for k in KINDS if k.file)  # one file, or a folder's


def file_kinds_in_words() -> str:
  """The files a tokenizer path may name, in words: 'a tokenizer.json or a ...'."""
  names = [k.file for k in FILE_KINDS]
  return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def detect(path: str, kinds: tuple[Kind, ...] = KINDS) -> tuple[Kind, str]:
  """The first of ``kinds`` that claims ``path``, and what its reader reads; none is one
  `MissingError` naming what a tokenizer folder or path needs."""
  for kind in kinds:
    found = kind.find(path)
    if found is not None:
      return kind, found
  if os.path.isdir(path):
    raise errors.MissingError(
      f"No tokenizer in {path!r}: it needs {file_kinds_in_words()} file "
      "(the checkpoint's tokenizer, saved beside its weights)."
    )
  raise errors.MissingError(f"Tokenizer {path!r} does not exist: name {file_kinds_in_words()}.")


def load(
  path: str,
  eos: str = "none",
  *,
  lower: bool = False,
  pad_id: Optional[int] = None,
  kinds: tuple[Kind, ...] = KINDS,
) -> tuple[Kind, Tokenizer]:
  """The tokenizer at ``path`` (`detect`) read by its kind, and the kind."""
  kind, found = detect(path, kinds)
  return kind, kind.read(found, eos, lower, pad_id)


def load_tokenizer(
  path: str, eos: str = "none", *, lower: bool = False, pad_id: Optional[int] = None
) -> Tokenizer:
  """The tokenizer in ``path``: a ``.model`` or ``tokenizer.json`` file, or a folder that
  holds one (``tokenizer.json`` first; `FILE_KINDS`); ``eos``, ``lower`` and ``pad_id``
  apply to a SentencePiece model."""
  text_tokenizer.check_eos(eos)
  return load(path, eos, lower=lower, pad_id=pad_id, kinds=FILE_KINDS)[1]


def files(path: str) -> list[str]:
  """The files that say how the tokenizer at ``path`` splits text: the file itself, or in a
  folder every kind's files and sidecars, sorted."""
  if not os.path.isdir(path):
    return [path]
  names = {name for kind in KINDS for name in (*kind.files, *kind.sidecars)}
  pattern = lambda name: os.path.join(glob.escape(path), name)  # noqa: E731
  return sorted({f for name in names for f in glob.glob(pattern(name))})
