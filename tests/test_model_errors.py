"""The usual mistakes with `vit_jax.Model`, `load` and `create`, each one line naming the
fix, raised before anything compiles: channels-first inputs (numpy, torch, jax; traced
too), inputs of another size than the model's, unknown names with the closest ones; texts
longer than the text tower reads are cut with a warning naming ``text_len``; and
``dir(vit_jax)`` lists the public names."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vit_jax
from tests import hf_text_fixtures, interop_fixtures
from vit_jax.infra import errors

X = interop_fixtures.images(2, 16)  # float32 [2, 16, 16, 3]


@pytest.fixture(scope="module")
def model() -> vit_jax.Model:
  return vit_jax.create("testing", num_classes=3, image_size=16)


def _one_line(error: pytest.ExceptionInfo) -> str:
  message = str(error.value)
  assert "\n" not in message
  return message


def test_channels_first_inputs_name_the_transpose_in_their_library(model):
  nchw = X.transpose(0, 3, 1, 2)
  with pytest.raises(errors.ConfigError, match=r"channels-first \(NCHW\) numpy") as e:
    model(nchw)
  assert "x.transpose(0, 2, 3, 1)" in _one_line(e)
  with pytest.raises(errors.ConfigError, match=r"jnp\.transpose\(x, \(0, 2, 3, 1\)\)"):
    model.features(jnp.asarray(nchw))
  with pytest.raises(errors.ConfigError, match=r"NCHW\) jax array"):
    jax.jit(lambda m, x: m(x))(model, jnp.asarray(nchw))
  torch = pytest.importorskip("torch")
  with pytest.raises(errors.ConfigError, match=r"NCHW\) torch array .*x\.permute\(0, 2, 3, 1\)"):
    model(torch.from_numpy(nchw))
  np.testing.assert_array_equal(model(torch.from_numpy(X)), model(X))  # NHWC torch works
  with pytest.raises(errors.ConfigError, match=r"\(CHW\) numpy array .*x\.transpose\(1, 2, 0\)"):
    model.prepare(np.zeros((3, 40, 40), np.uint8))  # an image, as torchvision holds it
  with pytest.raises(errors.ConfigError, match=r"\(NCHW\) torch array"):
    model.predict(torch.zeros((2, 3, 40, 40), dtype=torch.uint8))


def test_another_input_size_names_at_resolution(model):
  x = interop_fixtures.images(2, 32)
  with pytest.raises(errors.ConfigError, match=r"built for 16x16 inputs, got 32x32") as e:
    model(x)
  assert "model.at_resolution(32)" in _one_line(e)
  with pytest.raises(errors.ConfigError, match=r"model\.at_resolution\(\(32, 24\)\)"):
    jax.jit(lambda m, x: m.features(x))(model, x[:, :, :24])
  assert model.at_resolution(32)(x).shape == (2, 3)


def test_unknown_names_get_the_closest_ones():
  with pytest.raises(errors.ConfigError, match=r"did you mean vit_tiny_patch16_224") as e:
    vit_jax.create("vit_tiny_patch16_244")
  assert len(_one_line(e)) < 300  # the closest names, not the whole table
  with pytest.raises(errors.ConfigError, match=r"did you mean vit_tiny_patch16_224"):
    vit_jax.create("vit_tiny_patch16_244", pretrained=True)  # before any download
  with pytest.raises(errors.MissingError, match=r"did you mean hf-hub:timm/vit_tiny_patch16_224"):
    vit_jax.load("vit_tiny_patch16_244")
  with pytest.raises(errors.MissingError, match=r"did you mean ViT-B_16"):
    vit_jax.load("ViT-B_61")
  with pytest.raises(errors.MissingError, match=r"vit_jax\.load\('hf-hub:timm/vit_small_patch"):
    vit_jax.load("vit_small_patch16_224")  # a timm architecture: its hub name
  with pytest.raises(errors.MissingError, match=r"No checkpoint at .*nothing\.npz"):
    vit_jax.load("nothing.npz")  # a file name: the file's own error


def test_over_long_texts_are_cut_with_a_warning_naming_text_len(tmp_path):
  pytest.importorskip("transformers")
  hf_text_fixtures.clip(str(tmp_path))
  clip = vit_jax.load(str(tmp_path))
  images = list(hf_text_fixtures.images(1))
  long = " ".join(hf_text_fixtures.CORPUS[:6])  # more than TEXT_LEN (12) tokens
  with pytest.warns(UserWarning, match=r"1 of 2 texts have more than text_len=12 tokens"):
    cut = clip.text_probabilities(images, ["a cat", long])
  with pytest.warns(UserWarning, match=r"text_len=12"):  # again: the tokenizer keeps counting
    assert np.array_equal(clip.text_probabilities(images, ["a cat", long]), cut)
  with warnings.catch_warnings():
    warnings.simplefilter("error", UserWarning)
    clip.text_probabilities(images, ["a cat", "a dog"])


def test_dir_lists_the_public_names():
  names = dir(vit_jax)
  assert {"Model", "load", "create", "from_pretrained", "create_model"} <= set(names)
  assert not {"Any", "annotations", "importlib"} & set(names)
  assert all(hasattr(vit_jax, n) for n in names)
