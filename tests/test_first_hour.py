"""What a new user meets in the first hour on the README's installs: the core install
(`tests.core_install`: only `pip install -e .`'s packages importable) exports StableHLO and
imports every command; a command whose optional package is missing says which extra brings
it in one line, exit 2; ``help(vit_jax.api.fine_tune.train_on_arrays)`` works after ``import
vit_jax``; a run's model with a new head predicts without a warning about its names."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import vit_jax
from tests import core_install, fresh_python
from tests.finished_run import tiny_flags
from vit_jax import main
from vit_jax.infra import errors

pytest_plugins = ["tests.finished_run"]  # the finished_run fixture

COMMANDS = ("main", "predict", "export", "convert", "fewshot", "plan", "zeroshot")


def _core_python(code: str, extras: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
  return subprocess.run(
    core_install.command(["-c", code], extras),
    cwd=fresh_python.REPO,
    env=fresh_python.clean_env(),
    capture_output=True,
    text=True,
    timeout=300,
  )


def test_the_core_install_imports_every_command_and_exports_stablehlo(tmp_path):
  """StableHLO serialization needs flatbuffers, which only TensorFlow brought before."""
  out = str(tmp_path / "hlo")
  proc = _core_python(
    f"""
import importlib, sys
for name in {COMMANDS!r}:
  importlib.import_module("vit_jax." + name)
import vit_jax
vit_jax.create("testing", num_classes=3).save({out!r}, format="stablehlo")
print(sorted(m for m in ("tensorflow", "torch", "tokenizers") if m in sys.modules))
"""
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip().splitlines()[-1] == "[]"
  assert os.listdir(out)


def test_the_core_install_hides_what_only_an_extra_brings():
  hidden = core_install.hidden_modules()
  for module in ("tensorflow", "tokenizers", "sentencepiece", "torch", "libtpu"):
    assert module in hidden or not _installed(module), module
  assert not {"jax", "flax", "optax", "numpy", "flatbuffers"} & hidden
  assert not {"tokenizers", "sentencepiece"} & core_install.hidden_modules(["text"])


def _installed(module: str) -> bool:
  import importlib.util

  return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("module, extra", sorted(errors.EXTRA_OF_MODULE.items()))
def test_a_missing_optional_package_names_its_extra(module, extra):
  try:
    try:
      raise ModuleNotFoundError(f"No module named {module!r}", name=f"{module}.sub")
    except ImportError as e:
      raise RuntimeError("a data worker failed") from e
  except RuntimeError as e:
    user = errors.as_user_error(e, workdir=None, config=None)
  assert isinstance(user, errors.UserError)
  assert str(user).count("\n") == 0 and f'pip install -e ".[{extra}]"' in str(user)
  assert errors.missing_extra(ModuleNotFoundError("x", name="not_optional")) is None


@pytest.mark.parametrize("config", ["configs/siglip.py:digits", "configs/lit.py:digits"])
def test_image_text_training_without_the_text_extra_is_one_line(
  config, digits_dir, finished_run, tmp_path, monkeypatch, capsys
):
  monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` raises
  monkeypatch.setitem(sys.modules, "sentencepiece", None)
  workdir = tmp_path / "run"
  flags = [f for f in tiny_flags(digits_dir) if not f.startswith("--config.model.")]
  flags[0] = f"--config={config}"
  if config.startswith("configs/lit"):
    flags.append(f"--config.pretrained={finished_run}/checkpoints")
  capsys.readouterr()
  assert main.main(["main", *flags, f"--workdir={workdir}"]) == 2
  err = capsys.readouterr().err
  lines = [line for line in err.splitlines() if line.startswith("Error: ")]
  assert len(lines) == 1 and 'pip install -e ".[text]"' in lines[0], err[-2000:]
  assert "Traceback" not in err and not workdir.exists()


def test_help_of_a_submodule_works_right_after_import_vit_jax():
  out = fresh_python.run_json(
    """
    import json, pydoc, sys
    import vit_jax
    before = "vit_jax.api.fine_tune" in sys.modules
    text = pydoc.render_doc(vit_jax.api.fine_tune.train_on_arrays)
    print(json.dumps([before, "train_on_arrays" in text, hasattr(vit_jax, "no_such")]))
    """,
    fresh_python.clean_env(),
  )
  assert out == [False, True, False]


def test_a_runs_model_with_a_new_head_predicts_without_a_names_warning(finished_run, caplog):
  model = vit_jax.load(finished_run)
  assert model.class_names and len(model.class_names) == model.num_classes
  with caplog.at_level(logging.WARNING):
    top = model.with_head(5).predict(np.zeros((2, 16, 16, 3), np.uint8), top_k=1)
  assert [[name for name, _ in row] for row in top] == [["0"], ["0"]]  # a zero head: ties
  assert not [r for r in caplog.records if "class names" in r.getMessage()]
