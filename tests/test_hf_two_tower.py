"""transformers' SiglipModel, Siglip2Model and CLIPModel folders read as two-tower models:
transformers' own logits (within 1e-5 relative) and token ids from a folder written in
the test (`hf_text_fixtures`), and the bad folders' errors."""

from __future__ import annotations

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from tests import hf_text_fixtures as fx
from tests.test_mixer import tiny_config as tiny_mixer
from vit_jax.data import free_text
from vit_jax.infra import errors
from vit_jax.models import two_tower
from vit_jax.weights import npz, sources

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")


@pytest.fixture(scope="module", params=sorted(fx.WRITERS))
def hf_folder(request, tmp_path_factory) -> str:
  directory = str(tmp_path_factory.mktemp(request.param))
  fx.WRITERS[request.param](directory)
  return directory


def our_logits(loaded: sources.LoadedModel, pixels: np.ndarray, texts: list[str]) -> np.ndarray:
  """[B, T] image-text logits, the images normalised as the folder's processor says."""
  data = loaded.data_config
  x = (pixels / 255.0 - np.asarray(data.mean)) / np.asarray(data.std)
  ids = loaded.tokenizer.encode(texts, loaded.config.text_len)
  zimg, ztxt, out = loaded.module().apply(
    {"params": loaded.params}, jnp.asarray(x, jnp.float32), jnp.asarray(ids)
  )
  return np.asarray(two_tower.image_text_logits(zimg, ztxt, out))


def test_image_text_logits_and_token_ids_equal_transformers(hf_folder):
  loaded = sources.load(hf_folder)
  pixels = fx.images()
  expected = fx.reference(hf_folder, fx.TEXTS, pixels)
  ours = our_logits(loaded, pixels, fx.TEXTS)
  assert np.abs(ours - expected).max() <= 1e-5 * np.abs(expected).max(), (ours, expected)
  ids = loaded.tokenizer.encode(fx.TEXTS, fx.TEXT_LEN)
  np.testing.assert_array_equal(ids, fx.reference_ids(hf_folder, fx.TEXTS))
  # The folder named as a run's caption tokenizer (config.text.tokenizer) is the same one.
  run_ids = free_text.load_tokenizer(hf_folder, "none").encode(fx.TEXTS, fx.TEXT_LEN)
  np.testing.assert_array_equal(run_ids, ids)


def test_siglip2_positions_resample_as_transformers_at_another_grid():
  """NaFlex's table at a grid other than the stored one: transformers' function."""
  import torch  # pylint: disable=g-import-not-at-top
  from transformers.models.siglip2 import modeling_siglip2  # pylint: disable=g-import-not-at-top

  from vit_jax.weights.hf import two_tower_table  # pylint: disable=g-import-not-at-top

  table = np.random.default_rng(0).normal(size=(16, 5)).astype(np.float32)  # a 4x4 grid
  for grid in ((4, 4), (6, 6), (3, 3)):
    expected = modeling_siglip2.Siglip2VisionEmbeddings.resize_positional_embeddings(
      torch.from_numpy(table.reshape(4, 4, 5)), torch.tensor([grid]), grid[0] * grid[1]
    )[0].numpy()
    np.testing.assert_allclose(two_tower_table.naflex_positions(table, grid), expected, atol=1e-6)


def _copy(src: str, dst: str, drop: tuple[str, ...] = ()) -> str:
  shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*drop))
  return dst


def test_unknown_model_type_and_missing_tokenizer_are_one_error_each(hf_folder, tmp_path):
  other = _copy(hf_folder, str(tmp_path / "blip"))
  path = os.path.join(other, "config.json")
  with open(path) as f:
    config = json.load(f)
  with open(path, "w") as f:
    json.dump({**config, "model_type": "blip", "architectures": ["BlipModel"]}, f)
  with pytest.raises(errors.CheckpointError, match="model_type 'blip' \\(BlipModel\\).*CLIPModel"):
    sources.load(other)
  bare = _copy(hf_folder, str(tmp_path / "bare"), drop=("tokenizer*", "spiece.model"))
  with pytest.raises(errors.CheckpointError, match="No tokenizer_config.json in .*save_pretrained"):
    sources.load(bare)
  if os.path.isfile(os.path.join(hf_folder, "spiece.model")):
    vocabless = _copy(hf_folder, str(tmp_path / "vocabless"), drop=("spiece.model",))
    with pytest.raises(errors.CheckpointError, match="No spiece.model in .*SiglipTokenizer"):
      sources.load(vocabless)


def test_export_back_gives_transformers_the_same_logits(hf_folder, tmp_path):
  from vit_jax.weights import writers  # pylint: disable=g-import-not-at-top

  loaded = sources.load(hf_folder)
  out = writers.save(loaded, "hf", tmp_path / "out", class_names=None, image_size=loaded.image_size)
  pixels = fx.images()
  np.testing.assert_allclose(
    fx.reference(out, fx.TEXTS, pixels), fx.reference(hf_folder, fx.TEXTS, pixels), atol=1e-6
  )
  np.testing.assert_array_equal(
    fx.reference_ids(out, fx.TEXTS), fx.reference_ids(hf_folder, fx.TEXTS)
  )
  # npz: the whole model, its tokenizer files beside it, read back the same.
  npz_out = writers.save(loaded, "npz", tmp_path / "npz", class_names=None, image_size=(16, 16))
  again = sources.load(os.path.join(npz_out, npz.EXPORT_FILE))
  np.testing.assert_array_equal(
    our_logits(again, pixels, fx.TEXTS), our_logits(loaded, pixels, fx.TEXTS)
  )


def test_a_model_transformers_cannot_hold_is_refused_with_the_reasons(tmp_path):
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  from vit_jax.weights import writers  # pylint: disable=g-import-not-at-top

  config = models.two_tower_config(
    models.get_model_config("testing"), text=dict(width=16, depth=1, mlp_dim=32, num_heads=2,
    vocab_size=40, pool="gap"), text_len=8, embed_dim=16,
  )  # fmt: skip
  module = models.create_model(config, num_classes=None)
  import jax  # pylint: disable=g-import-not-at-top

  params = module.init(
    jax.random.PRNGKey(0), jnp.zeros((1, 16, 16, 3)), jnp.zeros((1, 8), jnp.int32)
  )
  loaded = sources.LoadedModel(config, params["params"], None, (16, 16), None, "memory")
  with pytest.raises(errors.CommandLineError, match="image projection with a bias.*image_head"):
    writers.save(loaded, "hf", tmp_path / "out", class_names=None, image_size=(16, 16))
  loaded.config = loaded.config.replace(image_head="none")
  with pytest.raises(
    errors.CommandLineError, match="image classifier='token' .*'map'.*text pool='gap'"
  ):
    writers.save(loaded, "hf", tmp_path / "out", class_names=None, image_size=(16, 16))
  # An image tower of another family: the family record's reason (`Family.hf_refusal`).
  config.image = tiny_mixer()
  module = models.create_model(config, num_classes=None)
  params = module.init(
    jax.random.PRNGKey(0), jnp.zeros((1, 16, 16, 3)), jnp.zeros((1, 8), jnp.int32)
  )
  loaded = sources.LoadedModel(config, params["params"], None, (16, 16), None, "memory")
  with pytest.raises(
    errors.CommandLineError, match="a mixer image tower \\(transformers has no MLP-Mixer\\)"
  ):
    writers.save(loaded, "hf", tmp_path / "out", class_names=None, image_size=(16, 16))
  assert not os.path.exists(tmp_path / "out")


@pytest.fixture(scope="module")
def siglip2_folder(tmp_path_factory) -> str:
  directory = str(tmp_path_factory.mktemp("siglip2_predict"))
  fx.siglip2(directory)
  return directory


def test_predict_texts_prints_transformers_siglip2_probabilities(siglip2_folder, tmp_path, capsys):
  from PIL import Image  # pylint: disable=g-import-not-at-top

  from vit_jax import predict  # pylint: disable=g-import-not-at-top

  pixels = fx.images(3)
  for i, p in enumerate(pixels):
    Image.fromarray(p).save(tmp_path / f"{i}.png")
  texts = ["a photo of a cat", "a red car", "dog"]
  argv = ["predict", f"--checkpoint={siglip2_folder}", f"--texts={','.join(texts)}", "--json"]
  assert predict.main([*argv, str(tmp_path)]) == 0
  lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  expected = 1 / (1 + np.exp(-fx.reference(siglip2_folder, texts, pixels)))  # sigmoid per text
  assert [os.path.basename(line["file"]) for line in lines] == ["0.png", "1.png", "2.png"]
  for line, probs in zip(lines, expected):
    scores = {entry["label"]: entry["probability"] for entry in line["top_k"]}
    assert [entry["label"] for entry in line["top_k"]] == [texts[i] for i in np.argsort(-probs)]
    np.testing.assert_allclose([scores[t] for t in texts], probs, atol=1e-4)
  # The Python face: vit_jax.load's Model scores the same files the same.
  import vit_jax  # pylint: disable=g-import-not-at-top

  files = [str(tmp_path / f"{i}.png") for i in range(3)]
  probs = vit_jax.load(siglip2_folder, batch_size=2).text_probabilities(files, texts)
  np.testing.assert_allclose(probs, expected, atol=1e-4)


def test_the_image_tower_fine_tunes_and_few_shots_from_a_two_tower_folder(
  hf_folder, digits_dir, capsys
):
  import jax  # pylint: disable=g-import-not-at-top
  from flax import traverse_util  # pylint: disable=g-import-not-at-top

  from vit_jax import fewshot, models, weights  # pylint: disable=g-import-not-at-top

  loaded = sources.load(hf_folder)
  image = models.image_settings(loaded.config)
  module = models.create_model(image, num_classes=None)
  init = module.init(jax.random.PRNGKey(0), jnp.zeros((1, fx.IMAGE, fx.IMAGE, 3)))["params"]
  fitted = weights.load_pretrained(hf_folder, jax.device_get(init), image)
  flat, expected = (traverse_util.flatten_dict(t, sep="/") for t in (fitted, loaded.params["img"]))
  assert set(flat) == set(expected)
  for k, v in flat.items():
    np.testing.assert_array_equal(v, expected[k], err_msg=k)
  argv = ["fewshot", f"--checkpoint={hf_folder}", "--dataset=digits", "--shots=5", "--seeds=1"]
  assert fewshot.main([*argv, f"--data_dir={digits_dir}", "--batch=256"]) == 0
  row = next(
    line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("digits ")
  )
  assert row[1] == "5" and 0.1 < float(row[2]) <= 1.0  # 10 classes: above chance


def test_stablehlo_export_of_an_image_text_model_is_its_image_tower(hf_folder, tmp_path):
  """timm, saved_model and stablehlo write the image tower: its features, whose projection
  (none for SigLIP) and unit length are the model's image embeddings."""
  import jax  # pylint: disable=g-import-not-at-top

  from vit_jax.weights import writers  # pylint: disable=g-import-not-at-top

  loaded = sources.load(hf_folder)
  out = writers.save(loaded, "stablehlo", tmp_path / "hlo", class_names=None, image_size=(16, 16))
  with open(os.path.join(out, "model.jax_exported"), "rb") as f:
    exported = jax.export.deserialize(f.read())
  x = np.random.default_rng(0).uniform(-1, 1, (1, fx.IMAGE, fx.IMAGE, 3)).astype(np.float32)
  features = np.asarray(exported.call(x))
  zimg, _, _ = loaded.module().apply({"params": loaded.params}, x, None)
  head = loaded.params.get("img_head")
  z = features if head is None else features @ np.asarray(head["kernel"]) + head.get("bias", 0)
  np.testing.assert_allclose(z / np.linalg.norm(z, axis=-1, keepdims=True), zimg, atol=1e-5)


def test_a_gemma_tokenizer_folder_pads_left_as_transformers(tmp_path):
  """SigLIP 2 folders on the hub name GemmaTokenizer, whose class pads left by default."""
  import transformers as tr  # pylint: disable=g-import-not-at-top

  from vit_jax.data import folder_tokenizer  # pylint: disable=g-import-not-at-top

  state = json.loads(fx._bpe(["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]).to_str())["model"]
  merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
  tr.GemmaTokenizer(vocab=state["vocab"], merges=merges).save_pretrained(tmp_path)
  ours = folder_tokenizer.read_folder_tokenizer(str(tmp_path)).encode(fx.TEXTS, fx.TEXT_LEN)
  np.testing.assert_array_equal(ours, fx.reference_ids(str(tmp_path), fx.TEXTS))
  assert ours[1, 0] == 0  # "dog": the padding first
