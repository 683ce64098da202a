"""A tiny finished run made by `vit_jax.main`, shared by the checkpoint and user-error tests.

Import the fixtures into a test module (`from tests.finished_run import finished_run`);
copy the run (`copy_run`) before changing it.
"""

from __future__ import annotations

import os
import shutil

import ml_collections
import pytest

from configs import quickstart
from tests import train_fixtures
from vit_jax import main

# The quickstart shrunk as every tiny run (`train_fixtures.TINY`), with its own model made
# tiny, as `--config.<key>=<value>` overrides.
TINY = {
  "model.hidden_size": 16,
  "model.transformer.num_layers": 1,
  "model.transformer.mlp_dim": 16,
  "model.transformer.num_heads": 2,
  **train_fixtures.TINY,
}


def tiny_flags(data_dir: str) -> list[str]:
  return [
    "--config=configs/quickstart.py",
    f"--config.data_dir={data_dir}",
    *(f"--config.{k}={v}" for k, v in TINY.items()),
  ]


def tiny_run_config(data_dir: str) -> ml_collections.ConfigDict:
  """The config `tiny_flags` gives."""
  config = quickstart.get_config()
  config.data_dir = data_dir
  return train_fixtures.override(config, TINY)


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory, digits_dir) -> str:
  """A workdir trained to step 6 by `main.main` (steps 3 and 6 saved)."""
  workdir = str(tmp_path_factory.mktemp("finished") / "run")
  assert main.main(["main", *tiny_flags(digits_dir), f"--workdir={workdir}"]) == 0
  return workdir


def copy_run(finished: str, dest: str | os.PathLike) -> str:
  shutil.copytree(finished, dest)
  return str(dest)


def snapshot(workdir: str | os.PathLike) -> dict[str, bytes]:
  """{path relative to ``workdir``: content} of every file under it."""
  files = {}
  for root, _, names in os.walk(workdir):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        files[os.path.relpath(path, workdir)] = f.read()
  return files


def flip_bytes(step_dir: str | os.PathLike) -> None:
  """Flips a byte in the middle of each array data file of a step's state."""
  data_files = [
    os.path.join(root, f)
    for root, _, files in os.walk(os.path.join(step_dir, "state"))
    for f in files
    if root.endswith("d")
  ]
  assert data_files
  for path in data_files:
    with open(path, "rb") as f:
      blob = bytearray(f.read())
    blob[len(blob) // 2] ^= 0xFF
    with open(path, "wb") as f:
      f.write(bytes(blob))
