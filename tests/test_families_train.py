"""Each model family trains: the run's own train step (`run.build`, sharded, jitted) learns
one fixed batch, and the head-less model gives the few-shot evaluator one finite, varied
representation per image. The tiny run is `train_fixtures.fit_and_learn`, the one the
fine-tuning tests share."""

import jax
import numpy as np
import pytest

from tests import train_fixtures
from tests.test_bit import tiny_config as bit_config
from tests.test_mixer import tiny_config as mixer_config
from vit_jax import models
from vit_jax.run.evaluators import fewshot

# family -> (model config, run overrides)
FAMILIES = {
  "vit": (lambda: models.get_model_config("testing"), {}),
  "axial_vit": (lambda: _testing(axial=True, classifier="gap"), {}),
  "relative_posemb": (lambda: _testing(posemb="relative"), {}),
  "mixer": (mixer_config, {}),
  "bit_accumulated": (lambda: bit_config(units=(1, 1)), {"accum_steps": 2}),
}


def _testing(**changes):
  config = models.get_model_config("testing")
  config.update(changes)
  return config


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_learns_a_fixed_batch_and_gives_few_shot_features(family, digits_dir):
  model, overrides = FAMILIES[family]
  config = train_fixtures.tiny_config(digits_dir, **overrides)
  config.model = model()
  state, losses = train_fixtures.fit_and_learn(config)
  assert losses[0] == pytest.approx(np.log(10), rel=1e-4)  # the zero head
  assert all(later < earlier for earlier, later in zip(losses, losses[1:])), losses

  evaluator_model = models.create_model(config.model, num_classes=None)
  batch = train_fixtures.fixed_batch(8, config.pp.crop)
  batch["mask"] = np.ones(8, np.float32)
  names = jax.eval_shape(
    lambda: evaluator_model.init(jax.random.PRNGKey(0), batch["image"], train=False)
  )["params"]
  params = {k: v for k, v in state.params.items() if k in names}
  features = np.asarray(fewshot.features_step(params, batch, model=evaluator_model)["features"])
  assert features.ndim == 2 and features.shape[0] == 8 and np.isfinite(features).all()
  assert features.std(axis=0).max() > 0  # images are told apart
