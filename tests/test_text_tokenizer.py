"""Tokenizers read from a checkpoint folder: a SentencePiece model and a tokenizer.json,
each trained here, against their own libraries' encodings, padded and truncated."""

from __future__ import annotations

import io

import numpy as np
import pytest

from vit_jax.data import tokenizer_kinds
from vit_jax.infra import errors

sentencepiece = pytest.importorskip("sentencepiece")
tokenizers = pytest.importorskip("tokenizers")

CORPUS = [
  "a photo of a cat",
  "a photo of a dog on the grass",
  "two cats sleeping on a red sofa",
  "a small bird on a branch",
  "the quick brown fox jumps over the lazy dog",
] * 20


@pytest.fixture(scope="module")
def spm_path(tmp_path_factory):
  model = io.BytesIO()
  sentencepiece.SentencePieceTrainer.train(
    sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=36,
    pad_id=0, unk_id=1, bos_id=-1, eos_id=2,
  )  # fmt: skip
  path = tmp_path_factory.mktemp("spm") / "tokenizer.model"
  path.write_bytes(model.getvalue())
  return str(path)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
  from tokenizers import models, pre_tokenizers, processors, trainers

  tok = tokenizers.Tokenizer(models.WordLevel(unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.train_from_iterator(
    CORPUS, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "<s>", "</s>"])
  )
  tok.post_processor = processors.TemplateProcessing(
    single="<s> $A </s>", special_tokens=[("<s>", 2), ("</s>", 3)]
  )
  tok.enable_padding(pad_id=0, pad_token="[PAD]", length=99)  # the reader pads on its own
  folder = tmp_path_factory.mktemp("hf")
  tok.save(str(folder / "tokenizer.json"))
  return str(folder)


def test_sentencepiece_ids_are_the_librarys_padded(spm_path):
  reference = sentencepiece.SentencePieceProcessor(model_file=spm_path)
  tok = tokenizer_kinds.load_tokenizer(spm_path)
  ids = tok.encode(["a photo of a cat", "two cats"], length=20)
  assert ids.dtype == np.int32 and ids.shape == (2, 20)
  for row, text in zip(ids, ["a photo of a cat", "two cats"]):
    want = reference.encode(text)
    assert list(row[: len(want)]) == want and set(row[len(want) :]) == {0}


def test_sentencepiece_end_token_yes_and_sticky(spm_path):
  text = "the quick brown fox jumps over the lazy dog"
  plain = sentencepiece.SentencePieceProcessor(model_file=spm_path).encode(text)
  length = len(plain) - 2  # shorter than the text
  yes = tokenizer_kinds.load_tokenizer(spm_path, eos="yes").encode(text, length)[0]
  sticky = tokenizer_kinds.load_tokenizer(spm_path, eos="sticky").encode(text, length)[0]
  assert list(yes) == plain[:length]  # truncation cut the end token
  assert list(sticky) == plain[: length - 1] + [2]  # kept as the last id
  long = tokenizer_kinds.load_tokenizer(spm_path, eos="yes").encode(text, len(plain) + 3)[0]
  assert list(long[: len(plain) + 1]) == plain + [2] and long[-1] == 0


def test_tokenizer_json_ids_are_the_librarys_with_its_special_tokens(hf_folder):
  tok = tokenizer_kinds.load_tokenizer(hf_folder)  # a folder: finds tokenizer.json
  ids = tok.encode("a photo of a dog", length=10)[0]
  reference = tokenizers.Tokenizer.from_file(f"{hf_folder}/tokenizer.json")
  reference.no_padding()
  want = reference.encode("a photo of a dog").ids
  assert want[0] == 2 and want[-1] == 3  # <s> ... </s>
  assert list(ids) == want + [0] * (10 - len(want))
  assert list(tok.encode("a photo of a dog", length=3)[0]) == want[:3]


def test_bad_tokenizer_sources_are_one_clear_error(tmp_path, spm_path):
  with pytest.raises(errors.MissingError, match="needs a tokenizer.json or a SentencePiece"):
    tokenizer_kinds.load_tokenizer(str(tmp_path))
  (tmp_path / "broken.model").write_bytes(b"not a model")
  with pytest.raises(errors.InputFileError, match="could not be read"):
    tokenizer_kinds.load_tokenizer(str(tmp_path / "broken.model"))
  with pytest.raises(errors.ConfigError, match="eos='always'"):
    tokenizer_kinds.load_tokenizer(spm_path, eos="always")
  with pytest.raises(errors.ConfigError, match="length=0 must be positive"):
    tokenizer_kinds.load_tokenizer(spm_path).encode("a cat", 0)


def test_each_kind_is_detected_by_its_one_record(tmp_path):
  """A transformers folder, a tokenizer.json (first in a folder), a .model; their files."""
  folder, plain = tmp_path / "transformers", tmp_path / "plain"
  folder.mkdir(), plain.mkdir()
  for name in ("tokenizer_config.json", "tokenizer.json", "vocab.json", "notes.txt"):
    (folder / name).write_text("{}")
  (plain / "b.model").write_bytes(b""), (plain / "a.model").write_bytes(b"")
  kinds = tokenizer_kinds
  assert kinds.detect(str(folder)) == (kinds.FOLDER, str(folder))
  assert kinds.detect(str(folder), kinds.FILE_KINDS)[0] is kinds.HUGGING_FACE
  assert kinds.detect(str(plain)) == (kinds.SENTENCEPIECE, str(plain / "a.model"))
  assert kinds.detect(str(plain / "b.model"))[0] is kinds.SENTENCEPIECE
  assert kinds.detect(str(folder / "tokenizer.json"))[0] is kinds.HUGGING_FACE
  names = ["tokenizer.json", "tokenizer_config.json", "vocab.json"]
  assert kinds.files(str(folder)) == [str(folder / n) for n in names]  # not notes.txt
  with pytest.raises(errors.MissingError, match="does not exist"):
    kinds.detect(str(tmp_path / "absent.model"))
