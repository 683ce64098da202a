"""big_vision's checkpoints both ways (`vit_jax.weights.big_vision`): tiny SigLIP, SigLIP 2
(stacked layers), LiT and plain ViTs built and saved by a reproduction of big_vision's own
code (`tests/big_vision_reference.py`), loaded here with their SentencePiece model, and
compared with big_vision's probabilities and token ids; the export read back by that code."""

from __future__ import annotations

import dataclasses
import io
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import vit_jax
from tests import big_vision_reference as bv
from vit_jax import export, models, weights
from vit_jax.api import text_scores
from vit_jax.infra import errors
from vit_jax.weights import big_vision, formats

sentencepiece = pytest.importorskip("sentencepiece")

IMAGE, PATCH, WIDTH, DEPTH, HEADS, MLP, LENGTH = 16, 4, 16, 2, 2, 32, 8
TEXTS = ["A Photo of a CAT", "two dogs", "the quick brown fox jumps over the lazy dog again"]
CORPUS = [
  "a photo of a cat", "two dogs on a sofa", "the quick brown fox jumps over the lazy dog",
  "a small bird on a branch", "again and again",
] * 20  # fmt: skip


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory) -> str:
  """A SentencePiece model with c4_en's special ids: pad 0, end 1, unknown 2, no start."""
  model = io.BytesIO()
  sentencepiece.SentencePieceTrainer.train(
    sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=40,
    pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
  )  # fmt: skip
  path = tmp_path_factory.mktemp("vocab") / "sentencepiece.model"
  path.write_bytes(model.getvalue())
  return str(path)


def _model(*, scan=False, out_dim=(None, WIDTH), bias=-10.0, pool="map", text_pool="last"):
  tower = dict(depth=DEPTH, mlp_dim=MLP, num_heads=HEADS, scan=scan)
  return bv.TwoTowers(
    image=dict(patch_size=PATCH, width=WIDTH, pool_type=pool, **tower),
    text=dict(width=WIDTH, vocab_size=40, pool_type=text_pool, **tower),
    out_dim=out_dim, bias_init=bias,
  )  # fmt: skip


def _saved(tmp_path, vocabulary, model, *, prefix=True, name="siglip.npz"):
  """``model`` initialised (t and b moved off their init) and saved as big_vision saves
  it, with the vocabulary as ``<stem>.model``; (path, params)."""
  images = jnp.zeros((1, IMAGE, IMAGE, 3))
  init = jax.jit(model.init)
  params = init(jax.random.PRNGKey(0), images, jnp.zeros((1, LENGTH), jnp.int32))["params"]
  params = {**params, "t": jnp.full((1,), np.log(3.0))}
  if "b" in params:
    params["b"] = jnp.full((1,), -0.5)
  path = str(tmp_path / name)
  bv.save(path, params, prefix=prefix)
  with open(vocabulary, "rb") as src, open(path[: -len(".npz")] + ".model", "wb") as dst:
    dst.write(src.read())
  return path, params


@pytest.fixture(scope="module")
def siglip(tmp_path_factory, vocabulary):
  """A tiny SigLIP saved in the released layout: (path, params, big_vision's model)."""
  model = _model()
  return (*_saved(tmp_path_factory.mktemp("siglip"), vocabulary, model), model)


def _images(n=2) -> np.ndarray:
  return np.random.default_rng(0).uniform(-1, 1, (n, IMAGE, IMAGE, 3)).astype(np.float32)


def _ours(model: vit_jax.Model, images: np.ndarray, texts=TEXTS) -> np.ndarray:
  """What ``predict --texts`` computes: the model's tokenizer, then `TextScores`."""
  return text_scores.TextScores(model.loaded, texts)(images)


def test_siglip_released_layout_gives_big_vision_probabilities_and_ids(
  tmp_path, vocabulary, siglip
):
  path, params, model = siglip
  assert formats.of(path).format is formats.BIG_VISION
  loaded = vit_jax.load(path)
  ids = bv.tokenize(TEXTS, vocabulary, LENGTH, pad_value=1)
  np.testing.assert_array_equal(loaded.loaded.tokenizer.encode(TEXTS, LENGTH), ids)
  assert loaded.config.text_len == LENGTH and loaded.config.image_head == "none"
  assert loaded.image_size == (IMAGE, IMAGE)
  want = bv.probabilities(model, params, _images(), ids)
  np.testing.assert_allclose(_ours(loaded, _images()), want, atol=1e-5)
  out = tmp_path / "export"
  loaded.save(str(out), format="big_vision")
  again = bv.load(str(out / big_vision.EXPORT_FILE), image_scan=False)
  np.testing.assert_allclose(bv.probabilities(model, again, _images(), ids), want, atol=1e-5)


def test_siglip2_stacked_layout_without_prefix(tmp_path, vocabulary):
  model = _model(scan=True, text_pool="map")
  path, params = _saved(tmp_path, vocabulary, model, prefix=False)
  assert formats.of(path).format is formats.BIG_VISION  # not LiT's reader, which takes img/txt/t
  loaded = vit_jax.load(path)
  assert loaded.config.text.pool == "map"
  ids = bv.tokenize(TEXTS, vocabulary, LENGTH, pad_value=1)
  want = bv.probabilities(model, params, _images(), ids)
  np.testing.assert_allclose(_ours(loaded, _images()), want, atol=1e-5)


def test_lit_with_class_token_exports_back_into_big_vision(tmp_path, vocabulary):
  """A LiT model (both projections, no bias: softmax; ``pool_type='tok'``) read, written
  as big_vision, and loaded by big_vision's ``load`` (either image layout) with the same
  probabilities; the tokenizer written beside it gives the same ids."""
  model = _model(out_dim=WIDTH, bias=None, pool="tok")
  path, params = _saved(tmp_path, vocabulary, model, name="lit.npz")
  loaded = vit_jax.load(path)
  assert loaded.config.image_head == "dense" and "b" not in loaded.params
  ids = bv.tokenize(TEXTS, vocabulary, LENGTH, pad_value=1)
  want = bv.probabilities(model, params, _images(), ids)
  np.testing.assert_allclose(_ours(loaded, _images()), want, atol=1e-5)
  out = tmp_path / "export"
  loaded.save(str(out), format="big_vision")
  for scan in (False, True):
    again = bv.load(str(out / big_vision.EXPORT_FILE), image_scan=scan)
    image = {**model.image, "scan": scan}
    rebuilt = bv.TwoTowers(image, model.text, model.out_dim, bias_init=None)
    np.testing.assert_allclose(bv.probabilities(rebuilt, again, _images(), ids), want, atol=1e-5)
  written = str(out / big_vision.TOKENIZER_FILE)
  np.testing.assert_array_equal(bv.tokenize(TEXTS, written, LENGTH, pad_value=1), ids)
  np.testing.assert_allclose(_ours(vit_jax.load(str(out)), _images()), want, atol=1e-5)


def test_predict_texts_prints_big_vision_probabilities(tmp_path, vocabulary, siglip, capsys):
  """``python -m vit_jax.predict --checkpoint=siglip.npz --texts=...`` on image files at
  the model's size: big_vision's ``resize|value_range(-1, 1)`` is then x / 127.5 - 1."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  from vit_jax import predict  # pylint: disable=g-import-not-at-top

  path, params, model = siglip
  pixels = np.random.default_rng(1).integers(0, 256, (2, IMAGE, IMAGE, 3), np.uint8)
  folder = tmp_path / "images"
  folder.mkdir()
  for i, p in enumerate(pixels):
    Image.fromarray(p).save(folder / f"{i}.png")
  argv = ["predict", f"--checkpoint={path}", f"--texts={','.join(TEXTS)}", "--json"]
  assert predict.main([*argv, str(folder)]) == 0
  lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  ids = bv.tokenize(TEXTS, vocabulary, LENGTH, pad_value=1)
  want = bv.probabilities(model, params, pixels / 127.5 - 1, ids)
  for line, probs in zip(lines, want):
    scores = {entry["label"]: entry["probability"] for entry in line["top_k"]}
    np.testing.assert_allclose([scores[t] for t in TEXTS], probs, atol=1e-5)
  assert predict.main(["predict", f"--checkpoint={path}", str(folder)]) == 2  # no --texts
  assert "is an image-text model: pass --texts" in capsys.readouterr().err


def test_plain_vit_with_head(tmp_path, capsys):
  """big_vision's plain ViT (root names, ``pool_type='gap'``, a classifier head) gives its
  logits; written back, big_vision's ``load`` reads it. Its 'sincos2d' is refused."""
  vit = bv.ViT(5, PATCH, WIDTH, DEPTH, MLP, HEADS, pool_type="gap")
  params = jax.jit(vit.init)(jax.random.PRNGKey(1), jnp.zeros((1, IMAGE, IMAGE, 3)))["params"]
  path = str(tmp_path / "vit_s16_i1k.npz")
  head = params["head"]["kernel"].astype(jnp.bfloat16)
  params = {**params, "head": {**params["head"], "kernel": head}}  # saved as 2-byte void
  bv.save(path, params, prefix=False)
  model = vit_jax.load(path)
  assert model.config.classifier == "gap" and model.num_classes == 5
  want = np.asarray(jax.jit(vit.apply)({"params": params}, _images()))
  np.testing.assert_allclose(model(_images()), want, atol=1e-5)
  out = str(tmp_path / "out")
  assert export.main(["export", f"--checkpoint={path}", "--format=big_vision", f"--out={out}"]) == 0
  assert "Load it with: big_vision's two_towers.load" in capsys.readouterr().out
  again = bv.load_params(os.path.join(out, big_vision.EXPORT_FILE))
  np.testing.assert_allclose(jax.jit(vit.apply)({"params": again}, _images()), want, atol=1e-5)
  sincos = {k: v for k, v in params.items() if k != "pos_embedding"}
  bv.save(path, sincos, prefix=False)
  with pytest.raises(errors.CheckpointError, match="sincos2d"):
    vit_jax.load(path)


def test_pretrained_image_tower_and_lit_run_from_a_siglip_file(siglip):
  """``config.pretrained``'s reader: a classifier takes the SigLIP image tower (a fresh
  head), a LiT model both towers (its image projection fresh, SigLIP's bias dropped)."""
  path, params, _ = siglip
  read = vit_jax.load(path).config
  image_config = read.image
  classifier = models.create_model(image_config, num_classes=4)
  init = jax.jit(classifier.init)(jax.random.PRNGKey(0), jnp.zeros((1, IMAGE, IMAGE, 3)))["params"]
  fitted = weights.load_pretrained(path, init, image_config)
  np.testing.assert_array_equal(fitted["MAPHead_0"]["probe"], params["img"]["MAPHead_0"]["probe"])
  assert fitted["head"]["kernel"].shape == (WIDTH, 4)
  lit = models.two_tower_config(
    image_config,
    text=dataclasses.asdict(read.text),
    text_len=LENGTH,
    embed_dim=WIDTH,
    loss="softmax",
  )
  module = models.create_model(lit, num_classes=None)
  ids = jnp.zeros((1, LENGTH), jnp.int32)
  init = jax.jit(module.init)(jax.random.PRNGKey(0), jnp.zeros((1, IMAGE, IMAGE, 3)), ids)
  init = init["params"]
  fitted = weights.load_pretrained(path, init, lit)
  assert "b" not in fitted and fitted["img_head"]["kernel"].shape == (WIDTH, WIDTH)
  np.testing.assert_array_equal(
    fitted["txt"]["Embed_0"]["embedding"], params["txt"]["Embed_0"]["embedding"]
  )
  np.testing.assert_array_equal(fitted["t"], params["t"])


def test_tokenizer_options_and_refusals(tmp_path, vocabulary, siglip):
  """Gemma's vocabulary (SigLIP 2) pads with its pad piece, others with id 1; what is not
  read or written is one error naming it."""
  config = ml_collections.ConfigDict(dict(model_type="two_tower", text=dict(vocab_size=40)))
  assert big_vision.tokenizer(vocabulary, config).pad_id == 1
  config.text.vocab_size = big_vision.GEMMA_VOCAB
  assert big_vision.tokenizer(vocabulary, config).pad_id == 0
  path = siglip[0]
  with pytest.raises(errors.CheckpointError, match="leave out the model name"):
    vit_jax.load(path, model_name="ViT-B_16")
  naflex = str(tmp_path / "naflex.npz")
  block = "img/Transformer/encoderblock/MlpBlock_0/Dense_0/kernel"
  np.savez(naflex, **{"img/embedding/kernel": np.zeros((48, 16)), "t": np.zeros(1), block: 0})
  with pytest.raises(errors.CheckpointError, match="NaFlex"):
    vit_jax.load(naflex)
  model = vit_jax.load(path)
  exact = model.config.replace(image=model.config.image.replace(gelu_approximate=False))
  model = vit_jax.Model(dataclasses.replace(model.loaded, config=exact))
  with pytest.raises(errors.CheckpointError, match="gelu_approximate=False"):
    model.save(str(tmp_path / "refused"), format="big_vision")
  assert not os.path.exists(tmp_path / "refused")
  with pytest.raises(errors.ConfigError, match="is an image-text model: score images"):
    model(_images())  # a classifier's call, refused before anything is traced


def test_lit_run_starts_from_a_big_vision_siglip_image_tower(tmp_path, siglip, digits_dir):
  """``config.pretrained`` of a LiT run (locked image tower) names a SigLIP `.npz`: the
  run's image tower is big_vision's (its positions resized to the run's crop) and ends as
  it started."""
  from configs import siglip as siglip_config  # pylint: disable=g-import-not-at-top
  from tests import train_fixtures  # pylint: disable=g-import-not-at-top
  from vit_jax import run  # pylint: disable=g-import-not-at-top
  from vit_jax.weights import orbax_steps  # pylint: disable=g-import-not-at-top

  path, params, _ = siglip
  config = siglip_config.get_config("digits")
  train_fixtures.override(config, train_fixtures.TINY)
  config.data_dir = digits_dir
  config.model = models.two_tower_config(
    vit_jax.load(path).config.image, text=dict(width=16, depth=1, mlp_dim=32, num_heads=2,
    vocab_size=64), text_len=8, embed_dim=16,
  )  # fmt: skip
  config.pretrained = path
  config.contrastive.lock_image = True
  # Three steps (the image tower would move from the second: lr > 0 after step 1 of the
  # warm-up), saved and evaluated at the end only; decoded by threads (no worker processes
  # to start for each split: their batches are the threads', tests/test_decode_workers.py).
  config.total_steps, config.eval_every, config.checkpoint_every = 3, 100, 100
  config.decode_processes = 0
  run.train_and_evaluate(config, str(tmp_path / "lit"))
  end = orbax_steps.read_params(tmp_path / "lit" / "checkpoints")["img"]
  np.testing.assert_array_equal(end["MAPHead_0"]["probe"], params["img"]["MAPHead_0"]["probe"])
  block = end["Transformer"]["encoderblock_1"]["MlpBlock_3"]["Dense_0"]["kernel"]
  stored = params["img"]["Transformer"]["encoderblock_1"]["MlpBlock_0"]["Dense_0"]["kernel"]
  np.testing.assert_array_equal(block, stored)
  assert end["Transformer"]["posembed_input"]["pos_embedding"].shape == (1, 4, WIDTH)


def test_a_class_token_position_row_is_folded_into_the_token(tmp_path):
  """A ViT whose position table has a class-token row (the official layout) written as
  big_vision's (positions before the class token) gives the same logits, read back here
  and by big_vision's ViT."""
  model = vit_jax.create("testing", num_classes=3, image_size=8)
  assert model.config.classifier == "token" and not model.config.posemb_patches_only
  x = np.random.default_rng(2).uniform(-1, 1, (2, 8, 8, 3)).astype(np.float32)
  model.save(str(tmp_path / "out"), format="big_vision")
  again = vit_jax.load(str(tmp_path / "out"))
  np.testing.assert_allclose(again(x), model(x), atol=1e-5)
  c = model.config
  vit = bv.ViT(3, c.patches.size[0], c.hidden_size, c.transformer.num_layers,
               c.transformer.mlp_dim, c.transformer.num_heads, pool_type="tok")  # fmt: skip
  stored = bv.load_params(str(tmp_path / "out" / big_vision.EXPORT_FILE))
  np.testing.assert_allclose(jax.jit(vit.apply)({"params": stored}, x), model(x), atol=1e-5)


def test_siglip2_naflex_scores_texts_on_images_at_their_own_aspect(
  tmp_path, vocabulary, capsys, monkeypatch
):
  """SigLIP 2 NaFlex (big_vision's NaFlex image tower beside the text tower) read from its
  `.npz`: ``predict --texts --seq_len`` on a tall and a wide PNG, and
  `Model.text_probabilities(seq_len=)`, give big_vision's probabilities on the same patches
  (its value_range(-1, 1): mean and std 0.5); ``zeroshot --seq_len`` over a folder of them
  prints the accuracy those probabilities give."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  from tests import interop_fixtures as fx  # pylint: disable=g-import-not-at-top
  from vit_jax import predict  # pylint: disable=g-import-not-at-top
  from vit_jax.data import naflex_images  # pylint: disable=g-import-not-at-top

  budget = 24
  model = bv.TwoTowers(
    image=dict(width=WIDTH, depth=DEPTH, mlp_dim=MLP, num_heads=HEADS, nposemb=4),
    text=dict(width=WIDTH, vocab_size=40, depth=DEPTH, mlp_dim=MLP, num_heads=HEADS),
    out_dim=WIDTH, naflex=True,
  )  # fmt: skip
  photos = [fx.photo(50, 20, seed=1), fx.photo(12, 64, seed=2)]
  patches, coords, mask = naflex_images.prepare(photos, PATCH, budget, (0.5,) * 3, (0.5,) * 3)
  theirs_in = (patches, mask.astype(np.int32), coords[..., 0], coords[..., 1])
  ids = bv.tokenize(TEXTS, vocabulary, LENGTH, pad_value=1)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), theirs_in, jnp.asarray(ids))["params"]
  params = {**params, "t": jnp.full((1,), np.log(3.0)), "b": jnp.full((1,), -0.5)}
  path = str(tmp_path / "siglip2_naflex.npz")
  bv.save(path, params)
  with open(vocabulary, "rb") as src, open(path[: -len(".npz")] + ".model", "wb") as dst:
    dst.write(src.read())
  want = bv.probabilities(model, params, theirs_in, ids)
  assert np.abs(want[0] - want[1]).max() > 1e-3  # the images are told apart

  loaded = vit_jax.load(path)
  np.testing.assert_allclose(
    loaded.text_probabilities(photos, TEXTS, seq_len=budget), want, atol=1e-5
  )
  files = []
  for i, pixels in enumerate(photos):
    Image.fromarray(pixels).save(tmp_path / f"{i}.png")
    files.append(str(tmp_path / f"{i}.png"))
  argv = ["predict", f"--checkpoint={path}", f"--texts={','.join(TEXTS)}", f"--seq_len={budget}"]
  assert predict.main([*argv, "--json", *files]) == 0
  lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  for line, probs in zip(lines, want):
    scores = {entry["label"]: entry["probability"] for entry in line["top_k"]}
    np.testing.assert_allclose([scores[t] for t in TEXTS], probs, atol=1e-5)

  from tests import image_text_fixtures  # pylint: disable=g-import-not-at-top
  from vit_jax import zeroshot  # pylint: disable=g-import-not-at-top
  from vit_jax.data import captions  # pylint: disable=g-import-not-at-top

  classes = ("bird", "cat", "dog")
  picked = loaded.text_probabilities(photos, [f"a {c}." for c in classes], seq_len=budget)
  labels = [picked[0].argmax(), (picked[1].argmax() + 1) % 3]  # one right, one wrong
  root = tmp_path / "data"
  image_text_fixtures.class_folder(root, classes, photos, labels)
  monkeypatch.setitem(captions.TEMPLATES, "one", ("a {}.",))
  argv = [f"--checkpoint={path}", f"--dataset=folder:{root}", "--templates=one"]
  assert zeroshot.main(["zeroshot", *argv, f"--seq_len={budget}"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert dict(line.split() for line in lines[1:])["zeroshot/accuracy"] == "0.5000"
