"""Image-text data with free-text captions: caption folders, WebDataset tar shards and tfds
datasets with a text feature keep the pipeline's guarantees (a resumed stream equals an
uninterrupted one, two processes see the global batch one process sees), each image
travels with one of its own captions (a new pick per epoch), and bad input is one error
naming it."""

from __future__ import annotations

import dataclasses
import io
import os
import pathlib
import sys
import tarfile

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from PIL import Image

from tests.image_text_fixtures import (
  N,
  captions_of,
  image_text_config,
  png,
  write_caption_folder,
  write_shard,
  write_shards,
  write_tokenizer,
)
from vit_jax import run
from vit_jax.data import captions, dataset, free_text, pipeline
from vit_jax.infra import errors, storage
from vit_jax.run import objectives
from vit_jax.weights import sources


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory) -> str:
  return write_tokenizer(str(tmp_path_factory.mktemp("tok") / "tokenizer.json"))


class CaptionedTiny(tfds.core.GeneratorBasedBuilder):
  """A tiny image-text tfds dataset: an image and a sequence of captions, as coco_captions."""

  VERSION = tfds.core.Version("1.0.0")
  code_path = pathlib.Path(__file__)  # as digits.Digits: no importlib_resources here

  def _info(self):
    features = tfds.features.FeaturesDict(
      {
        "image": tfds.features.Image(shape=(8, 8, 3)),
        "captions": tfds.features.Sequence({"text": tfds.features.Text()}),
      }
    )
    return tfds.core.DatasetInfo(builder=self, features=features)

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(), "test": self._generate_examples()}

  def _generate_examples(self):
    for k in range(N):
      image = np.full((8, 8, 3), 10 * k, np.uint8)
      yield k, {"image": image, "captions": {"text": captions_of(k)}}


class OneCaptionTiny(tfds.core.GeneratorBasedBuilder):
  """An image and one caption (a Text feature), for tfds.testing.mock_data: no data."""

  VERSION = tfds.core.Version("1.0.0")
  code_path = pathlib.Path(__file__)

  def _info(self):
    features = {"image": tfds.features.Image(shape=(8, 8, 3)), "caption": tfds.features.Text()}
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    yield from ()


def _ids(images: np.ndarray) -> np.ndarray:
  levels = np.round(images.reshape(len(images), -1).mean(-1) * 127.5 + 127.5)
  return (levels / 10).round().astype(int)


def _take(batches, steps: int) -> dict[str, np.ndarray]:
  got = [next(batches) for _ in range(steps)]
  return {k: np.concatenate([b[k] for b in got]) for k in ("image", "text")}


def _check_guarantees(config, first_only: bool = False) -> None:
  """Exact resume, process-count independence, and each row's text one of its image's
  captions (every caption drawn over the epochs; the first in evaluation)."""
  data = dataset.Dataset(objectives.data_settings(config))
  straight = _take(pipeline.local_train_batches(data, 4, 0, 0, 1), 20)  # 4 epochs
  resumed = _take(pipeline.local_train_batches(data, 4, 13, 0, 1), 2)
  halves = [_take(pipeline.local_train_batches(data, 2, 0, p, 2), 20) for p in (0, 1)]
  for key, rows in straight.items():
    np.testing.assert_array_equal(resumed[key], rows[13 * 4 : 15 * 4])
    joined = np.concatenate([h[key].reshape(20, 2, *h[key].shape[1:]) for h in halves], axis=1)
    np.testing.assert_array_equal(joined.reshape(rows.shape), rows)
  ids = _ids(straight["image"])
  encoded = {k: [tuple(r) for r in data.tokenizer.encode(captions_of(k), 6)] for k in range(N)}
  picked = [encoded[k].index(tuple(t)) for k, t in zip(ids, straight["text"])]  # fails if absent
  assert set(picked) == ({0} if first_only else {0, 1})
  assert set(ids) == set(range(N))
  for batch in pipeline.EvalBatches(data, "test", 8, 0, 1):
    real = batch["mask"] > 0
    for k, t in zip(_ids(batch["image"][real]), batch["text"][real]):
      assert tuple(t) == encoded[k][0]


def test_caption_folder_keeps_the_guarantees(tmp_path, tokenizer_path):
  _check_guarantees(image_text_config(write_caption_folder(tmp_path), tokenizer_path))


def test_tar_shards_keep_the_guarantees(tmp_path, tokenizer_path):
  _check_guarantees(image_text_config(write_shards(tmp_path), tokenizer_path), first_only=True)


@pytest.mark.parametrize("write", [write_caption_folder, write_shards])
def test_a_bucket_source_gives_the_local_batches_without_tensorflow(
  write, tmp_path, tokenizer_path, gcs_bucket, monkeypatch
):
  """The same captions folder or shards on a bucket (a real GCS server), read with
  TensorFlow unimportable from a resumed step on: every batch is the local source's (whose
  guarantees the tests above check)."""
  monkeypatch.setitem(sys.modules, "tensorflow", None)
  local = write(tmp_path / "data")
  prefix, root = local.split(":", 1)
  storage.filesystem(gcs_bucket).put(root + "/", f"{gcs_bucket}/data", recursive=True)
  from_bucket, from_disk = (
    _take(pipeline.local_train_batches(dataset.Dataset(objectives.data_settings(c)), 4, 3, 0, 1), 6)
    for c in (
      image_text_config(f"{prefix}:{gcs_bucket}/data", tokenizer_path),
      image_text_config(local, tokenizer_path),
    )
  )
  for key, rows in from_disk.items():
    np.testing.assert_array_equal(from_bucket[key], rows)


def test_tfds_text_feature_keeps_the_guarantees(tmp_path, tokenizer_path):
  CaptionedTiny(data_dir=str(tmp_path)).download_and_prepare()
  config = image_text_config("captioned_tiny", tokenizer_path, data_dir=str(tmp_path))
  _check_guarantees(config)
  source = dataset.Dataset(objectives.data_settings(config)).split("train[:3]")
  texts = source.read(0, 3)[2]  # through the records path: every caption of the example
  assert all(t in [tuple(captions_of(k)) for k in range(N)] for t in texts)


def test_mocked_tfds_text_goes_through_tfds_reader(tmp_path):
  """mock_data has no split sizes or records: the split is read whole through tfds (its
  mock of a Sequence of Text fails inside tfds, so a single Text feature here)."""
  from vit_jax.data import tfds_source

  with tfds.testing.mock_data(num_examples=6):
    source = tfds_source.TfdsDataset("one_caption_tiny", str(tmp_path), text=("image", None))
    assert source.text == ("image", "caption")  # found among TEXT_FEATURES
    values, labels, texts = source.split("train").read(1, 4)
  assert [v[:4] for v in values] == [b"\x89PNG"] * 3 and list(labels) == [0, 0, 0]
  assert all(len(t) == 1 and isinstance(t[0], str) and t[0] for t in texts)


def test_a_finished_siglip_run_on_tar_shards_loads_with_its_tokenizer(tmp_path, tokenizer_path):
  # Its exact resume (and the captions folder's) is held by the run without TensorFlow,
  # tests/test_input_no_tensorflow.py.
  # Three steps (past the warm-up), saved and evaluated at the end only: what is checked
  # is the finished run.
  config = image_text_config(
    write_shards(tmp_path / "data"), tokenizer_path, batch=8, batch_eval=8, total_steps=3,
    eval_every=100, checkpoint_every=100,
  )  # fmt: skip
  run.train_and_evaluate(config, str(tmp_path / "straight"))
  # The finished run loads with the tokenizer its captions were read with (predict --texts).
  loaded = sources.load(str(tmp_path / "straight"))
  texts = ["a red square", "two blue dots"]
  expected = free_text.load_tokenizer(tokenizer_path, "none").encode(texts, 16)
  np.testing.assert_array_equal(loaded.tokenizer.encode(texts, 16), expected)


def test_choose_picks_per_epoch_and_evaluation_takes_the_first():
  rows = free_text.captions_array([("a", "b", "c"), ("d",)])
  uids = np.array([0, 1])
  assert list(free_text.choose(rows, uids, None)) == [b"a", b"d"]
  epochs = {free_text.choose(rows, uids + 2 * e, 5)[0] for e in range(20)}
  assert epochs == {b"a", b"b", b"c"}


def test_bad_input_is_one_error_naming_it(tmp_path, tokenizer_path):
  def open_(name, **overrides):
    config = image_text_config(name, tokenizer_path, **overrides)
    return dataset.Dataset(objectives.data_settings(config)).split("train")

  os.makedirs(tmp_path / "a" / "train")
  write_shard(
    tmp_path / "a" / "train" / "00000.tar", range(3), caption=lambda k: None if k else "x"
  )
  with pytest.raises(errors.InputFileError, match="00000.tar.*'000001' has an image but no cap"):
    open_(f"wds:{tmp_path / 'a'}")
  os.makedirs(tmp_path / "b" / "train")
  (tmp_path / "b" / "train" / "captions.tsv").write_text("\n")
  with pytest.raises(errors.InputFileError, match="captions.tsv' names no image: it is empty"):
    open_(f"captions:{tmp_path / 'b'}")
  (tmp_path / "b" / "train" / "captions.tsv").write_text("a.png\t \n")
  with pytest.raises(errors.InputFileError, match="captions.tsv, 'a.png': an empty"):
    open_(f"captions:{tmp_path / 'b'}")
  with pytest.raises(errors.MissingError, match="config.text.tokenizer='/nowhere'"):
    open_(f"captions:{tmp_path / 'b'}", **{"text.tokenizer": "/nowhere"})
  with pytest.raises(errors.ConfigError, match="digits' has no text feature 'captions/text'"):
    open_("digits", data_dir=str(tmp_path / "tfds"), **{"text.text_feature": "captions/text"})
  config = image_text_config(
    write_shards(tmp_path / "c"), tokenizer_path, **{"model.text.vocab_size": 4}
  )
  with pytest.raises(errors.ConfigError, match="tokenizer.json' has 2[0-9] tokens, more than"):
    run.build(config)


def test_tfds_records_parse_sequences_of_captions():
  example = tf.train.Example(
    features=tf.train.Features(
      feature={
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"img"])),
        "captions/text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x", b"y"])),
      }
    )
  ).SerializeToString()
  from vit_jax.data import records

  values, labels, texts = records.parse_text([example], ("image", "captions/text"))
  assert list(values) == [b"img"] and list(labels) == [0] and texts[0] == ("x", "y")


def test_retrieval_evaluates_each_test_image_against_all_its_captions(tmp_path, tokenizer_path):
  from vit_jax.run.evaluators import retrieval, zeroshot

  config = image_text_config(write_caption_folder(tmp_path), tokenizer_path, batch_eval=8)
  steps = run.build(config)
  evaluator = zeroshot.build(steps)
  assert isinstance(evaluator, retrieval.Retrieval)
  params = steps.init_state().params
  metrics = evaluator(params)
  assert metrics.pop("retrieval/examples") == N  # 3 batches of 8: the padding is left out
  assert metrics.pop("retrieval/captions") == 2 * N  # both captions of every image
  data = dataset.Dataset(steps.spec.data)
  images = np.concatenate(
    [b["image"][b["mask"] > 0] for b in pipeline.EvalBatches(data, "test", 8, 0, 1)]
  )
  np.testing.assert_array_equal(_ids(images), np.arange(N))  # split order: image k is k
  texts = [c for k in range(N) for c in captions_of(k)]
  zimg = steps.objective.embed(params, images, None)[0]
  ztxt = steps.objective.embed(params, None, data.tokenizer.encode(texts, 6))[1]
  owner = np.repeat(np.arange(N), 2)
  expected = retrieval.retrieval_metrics(np.asarray(zimg), np.asarray(ztxt), owner)
  assert metrics.keys() == expected.keys()
  for k, v in expected.items():
    assert metrics[k] == pytest.approx(v, abs=1e-6), k


def test_shards_and_caption_files_hold_offsets_not_captions(tmp_path):
  """Memory per example is a few fixed-size numbers, whatever the captions: no list or
  object array of the split's captions or names is kept (they are read a block at a time)."""
  from vit_jax.data import caption_folder, tar_shards

  root = write_shards(tmp_path / "wds")[len(tar_shards.PREFIX) :]
  index = tar_shards.TarShards(root).index("train")
  # But per shard: its path and the file read (the same, or a bucket's shard's local copy).
  arrays = {k: v for k, v in vars(index).items() if k not in ("shards", "read")}
  assert all(isinstance(v, np.ndarray) and v.dtype != object for v in arrays.values())
  per_example = sum(v.nbytes for k, v in arrays.items() if k != "ends") / len(index)
  assert len(index) == N and per_example == 25
  images, texts = index.rows(2, 5)
  assert [t[0] for t in texts] == [captions_of(k)[0] for k in (2, 3, 4)]  # 3: its .json
  assert Image.open(io.BytesIO(images[1])).getpixel((0, 0)) == (30, 30, 30)

  root = write_caption_folder(tmp_path / "folder")[len(caption_folder.PREFIX) :]
  source = caption_folder.CaptionFolder(root)
  captions_file = source._file("train")  # pylint: disable=protected-access
  arrays = {k: v for k, v in vars(captions_file).items() if isinstance(v, np.ndarray)}
  assert set(arrays) == {"lines", "starts"} and all(v.dtype == np.int64 for v in arrays.values())
  paths, texts = source.rows("train", 18, 20)
  assert [os.path.basename(p) for p in paths] == ["18.png", "19.png"]
  assert [t for t in texts] == [tuple(captions_of(18)), tuple(captions_of(19))]


def test_a_bad_caption_read_with_its_block_names_its_member(tmp_path):
  from vit_jax.data import tar_shards

  with tarfile.open(tmp_path / "00000.tar", "w") as tar:
    for name, payload in (("0001.png", png(1)), ("0001.txt", b"\xff not utf-8")):
      info = tarfile.TarInfo(name)
      info.size = len(payload)
      tar.addfile(info, io.BytesIO(payload))
  index = tar_shards.TarShards(str(tmp_path)).index("train")
  with pytest.raises(errors.InputFileError, match="00000.tar, 0001.txt: not a UTF-8 caption"):
    index.rows(0, 1)


def test_a_changed_tokenizer_is_refused_on_resume_in_one_line(tmp_path, tokenizer_path):
  import shutil

  import jax.numpy as jnp

  from vit_jax.data.caption_settings import CaptionSettings
  from vit_jax.run import checkpoints

  settings = CaptionSettings(6, tokenizer=tokenizer_path)
  moved = tmp_path / "moved" / "tokenizer.json"
  moved.parent.mkdir()
  shutil.copy(tokenizer_path, moved)
  (moved.parent / "model.safetensors").write_bytes(b"weights are not the tokenizer")
  same = CaptionSettings(6, tokenizer=str(moved.parent)).identity()  # the folder: its file
  assert same == settings.identity() and settings.identity().startswith("sha256:")
  other = tmp_path / "other.json"
  captions.CaptionTokenizer(["other words"]).save(str(other))
  assert CaptionSettings(6, tokenizer=str(other)).identity() != settings.identity()
  assert CaptionSettings(7, tokenizer=tokenizer_path).identity() != settings.identity()

  # A contrastive run records it with the data keys of its checkpoints.
  from vit_jax.infra import sharding

  mesh = sharding.make_mesh((("data", -1), ("model", 1)))
  config = image_text_config("wds:/data", tokenizer_path, num_classes=1)
  spec = run.resolve(config, mesh=mesh, open_data=False)
  assert spec.data_identity()["tokenizer"] == settings.identity()
  data = {"dataset": "wds:/data", "tokenizer": settings.identity()}
  state = {"params": {"w": jnp.arange(4.0)}, "step": jnp.zeros((), jnp.int32)}
  ckpts = checkpoints.RunCheckpoints(tmp_path / "ckpts", data=data, async_save=False)
  ckpts.save(1, state)
  ckpts.close()
  assert checkpoints.check_resume(tmp_path / "ckpts", data, state)
  changed = {**data, "tokenizer": CaptionSettings(6, tokenizer=str(other)).identity()}
  with pytest.raises(errors.ResumeError) as raised:
    checkpoints.check_resume(tmp_path / "ckpts", changed, state)
  message = str(raised.value)
  assert "\n" not in message and "(step 1) trained with another tokenizer (sha256:" in message
  assert "text_len=6 eos=none -> sha256:" in message


def test_big_vision_tokenizer_options_read_captions_as_big_vision_does(tmp_path, tokenizer_path):
  """config.text.eos='sticky', lower=True and pad_id=1 (a text tower trained by big_vision):
  the batches' ids are big_vision's tokenize's (`tests/big_vision_reference.py`), and each
  option is part of the tokenizer's identity."""
  sentencepiece = pytest.importorskip("sentencepiece")
  from tests import big_vision_reference as bv
  from vit_jax.data.caption_settings import CaptionSettings

  model = io.BytesIO()
  sentencepiece.SentencePieceTrainer.train(
    sentence_iterator=iter([c for k in range(N) for c in captions_of(k)] * 5), model_writer=model,
    vocab_size=28, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
  )  # fmt: skip
  vocabulary = tmp_path / "spiece.model"
  vocabulary.write_bytes(model.getvalue())
  shouted = lambda k: [
    c.replace("image", "IMAGE").replace("first", "First") for c in captions_of(k)
  ]
  config = image_text_config(write_caption_folder(tmp_path / "data", shouted), str(vocabulary))
  config.text.update(dict(eos="sticky", lower=True, pad_id=1))
  data = dataset.Dataset(objectives.data_settings(config))
  rows = 0
  for batch in pipeline.EvalBatches(data, "test", 8, 0, 1):
    real = batch["mask"] > 0
    for k, ids in zip(_ids(batch["image"][real]), batch["text"][real]):
      expected = bv.tokenize(shouted(k)[:1], str(vocabulary), 6, pad_value=1)[0]
      np.testing.assert_array_equal(ids, expected)
      rows += 1
  assert rows == N
  # Each option changes ids here: 'IMAGE' is not lower-case, a short caption pads with 0.
  text = data.settings.text
  cased = dataclasses.replace(text, lower=False).load_tokenizer(None)
  assert (cased.encode(shouted(3)[:1], 6) != data.tokenizer.encode(shouted(3)[:1], 6)).any()
  padded = dataclasses.replace(text, pad_id=None).load_tokenizer(None).encode(["3"], 6)
  np.testing.assert_array_equal(padded[0, -2:], [0, 0])
  np.testing.assert_array_equal(data.tokenizer.encode(["3"], 6)[0, -2:], [1, 1])

  settings = CaptionSettings.from_config(config)
  changed = [dataclasses.replace(settings, lower=False), dataclasses.replace(settings, pad_id=0)]
  assert len({settings.identity(), *(c.identity() for c in changed)}) == 3
  # Unset, they leave the identity of a run recorded before they existed as it was.
  unset = dataclasses.replace(settings, lower=False, pad_id=None).identity()
  assert unset.endswith(" text_len=6 eos=sticky"), unset

  config.text.tokenizer = tokenizer_path  # a tokenizer.json: the options do not apply
  with pytest.raises(errors.ConfigError, match="config.text.lower=True / config.text.pad_id=1"):
    dataset.Dataset(objectives.data_settings(config))
