"""Every ``--config.<key>=<value>`` a recipe config's docstring shows parses on the command
line as the training command parses it, and ``--config.pp.randaug=None`` turns RandAugment
off (ml_collections reads None for a tuple field as ``(None,)``)."""

import re

import pytest

from tests.test_configs import CONFIGS, EXAMPLE_ARGS
from vit_jax import cli, data

# An override as written in a docstring, quotes and all; `a|b` lists alternatives.
_OVERRIDE = re.compile(r"--config\.([\w.]+)=('[^']*'|\"[^\"]*\"|[^\s`]+)")


def _documented() -> list[tuple[str, str, str]]:
  """(config file stem, key, value) of each override in each config file's docstring."""
  found = []
  for name in sorted(EXAMPLE_ARGS):
    text = (CONFIGS / f"{name}.py").read_text()
    docstring = text.split('"""')[1]
    for key, value in _OVERRIDE.findall(docstring):
      value = value.strip("'\"")
      found += [(name, key, v) for v in value.split("|")]
  return found


DOCUMENTED = _documented()


def _parse(name: str, override: str):
  """The config that ``--config=configs/<name>.py[:arg] <override>`` gives the command."""
  arg = EXAMPLE_ARGS[name]
  argv = ["prog", f"--config={CONFIGS / name}.py" + (f":{arg}" if arg else ""), override]
  flag_values = cli.new_flag_values()
  holder = cli.define_config_flags(flag_values, argv, "")
  cli.parse_config_flags(flag_values, argv)
  return holder.value


def test_the_docstrings_document_overrides():
  assert ("plain_vit_i1k", "pp.randaug", "None") in DOCUMENTED
  assert len({name for name, _, _ in DOCUMENTED}) >= 5


@pytest.mark.parametrize("name,key,value", DOCUMENTED, ids=lambda v: str(v))
def test_each_documented_override_parses(name, key, value):
  config = _parse(name, f"--config.{key}={value}")  # an unknown key or bad value raises
  if key.startswith("pp."):  # the input pipeline reads it (a bad value is a ConfigError)
    data.Settings.from_config(config)


@pytest.mark.parametrize("name", ["plain_vit_i1k", "quickstart"])
def test_randaug_none_from_the_command_line_turns_it_off(name):
  config = _parse(name, "--config.pp.randaug=None")
  assert data.Settings.from_config(config).randaug is None
  on = _parse(name, "--config.pp.randaug=(2, 10)")
  assert data.Settings.from_config(on).randaug == (2, 10.0)
