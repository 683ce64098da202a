"""Image-text data whose captions are free text: what its sources share.

Three sources read images with their own captions (``config.text.tokenizer`` set):
a tfds dataset with a text feature (`tfds_source`, e.g. ``coco_captions``), a folder
with a captions file (``captions:ROOT``, `caption_folder`) and WebDataset tar shards
(``wds:ROOT``, `tar_shards`). Each split's ``read`` returns (values, labels, captions):
captions an object array of tuples of strings, one tuple (one or more captions) per
example. The reader picks one caption per example and epoch (`choose`), and the pipeline
tokenizes the batch's captions (`load_tokenizer`) to int32 [B, config.model.text_len].

    choose(captions, uids, seed)   # uids = epoch * n + index: a new pick every epoch
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from vit_jax.data import captions as captions_lib
from vit_jax.data import filesystems, text_tokenizer, tokenizer_kinds
from vit_jax.data import splits as splits_lib
from vit_jax.infra import errors

KEY = "config.text.tokenizer"


def choose(captions: np.ndarray, uids: np.ndarray, seed: int | None) -> np.ndarray:
  """bytes object [k]: the caption of each example that (seed, uid) picks among its own;
  ``seed`` None (evaluation) picks each example's first. The uid holds the epoch and the
  index in the split, not the process or the step: resumed and multi-process runs pick
  the same captions."""
  if seed is None:
    picks = np.zeros(len(captions), np.int64)
  else:
    counts = np.array([len(c) for c in captions], np.uint64)
    picks = (captions_lib.mix(np.int64(seed), np.asarray(uids, np.int64)) % counts).astype(np.int64)
  out = np.empty(len(captions), object)
  out[:] = [c[int(p)].encode("utf-8") for c, p in zip(captions, picks)]
  return out


def as_captions(value: Any, where: str) -> tuple[str, ...]:
  """One example's captions (a string, or a list of strings) as a tuple of non-empty
  strings; anything else is an error naming ``where`` (a file, a line, a tar member)."""
  texts = [value] if isinstance(value, str) else value
  if not isinstance(texts, (list, tuple)) or not texts:
    raise errors.InputFileError(
      f"{where}: no caption (got {value!r}); give each image a non-empty caption text."
    )
  out = tuple(t.strip() for t in texts if isinstance(t, str))
  if len(out) != len(texts) or not all(out):
    raise errors.InputFileError(
      f"{where}: an empty or non-text caption in {value!r}; every caption must be non-empty text."
    )
  return out


def captions_array(rows: list[tuple[str, ...]]) -> np.ndarray:
  """An object array [n] whose items are the tuples themselves (numpy would otherwise
  make a 2-D array of equally long tuples)."""
  out = np.empty(len(rows), object)
  out[:] = rows
  return out


def load_tokenizer(
  path: str | None, eos: str, *, lower: bool = False, pad_id: Optional[int] = None
) -> text_tokenizer.Tokenizer:
  """The tokenizer ``config.text.tokenizer`` names (a folder, a ``.model`` or a
  ``tokenizer.json``); a missing one is one error naming the key. A transformers folder
  (with ``tokenizer_config.json``: a SigLIP, SigLIP 2 or CLIP checkpoint) gives the ids
  transformers' own tokenizer gives (`folder_tokenizer`), as its text tower was trained.
  ``eos``, ``lower`` and ``pad_id`` (``config.text.*``) apply to a SentencePiece model."""
  if not path:
    raise errors.ConfigError(
      f"{KEY} is not set: data with free-text captions needs the text tower's tokenizer, "
      f"e.g. --{KEY}=/path/to/spiece.model (or a tokenizer.json, or their folder)."
    )
  try:
    kind, tokenizer = tokenizer_kinds.load(path, eos, lower=lower, pad_id=pad_id)
  except errors.UserError as e:
    raise type(e)(f"{KEY}={path!r}: {e}") from None
  if (lower or pad_id is not None) and not kind.options:
    raise errors.ConfigError(
      f"config.text.lower={lower} / config.text.pad_id={pad_id} apply to a SentencePiece "
      f".model, not to {KEY}={path!r}, {kind.name}: leave them unset (its own files say "
      f"how it splits and pads: {kind.padding})."
    )
  return tokenizer


def check_root(root: str, what: str, prefix: str, layout: str) -> str:
  """``root`` of ``config.dataset = prefix + root`` if it is a folder, else one error
  naming it and the ``layout`` it needs."""
  if not filesystems.isdir(root):
    raise errors.MissingError(
      f"{what} {root!r} does not exist. config.dataset = '{prefix}<root>' needs {layout}."
    )
  return root


class CaptionedSplit(splits_lib.RangedSplit):
  """A configured split of a source of free text: ``rows(split, start, stop)`` gives
  (values [k], captions [k]) of a named split; labels are zeros (no classes)."""

  def __init__(
    self,
    name: str,
    ranges: list[splits_lib.Range],
    rows: Callable[[str, int, int], tuple[np.ndarray, np.ndarray]],
    kind: str,
  ):
    super().__init__(name, ranges)
    self._rows_of, self.kind = rows, kind

  def _rows(self, split: str, start: int, stop: int) -> tuple[np.ndarray, ...]:
    values, captions = self._rows_of(split, start, stop)
    return values, np.zeros(len(values), np.int64), captions
