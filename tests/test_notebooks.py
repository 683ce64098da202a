"""Executes every notebook in notebooks/ headless (nbclient) in its small setting.

``VIT_NOTEBOOK_SMALL=1`` makes a notebook take its tiny path: no download, the 2-layer
`testing` model, a few steps. A cell error fails the test with the cell's traceback; each
cell has a time limit. The notebooks are stored without outputs; this also checks that.
"""

import os
import pathlib
import re
import time

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")  # provides the 'python3' kernel even without a kernelspec

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO_ROOT / "notebooks"
CELL_TIMEOUT_S = 300  # one cell; the whole notebook takes about a minute on 2 CPU cores


@pytest.fixture(scope="module")
def notebook_env(tmp_path_factory):
  """One WORKDIR for the module: fine_tune.ipynb and zero_shot.ipynb reuse the digits model
  vit_jax.ipynb trained."""
  workdir = tmp_path_factory.mktemp("notebooks")
  return {
    "VIT_NOTEBOOK_SMALL": "1",
    "VIT_NOTEBOOK_WORKDIR": str(workdir),
    "TFDS_DATA_DIR": str(workdir / "tensorflow_datasets"),  # digits builds here
    "MPLBACKEND": "Agg",
    # The kernel imports this checkout's vit_jax, not another installed copy.
    "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH")))),
  }


# What JAX's CUDA plugin and libtpu print on a host without a GPU or TPU when nothing has
# chosen the platform (each notebook calls `vit_jax.infra.platforms.quiet_start()` first).
NOISE = ("Jax plugin configuration error", "cuInit", "cuFFT", "TPU", "Traceback", "E0000")


def _execute(name: str, cwd: pathlib.Path, env: dict, monkeypatch) -> nbformat.NotebookNode:
  for key in ("JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES", "TF_CPP_MIN_LOG_LEVEL"):
    monkeypatch.delenv(key, raising=False)  # as a user's machine: nothing chosen or hidden
  for key, value in env.items():
    monkeypatch.setenv(key, value)  # the kernel inherits this process's environment
  nb = nbformat.read(NOTEBOOKS / name, as_version=4)
  client = nbclient.NotebookClient(
    nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(cwd)}}
  )
  client.execute()  # raises CellExecutionError naming the failing cell
  return nb


def _outputs(nb, output_type=None):
  return [
    o
    for c in nb.cells
    if c.cell_type == "code"
    for o in c.get("outputs", [])
    if output_type is None or o.get("output_type") == output_type
  ]


def _text(nb) -> str:
  return "".join(o.get("text", "") for o in _outputs(nb, "stream"))


def _images(nb) -> int:
  return sum("image/png" in o.get("data", {}) for o in _outputs(nb, "display_data"))


@pytest.mark.parametrize("name", ["vit_jax.ipynb", "fine_tune.ipynb", "zero_shot.ipynb"])
def test_stored_without_outputs(name):
  nb = nbformat.read(NOTEBOOKS / name, as_version=4)
  nbformat.validate(nb)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert all(not c.outputs and c.execution_count is None for c in code), (
    f"{name} has outputs: clear them (e.g. jupyter nbconvert --clear-output --inplace)."
  )
  tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
  assert len(tagged) == 1, f"{name} needs exactly one cell tagged 'parameters'."


def test_vit_jax_notebook(notebook_env, monkeypatch):
  start = time.perf_counter()
  nb = _execute("vit_jax.ipynb", NOTEBOOKS, notebook_env, monkeypatch)  # cwd: notebooks/
  text = _text(nb)
  assert "MODE = digits" in text
  assert not [n for n in NOISE if n in text], text[:3000]
  assert "test accuracy" in text
  # Rollout overlays (up to 4) and the three Fig. 7 plots.
  assert _images(nb) >= 5, text
  print(f"vit_jax.ipynb: {time.perf_counter() - start:.0f} s")


def test_fine_tune_notebook(notebook_env, monkeypatch):
  start = time.perf_counter()
  nb = _execute("fine_tune.ipynb", REPO_ROOT, notebook_env, monkeypatch)  # cwd: repo root
  text = _text(nb)
  assert "config.dataset = 'folder:" in text
  assert not [n for n in NOISE if n in text], text[:3000]
  assert "token grid (8, 8)" in text  # 16x16 source -> 32x32, 4x4 patches
  assert "test accuracy:" in text and "reloaded bitwise: True" in text  # Model.save, load
  assert _images(nb) >= 2  # the sample batch and the curves
  print(f"fine_tune.ipynb: {time.perf_counter() - start:.0f} s")


# Its LiT training takes minutes: the slow tier (the same steps: test_image_text_run.py).
@pytest.mark.slow
def test_zero_shot_notebook(notebook_env, monkeypatch):
  start = time.perf_counter()
  nb = _execute("zero_shot.ipynb", REPO_ROOT, notebook_env, monkeypatch)
  text = _text(nb)
  assert not [n for n in NOISE if n in text], text[:3000]
  accuracy = re.search(r"zero-shot test accuracy ([0-9.]+)%", text)
  assert accuracy and 0.0 <= float(accuracy.group(1)) <= 100.0, text[-3000:]
  assert "digits classified zero-shot" in text and "prompts of class 7 :" in text
  assert "the SigLIP 2 section is skipped" in text  # the online cell never runs here
  print(f"zero_shot.ipynb: {time.perf_counter() - start:.0f} s")
