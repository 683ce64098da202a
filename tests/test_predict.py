"""`vit_jax.predict` and the architecture inference behind it: every official variant is
recovered from its array shapes; a run's checkpoint predicts its test images with the
accuracy the run reported; unreadable images are skipped."""

from __future__ import annotations

import io
import json
import os
import sys

import jax
import numpy as np
import pytest
from flax import traverse_util
from PIL import Image

from tests import interop_fixtures as fx
from vit_jax import models, predict, weights
from vit_jax.data import digits
from vit_jax.infra import errors
from vit_jax.weights import architecture, sources

_ARCH_FIELDS = (
  "patches.size",
  "hidden_size",
  "transformer.num_layers",
  "transformer.mlp_dim",
  "transformer.num_heads",
  "classifier",
  "posemb",
  "representation_size",
)


_MIXER_ARCH_FIELDS = (
  "model_type",
  "patches.size",
  "hidden_dim",
  "num_blocks",
  "tokens_mlp_dim",
  "channels_mlp_dim",
)


def _arch(config) -> dict:
  arch = {}
  fields = _MIXER_ARCH_FIELDS if models.is_mixer(config) else _ARCH_FIELDS
  for field in ("model_type",) if models.is_bit(config) else fields:
    value = config
    for part in field.split("."):
      value = getattr(value, part)
    arch[field] = tuple(value) if isinstance(value, (list, tuple)) else value
  resnet = config.get("resnet")
  arch["resnet"] = None if resnet is None else (tuple(resnet.num_layers), resnet.width_factor)
  return arch


def _param_shapes(config, num_classes: int, size: int):
  model = models.create_model(config, num_classes=num_classes)
  dummy = jax.ShapeDtypeStruct((1, size, size, 3), np.float32)
  return jax.eval_shape(model.init, jax.random.PRNGKey(0), dummy)["params"]


# 'unpooled' applies the head to every token: the same shapes as 'gap'; an activation
# leaves no trace in the shapes (CLIP-B_16-quickgelu reads as CLIP-B_16), SigLIP 2's B/16
# is SigLIP's architecture (reads as SigLIP-B_16), nor do rotary
# position embeddings (DINOv3, EVA-02: their folders name the architecture in timm's
# config.json, tests/test_timm_eva.py).
@pytest.mark.parametrize(
  "name",
  [
    n
    for n in models.MODEL_NAMES
    if n not in ("testing-unpooled", "CLIP-B_16-quickgelu", "SigLIP2-B_16")
    and not models.get_model_config(n).get("rope")
  ],
)
def test_every_official_variant_is_recovered_from_its_shapes(name):
  """A ViT's blocks traced as one nn.scan (a tenth of the tracing; the stacked layout reads
  as the per-layer one: test_layout_and_options_are_recovered), a Mixer's and a BiT's as
  they are."""
  config = models.get_model_config(name)
  if not (models.is_mixer(config) or models.is_bit(config)):
    config.scan = True
  shapes = _param_shapes(config, 1000, 224)
  inferred = architecture.infer_settings(shapes)
  assert inferred.name == name and _arch(inferred) == _arch(config)
  assert architecture.num_classes(shapes) == 1000
  # A BiT ResNet's weights do not fix the input size (no position table, no token MLP).
  size = None if models.is_bit(config) else (224, 224)
  assert architecture.trained_image_size(shapes, inferred) == size


@pytest.mark.parametrize(
  "changes",
  [dict(scan=True), dict(classifier="gap"), dict(representation_size=48), dict(posemb="learn_2d")]
  + [dict(posemb="relative"), dict(posemb="relative", scan=True)],
)
def test_layout_and_options_are_recovered(changes):
  config = models.get_model_config("testing")
  config.update(changes)
  shapes = _param_shapes(config, 7, 24)
  inferred = architecture.infer_settings(shapes)
  assert _arch(inferred) == _arch(config) and inferred.name == "testing"
  assert architecture.trained_image_size(shapes, inferred) == (24, 24)


def test_a_written_npz_loads_with_its_inferred_architecture(tmp_path):
  config, params, size = fx.write_npz(tmp_path / "m.npz", "r26_s32")
  loaded = sources.load(tmp_path / "m.npz")
  assert _arch(loaded.config) == _arch(config) and loaded.config.name == "custom"
  assert loaded.image_size == (size, size) and loaded.num_classes == fx.NUM_CLASSES
  with pytest.raises(ValueError, match=r"(?s)does not fit.*more\n.*pass the checkpoint's model"):
    sources.load(tmp_path / "m.npz", model_name="R50+ViT-B_16")


def test_what_cannot_be_inferred_is_listed_in_one_error():
  flat = traverse_util.flatten_dict(fx.random_model("vit_ti16")[1], sep="/")
  for key in ("embedding/kernel", architecture.POSEMB):
    del flat[key]
  with pytest.raises(
    ValueError,
    match=r"patch size and width .*; position embeddings .*"
    r"--model=NAME",
  ):
    architecture.infer_settings(traverse_util.unflatten_dict(flat, sep="/"))


def test_class_names_default_to_imagenet_for_1000_classes(tmp_path):
  model = sources.LoadedModel(models.get_model_config("testing"), {}, 1000, None, None, "x")
  names = model.class_names_for()
  assert len(names) == 1000 and names[207] == "golden retriever" and names[0].startswith("tench")
  (tmp_path / "three.txt").write_text("a\nb\nc\n")
  with pytest.raises(ValueError, match="3 class names for a head of 1000 classes"):
    model.class_names_for(str(tmp_path / "three.txt"))


def test_loaded_model_facts_name_the_callers_argument(tmp_path):
  """A library call's error names its argument, a command's its flag."""
  config = models.get_model_config("testing")
  model = sources.LoadedModel(config, {}, 3, (16, 16), None, "x")
  assert model.class_names_for() == ["0", "1", "2"] and model.image_size_for() == (16, 16)
  with pytest.raises(errors.MissingError, match=r"^labels='nope' is neither 'imagenet2012'"):
    model.class_names_for("nope")
  with pytest.raises(errors.MissingError, match=r"^--labels='nope'"):
    model.class_names_for("nope", argument="--labels")
  with pytest.raises(errors.ConfigError, match=r"^resolution=32, but 'x' has position embed"):
    model.image_size_for(32)
  with pytest.raises(errors.ConfigError, match=r"leave --resolution out"):
    model.image_size_for(32, argument="--resolution")
  unsized = sources.LoadedModel(config, {}, 3, None, None, "y")
  assert unsized.image_size_for(24) == (24, 24)
  with pytest.raises(errors.ConfigError, match=r"does not say its image size.*pass resolution\."):
    unsized.image_size_for()


def _png(array: np.ndarray) -> bytes:
  buffer = io.BytesIO()
  Image.fromarray(array).save(buffer, format="PNG")
  return buffer.getvalue()


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory, trained_run):
  """(workdir, final metrics, folder of the test split as <label>/<index>.png) of the
  session's short quickstart-style run on digits at 8x8 (`trained_run`)."""
  _, workdir, metrics = trained_run
  folder = tmp_path_factory.mktemp("test_images")
  images, labels = digits.digits_arrays()
  for i in digits.split_indices()["test"]:
    os.makedirs(folder / str(labels[i]), exist_ok=True)
    (folder / str(labels[i]) / f"{i}.png").write_bytes(_png(images[i][..., 0]))
  return workdir, metrics, folder


def test_a_run_predicts_its_test_images_with_the_reported_accuracy(digits_run):
  workdir, metrics, folder = digits_run
  predictions = list(predict.predict(os.path.join(workdir, "checkpoints"), [str(folder)], k=1))
  assert len(predictions) == digits.NUM_TEST
  correct = sum(p.top[0][0] == os.path.basename(os.path.dirname(p.path)) for p in predictions)
  assert correct / digits.NUM_TEST == metrics["eval/accuracy"]
  assert metrics["eval/accuracy"] > 0.3  # trained: far above chance (0.1)


def test_corrupt_files_are_reported_and_skipped_without_tensorflow(
  tmp_path, caplog, capsys, monkeypatch
):
  monkeypatch.setitem(sys.modules, "tensorflow", None)  # `import tensorflow` now raises
  fx.write_npz(tmp_path / "m.npz", "vit_ti16")
  weights.check_source(str(tmp_path / "m.npz"), fetch=True)  # a local source: no TensorFlow
  with pytest.raises(errors.MissingError, match="does not exist"):
    weights.check_source(str(tmp_path / "missing.npz"), fetch=True)
  rng = np.random.default_rng(0)
  folder = tmp_path / "images"
  folder.mkdir()
  Image.fromarray(rng.integers(0, 256, (40, 50, 3), np.uint8)).save(folder / "a_rgb.jpg")
  Image.fromarray(rng.integers(0, 256, (20, 20, 4), np.uint8)).save(folder / "b_rgba.png")
  Image.fromarray(rng.integers(0, 256, (9, 30), np.uint8)).save(folder / "c_grey.jpg")
  (folder / "d_corrupt.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
  (folder / "notes.txt").write_text("not an image")
  (tmp_path / "labels.txt").write_text("\n".join("abcde") + "\n")

  argv = [
    "predict",
    f"--checkpoint={tmp_path / 'm.npz'}",
    f"--labels={tmp_path / 'labels.txt'}",
    "--top_k=2",
    "--json",
    "--batch=2",
    str(folder),
  ]
  with caplog.at_level("WARNING"):
    assert predict.main(argv) == 0
  rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert [os.path.basename(r["file"]) for r in rows] == ["a_rgb.jpg", "b_rgba.png", "c_grey.jpg"]
  for row in rows:
    probs = [t["probability"] for t in row["top_k"]]
    assert len(probs) == 2 and probs[0] >= probs[1] and sum(probs) <= 1.0
    assert {t["label"] for t in row["top_k"]} <= set("abcde")
  assert "Skipped 1 of 4 files" in caplog.text and "d_corrupt.jpg" in caplog.text


def test_batches_give_the_logits_of_one_call(tmp_path):
  config, params, size = fx.random_model("vit_ti16")
  model = sources.LoadedModel(config, params, fx.NUM_CLASSES, (size, size), None, "m")
  images = fx.images(5, size)
  classifier = predict.Classifier(model, (size, size), batch=2)
  module = model.module()
  want = jax.nn.softmax(module.apply({"params": params}, images))
  np.testing.assert_allclose(classifier.probabilities(images), want, rtol=1e-5, atol=1e-6)
