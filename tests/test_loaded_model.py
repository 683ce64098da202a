"""`LoadedModel.module`: the loaded architecture with its own head, a new head, or none."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import pytest

from vit_jax import models, weights
from vit_jax.infra import errors
from vit_jax.weights import npz


def _params(model, images) -> dict:
  """Fresh parameters of ``model`` as host arrays."""
  params = model.init(jax.random.PRNGKey(0), images, train=False)["params"]
  return jax.tree.map(np.asarray, jax.device_get(nn.unbox(params)))


def test_module_keeps_replaces_or_drops_the_head(tmp_path):
  config = models.get_model_config("testing")
  model = models.create_model(config, num_classes=3)
  images = np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)
  params = _params(model, images)
  npz.save_npz(tmp_path / "m.npz", params)
  loaded = weights.load(tmp_path / "m.npz", "testing")
  assert loaded.num_classes == 3

  logits = loaded.module().apply({"params": loaded.params}, images)
  np.testing.assert_allclose(logits, model.apply({"params": params}, images), rtol=1e-6)
  headless = {k: v for k, v in loaded.params.items() if k != "head"}
  for no_head in (0, None):
    features = loaded.module(num_classes=no_head).apply({"params": headless}, images)
    assert features.shape == (2, config.hidden_size)
    # The head is a Dense on these features: the features are the pre-logits.
    head = loaded.params["head"]
    np.testing.assert_allclose(features @ head["kernel"] + head["bias"], logits, atol=1e-5)
  new = loaded.module(num_classes=5).init(jax.random.PRNGKey(1), images, train=False)
  assert nn.unbox(new["params"]["head"]["kernel"]).shape == (config.hidden_size, 5)


def test_an_npz_saved_with_its_config_reads_back_whole(tmp_path):
  """The arrays cannot say the GELU's form or the input statistics: the config saved
  beside them does, so the reloaded model computes what was saved."""
  config = models.get_model_config("testing")
  config.gelu_approximate = False
  config.input_mean, config.input_std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
  model = models.create_model(config, num_classes=3)
  images = np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)
  params = _params(model, images)
  npz.save_npz(tmp_path / "m.npz", params, config=config)
  loaded = weights.load(tmp_path / "m.npz")
  assert loaded.config.gelu_approximate is False
  assert tuple(loaded.config.input_mean) == (0.485, 0.456, 0.406)
  np.testing.assert_array_equal(
    loaded.module().apply({"params": loaded.params}, images),
    model.apply({"params": params}, images),
  )
  # Without it the shapes decide, and the official defaults fill the rest.
  npz.save_npz(tmp_path / "bare.npz", params)
  assert weights.load(tmp_path / "bare.npz").config.gelu_approximate is True


def test_a_config_beside_an_npz_that_is_not_json_is_one_error(tmp_path):
  model = models.create_model(models.get_model_config("testing"), num_classes=3)
  images = np.zeros((1, 16, 16, 3), np.float32)
  params = _params(model, images)
  npz.save_npz(tmp_path / "m.npz", params)
  (tmp_path / "m.config.json").write_text("{not json")
  with pytest.raises(errors.CheckpointError, match="m.config.json' is not JSON"):
    weights.load(tmp_path / "m.npz")
