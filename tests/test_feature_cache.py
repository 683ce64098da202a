"""A LiT run's cached image features: the image tower runs in the first epoch only, and the
run ends where the uncached run ends (float tolerance); the settings it needs are named."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from flax import traverse_util

from configs import siglip
from tests import fresh_python, train_fixtures
from vit_jax import data, models
from vit_jax.infra import errors
from vit_jax.run import feature_cache
from vit_jax.weights import orbax_steps

TEXT = dict(width=16, depth=1, mlp_dim=32, num_heads=2, vocab_size=64, pool="gap")


def _lit(data_dir: str, pretrained: str, **overrides):
  config = siglip.get_config("digits")
  train_fixtures.override(config, train_fixtures.TINY)
  config.data_dir, config.pretrained = data_dir, pretrained
  config.model = models.two_tower_config(
    models.get_model_config("testing"), text=TEXT, text_len=8, embed_dim=16
  )
  # 32 examples in batches of 16: 6 steps are 3 epochs; each image the same every epoch.
  config.train_split, config.total_steps, config.checkpoint_every = "train[:32]", 6, 6
  config.contrastive.lock_image = True
  config.pp.min_area, config.pp.flip = 1.0, False
  return train_fixtures.override(config, overrides)


# The uncached and the cached run in a fresh Python compiling with XLA's MLIR fusion
# emitters (this process's are the elemental ones, `fresh_python.ELEMENTAL_FUSIONS`): there
# the image tower's features from the cache's program are the train step's, bit for bit.
# The comparison needs them so: the text tower's key bias gets no gradient but round-off
# (attention does not change with it), which Adam scales up to whole steps, so features a
# last bit apart leave it 1e-4 apart after 6 steps.
_RUNS = """
import json
from tests.test_feature_cache import _lit
from vit_jax import run
from vit_jax.run import feature_cache
digits_dir, source, workdir = {args}
real, out = feature_cache.FeatureCache, {{}}
for name, cache in (("plain", False), ("cached", True)):
  made = []
  feature_cache.FeatureCache = lambda *a: made.append(real(*a)) or made[-1]
  config = _lit(digits_dir, source, **{{"contrastive.cache_image_features": cache}})
  loss = run.train_and_evaluate(config, f"{{workdir}}/{{name}}")["eval/loss"]
  facts = [(c.computed, bool(c.filled.all()), list(c.table.shape)) for c in made]
  out[name] = dict(loss=loss, caches=facts)
print(json.dumps(out))
"""


def test_cached_features_train_as_the_uncached_run(tmp_path, tiny_run, digits_dir):
  source = os.path.join(tiny_run[0], "checkpoints")  # the supervised tiny run
  env = fresh_python.clean_env()
  env["XLA_FLAGS"] = env["XLA_FLAGS"].replace(fresh_python.ELEMENTAL_FUSIONS, "").strip()
  args = json.dumps([digits_dir, source, str(tmp_path)])
  out = fresh_python.run_json(_RUNS.format(args=args), env, timeout=600)
  plain, cached = out["plain"], out["cached"]
  assert not plain["caches"]
  # One cache, computed for the first epoch's 2 batches, then filled: 32 rows of 32.
  assert cached["caches"] == [[2, True, [32, 32]]]
  a = traverse_util.flatten_dict(orbax_steps.read_params(tmp_path / "plain" / "checkpoints"))
  b = traverse_util.flatten_dict(orbax_steps.read_params(tmp_path / "cached" / "checkpoints"))
  assert a.keys() == b.keys()
  moved = 0
  for k, v in a.items():
    np.testing.assert_allclose(b[k], v, rtol=1e-4, atol=1e-5, err_msg="/".join(k))
    moved += k[0] != "img"
  assert moved  # the text tower and projection trained
  assert cached["loss"] == pytest.approx(plain["loss"], rel=1e-4)


def test_cache_needs_a_locked_tower_and_fixed_images(digits_dir):
  config = _lit(digits_dir, "unused", **{"contrastive.cache_image_features": True})

  def check():
    feature_cache.check(config.contrastive, data.Settings.from_config(config))

  check()
  config.contrastive.lock_image = False
  with pytest.raises(errors.ConfigError, match="lock_image=False trains it"):
    check()
  config.contrastive.lock_image = True
  config.pp.flip = True
  with pytest.raises(errors.ConfigError, match="flip=True.*set config.pp.min_area=1.0"):
    check()
