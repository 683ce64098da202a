"""The recipe configs (`configs/plain_vit_i1k.py`, `configs/augreg.py`) against big_vision's
files, and built into a run's steps without data."""

import pytest

from configs import augreg, plain_vit_i1k
from tests import train_fixtures
from vit_jax.run import optim

# big_vision/configs/vit_s16_i1k.py, as published (its optimizer: clip -> scale_by_adam ->
# scale(lr) -> add_decayed_weights(wd) -> scale_by_schedule -> scale(-1)).
BIG_VISION_S16 = dict(
  batch=1024,
  train_split="train[:99%]",
  lr=1e-3,
  wd=1e-4,
  warmup_steps=10_000,
  decay="cosine",
  grad_clip_norm=1.0,
  mu_dtype="bfloat16",
  mixup_p=0.2,
  randaug=(2, 10),
  pool="gap",
  posemb="sincos2d",
  rep_size=True,
  loss="softmax_xent",
  crop=224,
)


def decay_per_step_at_peak(config) -> float:
  """The parameter shrink of one step at the peak learning rate: our weight decay is
  scaled by the learning rate, big_vision's ``wd`` only by the schedule (1 at the peak)."""
  return config.optim.weight_decay * config.lr.base


@pytest.mark.parametrize("epochs, steps", [(90, 111_477), (150, 185_795), (300, 371_589)])
def test_plain_vit_s16_is_big_visions_recipe(epochs, steps):
  config = plain_vit_i1k.get_config(f"s16,{epochs}")
  bv = BIG_VISION_S16
  assert config.total_steps == steps  # epochs x 1,268,355 images / 1024, rounded up
  assert (config.batch, config.train_split, config.pp.crop) == (
    bv["batch"],
    bv["train_split"],
    bv["crop"],
  )
  assert (config.lr.base, config.lr.warmup_steps, config.lr.decay) == (
    bv["lr"],
    bv["warmup_steps"],
    bv["decay"],
  )
  assert decay_per_step_at_peak(config) == pytest.approx(bv["wd"], rel=1e-12)
  assert not config.optim.decay_all_params  # kernels only, as big_vision's `.*/kernel$`
  assert config.optim.grad_clip_norm == bv["grad_clip_norm"]
  assert config.optim.momentum_dtype == bv["mu_dtype"]
  assert (config.mixup.p, config.pp.randaug) == (bv["mixup_p"], bv["randaug"])
  model = config.model
  assert (model.classifier, model.posemb, config.loss) == (bv["pool"], bv["posemb"], bv["loss"])
  assert model.representation_size == model.hidden_size == 384
  assert (model.stoch_depth, model.transformer.dropout_rate) == (0.0, 0.0)


def test_plain_vit_arguments():
  assert plain_vit_i1k.get_config().total_steps == plain_vit_i1k.get_config("s16,90").total_steps
  with pytest.raises(ValueError, match=r"'s16,100'.*\(90, 150, 300\)"):
    plain_vit_i1k.get_config("s16,100")


@pytest.mark.parametrize(
  "arg, setting",
  [
    ("ti16,imagenet2012", "light1"),
    ("s32,imagenet2012", "medium1"),
    ("b16,imagenet2012", "medium2"),
    ("s16,imagenet21k", "light1"),
    ("l16,imagenet21k", "medium2"),
    ("b16,imagenet2012,strong2", "strong2"),
  ],
)
def test_augreg_settings(arg, setting):
  config = augreg.get_config(arg)
  randaug, mixup_p = augreg.SETTINGS[setting]
  assert (config.pp.randaug, config.mixup.p) == (randaug, mixup_p)
  assert config.batch == 4096 and config.optim.momentum_dtype == "bfloat16"
  assert decay_per_step_at_peak(config) == pytest.approx(1e-4, rel=1e-12)
  assert config.loss == "sigmoid_xent"
  if "imagenet21k" in arg:
    assert (config.model.head_bias_init, config.model.classifier) == (-10.0, "gap")
  else:
    assert (config.model.head_bias_init, config.model.classifier) == (-6.9, "token")
    assert config.model.representation_size == config.model.hidden_size


def test_augreg_table_and_errors():
  assert augreg.SETTINGS["medium1"] == ((2, 15), 0.2)
  assert augreg.SETTINGS["strong2"] == ((2, 20), 0.8)
  with pytest.raises(ValueError, match="unknown setting 'heavy'"):
    augreg.get_config("b16,imagenet2012,heavy")
  with pytest.raises(ValueError, match="Models: ti16, s32, s16, b32, b16, l16"):
    augreg.get_config("h14,imagenet2012")


@pytest.mark.parametrize(
  "config",
  [plain_vit_i1k.get_config("s16"), augreg.get_config("ti16,imagenet21k")],
  ids=["plain_vit_s16", "augreg_ti16_i21k"],
)
def test_recipes_resolve_into_a_run(config):
  """Resolved and built (abstract state, no data, nothing compiled) on this host."""
  config.batch = config.batch_eval = 8  # the host's memory check sees the input batches
  steps = train_fixtures.build_steps(config, num_classes=config.num_classes)
  assert isinstance(steps.spec.optimizer, optim.OptimizerSettings)
  assert steps.spec.mixup.p == config.mixup.p
  assert steps.spec.optimizer.momentum_dtype == "bfloat16"
