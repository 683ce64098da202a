"""`LoadedModel.module`: the loaded architecture with its own head, a new head, or none."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np

from vit_jax import models, weights
from vit_jax.weights import npz


def test_module_keeps_replaces_or_drops_the_head(tmp_path):
  config = models.get_model_config("testing")
  model = models.create_model(config, num_classes=3)
  images = np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)
  params = jax.device_get(model.init(jax.random.PRNGKey(0), images, train=False)["params"])
  params = jax.tree.map(np.asarray, params)
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
