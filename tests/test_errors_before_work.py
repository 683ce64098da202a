"""Every check that needs no compile runs before one, and says what to change.

A hub name in config.pretrained is fetched (or fails offline) before the run's steps are
built; a config file that is not there says where it was looked for; a crop that is not a
whole number of patches names config.pp.crop. Each is one `Error:` line, exit status 2.
(An unprepared tfds dataset: tests/test_data_tfds.py.)
"""

from __future__ import annotations

import os
import time

import pytest
from huggingface_hub import constants

from tests.finished_run import tiny_flags
from vit_jax import main
from vit_jax.run import steps as steps_lib


def _error_line(err: str) -> str:
  lines = [line for line in err.splitlines() if line.startswith("Error: ")]
  assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
  return lines[0]


def test_offline_hub_name_fails_in_seconds_before_any_step_is_built(
  digits_dir, tmp_path, monkeypatch, capsys
):
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty_cache"))

  def build_steps(*args, **kwargs):
    raise AssertionError("the run's steps were built (and compiled) before the weights")

  monkeypatch.setattr(steps_lib, "build_steps", build_steps)
  workdir = tmp_path / "run"
  capsys.readouterr()
  start = time.perf_counter()
  argv = ["main", *tiny_flags(digits_dir), f"--workdir={workdir}", "--config.pretrained=ViT-B_16"]
  assert main.main(argv) == 2
  assert time.perf_counter() - start < 60
  message = _error_line(capsys.readouterr().err)
  assert "timm/vit_base_patch16_224.orig_in21k: not in the Hugging Face cache" in message
  assert "HF_HUB_OFFLINE is set" in message and "hf download" in message
  assert not workdir.exists()


def test_missing_config_file_says_where_it_looked(digits_dir, tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)  # not the repository root: configs/ is not here
  capsys.readouterr()
  assert main.main(["main", "--config=configs/quickstart.py", f"--workdir={tmp_path}/w"]) == 2
  message = _error_line(capsys.readouterr().err)
  assert message == (
    "Error: --config=configs/quickstart.py: no such file (looked for "
    f"{tmp_path}/configs/quickstart.py): run the command from the repository root "
    "(where configs/ is), or give the config file's absolute path."
  )
  assert main.main(["main", f"--config={tmp_path}/nope.py:b16", f"--workdir={tmp_path}/w"]) == 2
  message = _error_line(capsys.readouterr().err)
  assert f"looked for {tmp_path}/nope.py): give an existing config file." in message


@pytest.mark.parametrize("crop, choices", [(10, "8 or 12"), (3, "4")])
def test_crop_not_a_multiple_of_the_patch_names_the_key(
  crop, choices, digits_dir, tmp_path, monkeypatch, capsys
):
  monkeypatch.setattr(steps_lib, "build_steps", None)  # never reached
  workdir = tmp_path / "run"
  capsys.readouterr()
  argv = ["main", *tiny_flags(digits_dir), f"--workdir={workdir}", f"--config.pp.crop={crop}"]
  assert main.main(argv) == 2
  message = _error_line(capsys.readouterr().err)
  assert message == (
    f"Error: config.pp.crop={crop} is not a multiple of the model's patch size 4x4 "
    f"(config.model.patches.size=(4, 4)): use config.pp.crop={choices}."
  )
  assert not os.path.exists(workdir)
