"""`Model.fine_tune` as a notebook cell: a progress bar and the evaluation, the metrics
returned, a run folder continued only with the arguments that started it, and the
checkpoint's preprocessing kept through training, `predict` and the exports."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from PIL import Image

import vit_jax
from tests import interop_fixtures as fx
from vit_jax.data import data_config
from vit_jax.infra import errors
from vit_jax.weights import orbax_steps

sys.modules.setdefault("triton", None)  # see tests/test_export.py: triton beside TensorFlow
SIZE, CLASSES = 8, 3


def _colours(n: int = 24) -> tuple[np.ndarray, np.ndarray]:
  """[n, 12, 12, 3] flat red, green or blue images and their labels."""
  labels = np.arange(n) % CLASSES
  colours = np.array([[230, 20, 20], [20, 230, 20], [20, 20, 230]], np.uint8)
  return np.broadcast_to(colours[labels][:, None, None], (n, 12, 12, 3)).copy(), labels


def test_fine_tune_reports_progress_returns_history_and_refuses_other_arguments(tmp_path, capsys):
  model = vit_jax.create("testing", num_classes=5, image_size=SIZE)
  images, labels = _colours()
  workdir = tmp_path / "run"
  tuned, history = model.fine_tune(images, labels, steps=6, workdir=workdir)
  out = capsys.readouterr()
  assert "6/6" in out.err and "loss" in out.err and "img/s" in out.err  # the tqdm bar
  assert "step 6/6 | eval/accuracy" in out.out  # the final evaluation, printed
  assert [row["step"] for row in history.train] == [1, 2, 3, 4, 5, 6]
  assert all(np.isfinite(row["train/loss"]) and row["img_per_sec"] > 0 for row in history.train)
  assert history.final["step"] == 6 and 0 <= history.final["eval/accuracy"] <= 1
  assert tuned.num_classes == CLASSES
  saved = orbax_steps.finalized_steps(workdir / "checkpoints")

  again, rerun = model.fine_tune(images, labels, steps=6, workdir=workdir, progress=False)
  assert rerun.train == [] and rerun.final["eval/accuracy"] == history.final["eval/accuracy"]
  x = tuned.prepare(images[:4])
  np.testing.assert_array_equal(again(x), tuned(x))  # the finished run, returned
  assert capsys.readouterr().err == ""  # progress=False: no bar
  changes = [
    ({"lr": 0.02}, r"started with lr=0\.01; this call has lr=0\.02\. Pass another workdir"),
    ({"steps": 8, "lr": 0.02}, r"lr=0\.01, steps=6; this call has lr=0\.02, steps=8"),
    (
      {"test_images": images[:6], "test_labels": labels[:6]},
      r"test_images=None, test_labels=None; this call has test_images #",
    ),
  ]
  for change, message in changes:
    with pytest.raises(errors.ResumeError, match=message):
      model.fine_tune(images, labels, **{"steps": 6, "workdir": workdir, **change})
  with pytest.raises(errors.ResumeError, match=r"started with images #\w+; this call has images"):
    model.fine_tune(images[::-1].copy(), labels, steps=6, workdir=workdir)
  with pytest.raises(errors.ResumeError, match="the model #"):
    tuned.with_head(5).fine_tune(images, labels, steps=6, workdir=workdir)
  assert orbax_steps.finalized_steps(workdir / "checkpoints") == saved  # nothing trained
  (workdir / "inputs" / "fine_tune.json").unlink()  # as a folder of `python -m vit_jax.main`
  with pytest.raises(errors.ResumeError, match="holds a run that fine_tune did not start"):
    model.fine_tune(images, labels, steps=6, workdir=workdir)


@pytest.mark.parametrize(
  "config",
  [
    data_config.official((8, 8), (0.1, 0.2, 0.3), (0.4, 0.5, 0.6)),
    data_config.DataConfig((8, 8), 0.9, "bicubic", "center", resizer="pil"),
    data_config.DataConfig((8, 8), 0.875, "bilinear", "center", resizer="pil", crop_offset="floor"),
  ],
)
def test_run_pp_states_a_data_config_that_the_run_reads_back(config):
  pp = data_config.to_run_pp(config)
  assert (pp == {}) == (config.resizer == "tf")
  run = {"pp": {"crop": 8, **pp}, "model": {"input_mean": config.mean, "input_std": config.std}}
  assert data_config.from_run_config(run) == config


def test_fine_tuned_timm_checkpoint_keeps_its_preprocessing_in_predict_and_exports(tmp_path):
  """crop_pct 0.9, bicubic: the tuned model's `predict` on a JPEG equals its timm export
  run through timm's own transform; the npz and hf exports state the same recipe."""
  timm = pytest.importorskip("timm")
  torch = pytest.importorskip("torch")
  folder, _ = fx.timm_crop_folder(str(tmp_path / "timm"))
  model = vit_jax.load(folder)
  images = np.stack([fx.photo(40, 52, seed=i) for i in range(8)])
  tuned, _ = model.fine_tune(images, np.arange(8) % 3, steps=3, progress=False)
  assert tuned.data_config == model.data_config  # not the official squash/bilinear/tf
  jpeg = str(tmp_path / "photo.jpg")
  Image.fromarray(fx.photo(45, 61, seed=9)).save(jpeg, quality=90)
  ours = np.zeros(3)
  for name, probability in tuned.predict([jpeg], top_k=3)[0]:  # the classes are named 0, 1, 2
    ours[int(name)] = probability

  out = tuned.save(tmp_path / "timm_out", format="timm")
  net = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
  transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=net))
  with torch.no_grad():
    logits = net(transform(Image.open(jpeg).convert("RGB"))[None])
  theirs = torch.softmax(logits, -1)[0].numpy()
  assert np.abs(theirs - ours).max() <= 1e-4, np.abs(theirs - ours).max()

  assert vit_jax.load(tuned.save(tmp_path / "npz_out")).data_config == model.data_config
  hf = vit_jax.load(tuned.save(tmp_path / "hf_out", format="hf")).data_config
  assert (hf.crop_mode, hf.interpolation, hf.scale_size) == ("center", "bicubic", (35, 35))
