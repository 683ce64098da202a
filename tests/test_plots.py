"""Tests of `vit_jax.api.plots` (Fig. 6-7 figures) and of matplotlib staying optional."""

import io
import os
import sys

import numpy as np
import pytest
from matplotlib.figure import Figure

from tests import fresh_python
from vit_jax.api import plots

pytest_plugins = ["tests.finished_run"]  # the finished_run fixture


def _render(fig):
  assert isinstance(fig, Figure)
  fig.savefig(io.BytesIO(), format="png")


def test_plot_attention_overlay():
  image = np.linspace(-1, 1, 16 * 16 * 3).reshape(16, 16, 3)
  fig = plots.plot_attention_overlay(image, np.arange(16.0).reshape(4, 4))
  _render(fig)
  assert sum(len(ax.images) for ax in fig.axes) == 3
  with pytest.raises(ValueError, match=r"\[-1, 1\]"):
    plots.plot_attention_overlay(image * 255, np.ones((4, 4)))


def test_plot_mean_attention_distance():
  fig = plots.plot_mean_attention_distance(np.arange(12.0).reshape(4, 3))
  _render(fig)
  (ax,) = fig.axes
  assert sum(len(c.get_offsets()) for c in ax.collections) == 12  # one point per head/layer


def test_plot_posemb_similarity():
  sim = np.random.default_rng(0).uniform(-1, 1, (2, 3, 2, 3))
  fig = plots.plot_posemb_similarity(sim)
  _render(fig)
  assert sum(len(ax.images) for ax in fig.axes) == 6


def test_plot_embedding_filters():
  comps = np.random.default_rng(0).uniform(0, 1, (10, 4, 4, 3))
  fig = plots.plot_embedding_filters(comps)
  _render(fig)
  assert sum(len(ax.images) for ax in fig.axes) == 10


def test_missing_matplotlib_names_the_extra(monkeypatch):
  for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
    monkeypatch.setitem(sys.modules, name, None)  # `import matplotlib...` now raises
  with pytest.raises(ImportError, match=r'pip install "vit_jax\[notebooks\]"'):
    plots.plot_mean_attention_distance(np.ones((2, 2)))


def test_every_module_imports_without_matplotlib():
  # A fresh Python where matplotlib cannot be imported, as after a plain `pip install .`
  # (this process has it loaded). Every vit_jax module must import there, and none may try
  # to import matplotlib: the attempts are recorded by importing module (TensorFlow's keras
  # tries one and copes with its absence).
  result = fresh_python.run_json(
    """
      import importlib, json, pkgutil, sys

      attempts = set()

      class BlockMatplotlib:
        def find_spec(self, name, path=None, target=None):
          if name.split(".")[0] != "matplotlib":
            return None
          frame = sys._getframe(1)
          while frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen")):
            frame = frame.f_back
          attempts.add(frame.f_globals.get("__name__", "?"))
          raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)

      sys.meta_path.insert(0, BlockMatplotlib())
      import vit_jax
      names = [m.name for m in pkgutil.walk_packages(vit_jax.__path__, "vit_jax.")
               if not m.name.endswith(".__main__")]  # run by `python -m`, never imported
      for name in names:
        importlib.import_module(name)
      print(json.dumps({"modules": names, "attempts": sorted(attempts),
                        "loaded": "matplotlib" in sys.modules}))
      """,
    fresh_python.clean_env(),
    timeout=300,
  )
  assert {"vit_jax.api.analysis", "vit_jax.api.plots", "vit_jax.main"} <= set(result["modules"])
  ours = [m for m in result["attempts"] if m.split(".")[0] == "vit_jax"]
  assert not ours, f"these vit_jax modules import matplotlib: {ours}"
  assert not result["loaded"]


def test_make_figures_writes_where_told_and_by_default_not_into_the_repository(
  finished_run, tmp_path
):
  """docs/make_figures.py: the tracked PNGs in docs/figures change only when --out names it."""
  figures = os.path.join(fresh_python.REPO, "docs", "figures")
  tracked = {name: open(os.path.join(figures, name), "rb").read() for name in os.listdir(figures)}
  env = fresh_python.clean_env(TMPDIR=str(tmp_path), MPLBACKEND="Agg")
  script = os.path.join(fresh_python.REPO, "docs", "make_figures.py")
  for out in ([], [f"--out={tmp_path}/told"]):
    proc = fresh_python.run([script, f"--workdir={finished_run}", *out], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
  (default,) = [p for p in os.listdir(tmp_path) if p.startswith("vit_figures_")]
  for folder in (tmp_path / default, tmp_path / "told"):
    assert "rollout_digits.png" in os.listdir(folder) and "posemb_similarity.png" in os.listdir(
      folder
    )
  assert {n: open(os.path.join(figures, n), "rb").read() for n in os.listdir(figures)} == tracked


def test_plot_inference_cost():
  curves = {
    "ViT-B_16": ([224, 384], [900.0, 250.0], [400, 120]),
    "BiT-R50x1": ([224, 384], [1200.0, 400.0], [300, 90]),
  }
  fig = plots.plot_inference_cost(curves)
  _render(fig)
  speed, batch = fig.axes
  assert [line.get_linestyle() for line in batch.lines] == ["-", "--"]
  assert list(speed.lines[0].get_ydata()) == [900.0, 250.0]
  assert speed.get_yscale() == batch.get_xscale() == "log"
  with pytest.raises(ValueError, match="2 sizes, 1 speeds"):
    plots.plot_inference_cost({"ViT-B_16": ([224, 384], [1.0], [1, 2])})
