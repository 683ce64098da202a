"""The config files set only what differs from `configs/common.py`, and a mistyped
`--config.<key>` is answered with keys that look like it."""

import importlib
import pathlib

import pytest
from absl import flags
from ml_collections import config_flags

from configs import common
from vit_jax import cli

CONFIGS = pathlib.Path(__file__).resolve().parent.parent / "configs"
# Each config file with get_config and an argument it takes (None: it takes none).
EXAMPLE_ARGS = {
  "augreg": "ti16,imagenet21k",
  "lit": "digits",
  "mixer": "b16,imagenet2012",
  "mpp": "digits",
  "plain_vit_i1k": "s16",
  "pretrain": "b16,imagenet21k",
  "quickstart": None,
  "siglip": "b16,B,cifar10",
  "vit": "b16,cifar10",
  "vtab": "b16,dtd",
}


def _keys(config) -> set[str]:
  """Every key path, but inside `model`: a config file may pick another family's model,
  whose config is that family's own (`models.get_model_config`)."""
  return {k for k in cli._config_keys(config) if not k.startswith("model.")}


def test_every_config_file_is_listed():
  files = [p for p in CONFIGS.glob("*.py") if p.stem != "common"]
  with_get_config = {p.stem for p in files if "def get_config(" in p.read_text()}
  assert with_get_config == set(EXAMPLE_ARGS)


@pytest.mark.parametrize("name", sorted(EXAMPLE_ARGS))
def test_every_common_key_is_in_every_config_files_result(name):
  module = importlib.import_module(f"configs.{name}")
  arg = EXAMPLE_ARGS[name]
  config = module.get_config(arg) if arg else module.get_config()
  missing = _keys(common.get_config()) - _keys(config)
  assert not missing, f"configs/{name}.py drops {sorted(missing)}"


def test_a_nested_override_reaches_the_quickstart():
  path = str(CONFIGS / "quickstart.py")
  argv = ["prog", f"--config={path}", "--config.pp.randaug=(2, 10)"]
  assert cli._unknown_key_message(argv) is None
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values, sys_argv=argv)
  flag_values(argv)
  assert tuple(flag_values.config.pp.randaug) == (2, 10)
  assert flag_values.config.pp.crop == 16


@pytest.mark.parametrize(
  "typed, expected",
  [
    ("lr.bse", ["lr.base"]),  # its section
    ("sed", ["seed"]),  # most letters
    ("batchh", ["batch"]),
    ("pp.randaug", []),  # nothing shares its section or most letters
    ("no_such_key", []),
  ],
)
def test_closest_keys_share_a_section_or_most_letters(typed, expected):
  valid = [k for k in cli._config_keys(common.get_config()) if k != "pp.randaug"]
  assert cli.closest_keys(typed, valid)[: len(expected) or None] == expected


def test_closest_keys_never_offer_pretrained_for_pp_randaug():
  valid = [k for k in cli._config_keys(common.get_config()) if k != "pp.randaug"]
  assert "pretrained" not in cli.closest_keys("pp.randaug", valid)
