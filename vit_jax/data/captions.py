"""Captions made from class labels, and the word tokenizer trained on them, in code.

A labelled dataset (the built-in `digits`, any tfds classification set, a folder of
classes) becomes image-text data: each example's caption is one of a set of prompt
templates filled with its class's words ("a photo of the digit seven."). Nothing is
downloaded: the tokenizer is a word-level `tokenizers` model whose vocabulary is every
word of those captions, sorted (so it is the same on every machine and every process),
and it writes a standard ``tokenizer.json`` that `tokenizer_kinds.load_tokenizer` reads back.

Which template an example gets is a hash of (seed, step, global row) in training and of
the example's index in evaluation: the same on resume and for any process count, as the
images are (`pipeline`).

    captions = Captions(class_names, "digits", length=16)
    ids = captions.train_ids(labels, step=3, first_row=0, seed=0)   # int32 [B, 16]
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from vit_jax.data import text_tokenizer
from vit_jax.infra import errors

# Prompt templates by name ('{}' is the class's words). 'digits': the captions the digits
# are trained on. 'clip': the 7 ImageNet templates that CLIP's prompt-engineering notebook
# ensembles (ImageNet's class names ship with the package:
# `vit_jax.weights.sources.imagenet2012_class_names`).
TEMPLATES: dict[str, tuple[str, ...]] = {
  "digits": (
    "a photo of the digit {}.",
    "a photo of the number {}.",
    "a handwritten {}.",
    "the digit {}.",
    "a picture of a handwritten {}.",
    "a blurry photo of the digit {}.",
    "a scan of the number {}.",
    "{}.",
  ),
  "clip": (
    "itap of a {}.",
    "a bad photo of the {}.",
    "a origami {}.",
    "a photo of the large {}.",
    "a {} in a video game.",
    "art of the {}.",
    "a photo of the small {}.",
  ),
}
PAD, UNK, EOS = "<pad>", "<unk>", "<eos>"
_NUMBERS = "zero one two three four five six seven eight nine".split()


def check_templates(name: str) -> tuple[str, ...]:
  if name not in TEMPLATES:
    raise errors.ConfigError(
      f"Unknown config.contrastive.templates={name!r}; choose one of {tuple(TEMPLATES)}."
    )
  return TEMPLATES[name]


def class_words(names: Sequence[str]) -> list[str]:
  """A class name as words: a single digit spelled out ('7' -> 'seven'), underscores
  as spaces ('golden_retriever' -> 'golden retriever')."""
  return [_NUMBERS[int(n)] if re.fullmatch(r"\d", n) else n.replace("_", " ") for n in names]


def prompts(names: Sequence[str], templates: Sequence[str]) -> list[list[str]]:
  """[K][T] captions: every template filled with every class's words."""
  return [[t.format(w) for t in templates] for w in class_words(names)]


class CaptionTokenizer(text_tokenizer.HuggingFaceTokenizer):
  """A word-level tokenizer over the words of ``texts``: lowercased, split on spaces and
  punctuation, ids 0 (pad), 1 (unknown word), 2 (end, appended to every text), then the
  words in sorted order."""

  def __init__(self, texts: Sequence[str]):  # pylint: disable=super-init-not-called
    import tokenizers  # pylint: disable=g-import-not-at-top
    from tokenizers import models, normalizers, pre_tokenizers, processors

    split = pre_tokenizers.Whitespace()
    words = sorted({w for t in texts for w, _ in split.pre_tokenize_str(t.lower())})
    vocab = {token: i for i, token in enumerate([PAD, UNK, EOS, *words])}
    self._tokenizer = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    self._tokenizer.normalizer = normalizers.Lowercase()
    self._tokenizer.pre_tokenizer = split
    self._tokenizer.post_processor = processors.TemplateProcessing(
      single=f"$A {EOS}", special_tokens=[(EOS, vocab[EOS])]
    )
    self.vocab_size, self.pad_id, self.unk_id = len(vocab), vocab[PAD], vocab[UNK]
    self.vocabulary = text_tokenizer.digest(self._tokenizer.to_str())

  def save(self, path: str) -> None:
    """Writes ``tokenizer.json`` (`tokenizer_kinds.load_tokenizer` reads it)."""
    self._tokenizer.save(path)


def mix(*keys: np.ndarray) -> np.ndarray:
  """A splitmix64 hash of integer arrays (broadcast): uint64."""
  h = np.zeros(np.broadcast(*keys).shape, np.uint64)
  with np.errstate(over="ignore"):
    for k in keys:
      h = h ^ np.asarray(k, np.uint64)
      h = (h + np.uint64(0x9E3779B97F4A7C15)) * np.uint64(0xBF58476D1CE4E5B9)
      h = h ^ (h >> np.uint64(31))
  return h


class Captions:
  """The captions of a labelled dataset, pre-tokenized: [K, T, length] ids; by
  ``tokenizer`` (a run's, for another dataset's prompts) or one trained on them."""

  def __init__(
    self,
    class_names: Sequence[str],
    templates: str,
    length: int,
    tokenizer: text_tokenizer.Tokenizer | None = None,
  ):
    self.templates = check_templates(templates)
    self.texts = prompts(class_names, self.templates)  # [K][T]
    self.tokenizer = tokenizer or CaptionTokenizer([t for row in self.texts for t in row])
    flat = self.tokenizer.encode([t for row in self.texts for t in row], length)
    self.ids = flat.reshape(len(self.texts), len(self.templates), length)  # [K, T, L]

  def _ids(self, labels: np.ndarray, choice: np.ndarray) -> np.ndarray:
    classes = np.argmax(labels, axis=-1)  # one-hot [B, K] -> [B]
    return self.ids[classes, (choice % np.uint64(len(self.templates))).astype(np.int64)]

  def train_ids(self, labels: np.ndarray, *, step: int, first_row: int, seed: int) -> np.ndarray:
    """int32 [B, L]: row r of the global batch of ``step`` (this process's rows start at
    ``first_row``) captioned by the template its (seed, step, row) hash picks."""
    rows = first_row + np.arange(len(labels))
    return self._ids(labels, mix(np.int64(seed), np.int64(step), rows))

  def eval_ids(self, labels: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """int32 [B, L]: the example of split index i captioned by template i mod T."""
    return self._ids(labels, np.asarray(indices, np.uint64))
