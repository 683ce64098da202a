"""Exports: logits of the written model equal ours in every format (Hugging Face and timm
in PyTorch, a TF SavedModel, a `jax.export` artifact); an official .npz -> HF -> back is
bit-exact; bad inputs give one clear error and leave --out untouched."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time

import jax
import numpy as np
import pytest
from flax import traverse_util

from tests import interop_fixtures as fx
from vit_jax import export, models
from vit_jax.infra import errors
from vit_jax.weights import exports, formats, npz, serving, sources

# torch's CUDA wheels import triton on first use, and triton's library crashes (SIGSEGV) a
# process that has already loaded TensorFlow, as the test session has. These tests run
# torch on the CPU, where triton is unused: make its import fail as if it were absent.
sys.modules.setdefault("triton", None)


def _model(name: str, **overrides) -> sources.LoadedModel:
  config, params, size = fx.random_model(name, **overrides)
  return sources.LoadedModel(config, params, fx.NUM_CLASSES, (size, size), None, name)


def _ours(model: sources.LoadedModel, images: np.ndarray, **overrides) -> np.ndarray:
  module = model.module(**overrides)
  return np.asarray(jax.jit(lambda p, x: module.apply({"params": p}, x))(model.params, images))


def _nchw(images: np.ndarray):
  import torch  # pylint: disable=g-import-not-at-top

  return torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))


@pytest.mark.parametrize("gelu_approximate", [True, False])
def test_hf_logits_equal_ours(tmp_path, gelu_approximate):
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  model = _model("vit_ti16")
  model.config = model.config.replace(gelu_approximate=gelu_approximate)
  export.export_model(model, "hf", str(tmp_path / "hf"))

  hf = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
  images = fx.images(3, model.image_size[0])
  with torch.no_grad():
    got = hf(pixel_values=_nchw(images)).logits.numpy()
  want = _ours(model, images)
  assert fx.relative_error(got, want) <= fx.TOLERANCE
  # The other GELU is measurably different: the check above sees a wrong hidden_act.
  other = _ours(model, images, gelu_approximate=not gelu_approximate)
  assert fx.relative_error(other, want) > 20 * fx.TOLERANCE

  config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert config["hidden_act"] == ("gelu_pytorch_tanh" if gelu_approximate else "gelu")
  assert config["id2label"] == {str(i): str(i) for i in range(fx.NUM_CLASSES)}
  pre = json.loads((tmp_path / "hf" / "preprocessor_config.json").read_text())
  assert pre["image_mean"] == pre["image_std"] == [0.5] * 3
  assert pre["size"] == {"height": 32, "width": 32}


def test_official_npz_to_hf_and_back_is_bit_exact(tmp_path):
  pytest.importorskip("safetensors")
  official = tmp_path / "ViT-Ti_16-like.npz"
  config, params, size = fx.write_npz(official, "vit_ti16")
  export.export(str(official), "hf", str(tmp_path / "hf"))

  back = sources.load(tmp_path / "hf")
  flat, original = (traverse_util.flatten_dict(t, sep="/") for t in (back.params, params))
  assert flat.keys() == original.keys()
  for key, value in original.items():
    assert flat[key].dtype == np.float32
    np.testing.assert_array_equal(flat[key], value, err_msg=key)
  assert back.image_size == (size, size) and back.num_classes == fx.NUM_CLASSES
  want = models.model_settings(config)
  assert back.config.gelu_approximate is True and back.config.transformer == want.transformer

  # ... and on to an official .npz again (the way into fine-tuning from an HF checkpoint).
  export.export(str(tmp_path / "hf"), "npz", str(tmp_path / "npz"))
  again = traverse_util.flatten_dict(npz.load_npz(tmp_path / "npz" / "model.npz"), sep="/")
  for key, value in original.items():
    np.testing.assert_array_equal(again[key], value, err_msg=key)


# The random R26 stack amplifies float32 round-off: our own float32 logits differ from a
# float64 run by 1.8e-5, and timm's GroupNorm epsilon is 1e-5 (ours, official: 1e-6).
R26_TOLERANCE = 5e-5


@pytest.mark.parametrize(
  "name, overrides, tolerance",
  [
    ("vit_ti16", {}, fx.TOLERANCE),
    ("vit_ti16", {"classifier": "gap", "gelu_approximate": False}, fx.TOLERANCE),
    ("r26_s32", {}, R26_TOLERANCE),
    ("r_ti16", {}, fx.TOLERANCE),
  ],
)
def test_timm_logits_equal_ours(tmp_path, name, overrides, tolerance):
  timm = pytest.importorskip("timm")
  torch = pytest.importorskip("torch")
  model = _model(name, **overrides)
  export.export_model(model, "timm", str(tmp_path / "timm"))

  spec = json.loads((tmp_path / "timm" / "timm_model.json").read_text())
  net = timm.create_model(
    spec["model_name"],
    pretrained=True,
    pretrained_cfg_overlay=dict(
      spec["pretrained_cfg_overlay"], file=str(tmp_path / "timm" / "model.safetensors")
    ),
    **spec["kwargs"],
  ).eval()
  images = fx.images(2, model.image_size[0])
  with torch.no_grad():
    got = net(_nchw(images)).numpy()
  assert fx.relative_error(got, _ours(model, images)) <= tolerance
  labels = (tmp_path / "timm" / "labels.txt").read_text().split()
  assert labels == [str(i) for i in range(fx.NUM_CLASSES)]


@pytest.mark.parametrize("name", ["vit_ti16", "r_ti16"])
def test_saved_model_logits_equal_ours_for_any_batch(tmp_path, name):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  model = _model(name)
  export.export_model(model, "saved_model", str(tmp_path / "sm"))
  serve = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
  for batch in (3, 1):
    images = fx.images(batch, model.image_size[0], seed=batch)
    got = next(iter(serve(images=tf.constant(images)).values())).numpy()
    assert fx.relative_error(got, _ours(model, images)) <= fx.TOLERANCE


@pytest.mark.parametrize("name", ["vit_ti16", "r_ti16"])
def test_jax_exported_logits_equal_ours_for_any_batch(tmp_path, name):
  model = _model(name)
  export.export_model(model, "stablehlo", str(tmp_path / "hlo"))
  exported = jax.export.deserialize((tmp_path / "hlo" / serving.JAX_EXPORTED).read_bytes())
  for batch in (2, 5):
    images = fx.images(batch, model.image_size[0], seed=batch)
    got = np.asarray(exported.call(images))
    assert fx.relative_error(got, _ours(model, images)) <= fx.TOLERANCE


def _nothing_written(tmp_path, out, *, out_existed: bool) -> None:
  """Only the inputs and, when it was there before, the empty ``out`` (no temp folders)."""
  names = {p.name for p in tmp_path.iterdir()} - {"model.npz"}
  assert names == ({out.name} if out_existed else set())
  if out_existed:
    assert not any(out.iterdir())


@pytest.mark.parametrize(
  "overrides, fmt, message",
  [
    ({"classifier": "gap"}, "hf", r"classifier 'gap' \(HF's ViT classifies the class token"),
    ({"posemb": "learn_2d"}, "hf", r"position embeddings 'learn_2d'"),
    ({"classifier": "unpooled"}, "timm", r"classifier 'unpooled'"),
    ({"gelu_approximate": False}, "big_vision", r"do not compute this model: gelu_approx"),
  ],
)
def test_unsupported_models_fail_before_writing(tmp_path, overrides, fmt, message):
  out = tmp_path / "out"
  out.mkdir()  # an empty folder may be the target; it stays as it was
  with pytest.raises(ValueError, match=message):
    export.export_model(_model("vit_ti16", **overrides), fmt, str(out))
  _nothing_written(tmp_path, out, out_existed=True)


def test_hybrid_to_hf_names_the_alternative(tmp_path):
  model = _model("r_ti16")
  with pytest.raises(ValueError, match="a ResNet hybrid .*export it to timm"):
    export.export_model(model, "hf", str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()


def test_missing_checkpoint_and_existing_out(tmp_path):
  fx.write_npz(tmp_path / "model.npz", "vit_ti16")
  with pytest.raises(FileNotFoundError, match="No checkpoint at .*nope.npz"):
    export.export(str(tmp_path / "nope.npz"), "hf", str(tmp_path / "out"))
  _nothing_written(tmp_path, tmp_path / "out", out_existed=False)
  (tmp_path / "out").mkdir()
  (tmp_path / "out" / "keep.txt").write_text("mine")
  with pytest.raises(FileExistsError, match="not an empty folder"):
    export.export(str(tmp_path / "model.npz"), "npz", str(tmp_path / "out"))
  assert os.listdir(tmp_path / "out") == ["keep.txt"]


def test_a_failure_mid_write_leaves_no_partial_output(tmp_path, monkeypatch):
  fx.write_npz(tmp_path / "model.npz", "vit_ti16")

  def fail_after_a_file(directory, *args):
    (open(os.path.join(directory, serving.JAX_EXPORTED), "wb")).close()
    raise OSError("disk full")

  monkeypatch.setattr(serving, "write_jax_exported", fail_after_a_file)
  with pytest.raises(OSError, match="disk full"):
    export.export(str(tmp_path / "model.npz"), "stablehlo", str(tmp_path / "out"))
  _nothing_written(tmp_path, tmp_path / "out", out_existed=False)


def _command(tmp_path, *args: str) -> int:
  return export.main(["export", f"--checkpoint={tmp_path / 'model.npz'}", *args])


def test_the_command_prints_what_it_wrote_and_how_to_load_it(tmp_path, capsys):
  fx.write_npz(tmp_path / "model.npz", "vit_ti16")
  out = tmp_path / "out"
  assert _command(tmp_path, "--format=npz", f"--out={out}") == 0
  printed = capsys.readouterr().out.splitlines()
  assert printed[0] == f"Wrote the npz export of {tmp_path / 'model.npz'} to {out}:"
  sizes = {
    name: os.path.getsize(out / name) for name in ("labels.txt", "model.config.json", "model.npz")
  }
  assert printed[1:4] == [f"  {name}  ({size:,} bytes)" for name, size in sizes.items()]
  assert printed[4] == exports.NPZ.hint.format(out=out).join(["Load it with: ", ""])


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_exported_files_get_the_users_umask_modes(tmp_path, umask):
  fx.write_npz(tmp_path / "model.npz", "vit_ti16")
  previous = os.umask(umask)
  try:
    export.export(str(tmp_path / "model.npz"), "hf", str(tmp_path / "out"))
  finally:
    os.umask(previous)
  assert stat.S_IMODE(os.stat(tmp_path / "out").st_mode) == 0o777 & ~umask
  for name in os.listdir(tmp_path / "out"):  # model.safetensors is written 0600 by safetensors
    assert stat.S_IMODE(os.stat(tmp_path / "out" / name).st_mode) == 0o666 & ~umask, name


def test_stale_temporary_folders_of_the_same_out_are_removed(tmp_path, caplog):
  fx.write_npz(tmp_path / "model.npz", "vit_ti16")
  stale, fresh, other = (tmp_path / n for n in (".out.tmp-a1", ".out.tmp-b2", ".other.tmp-c3"))
  for folder in (stale, fresh, other):
    folder.mkdir()
    (folder / "model.npz").write_bytes(b"partial")
  two_hours_ago = time.time() - 2 * export.STALE_SECONDS
  for folder in (stale, other):
    os.utime(folder, (two_hours_ago, two_hours_ago))
  with caplog.at_level("WARNING"):
    export.export(str(tmp_path / "model.npz"), "npz", str(tmp_path / "out"))
  assert (
    not stale.exists() and fresh.exists() and other.exists()
  )  # a running export's, another --out's
  assert f"Removing {stale}, left by an export to {tmp_path / 'out'}" in caplog.text


def test_sigterm_during_the_write_removes_the_temporary_folder(tmp_path, monkeypatch):
  fx.write_npz(tmp_path / "model.npz", "vit_ti16")

  def terminated_after_a_file(directory, *args):
    (open(os.path.join(directory, serving.JAX_EXPORTED), "wb")).close()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # the handler raises here
    raise AssertionError("SIGTERM did not stop the export")

  monkeypatch.setattr(serving, "write_jax_exported", terminated_after_a_file)
  handler = signal.getsignal(signal.SIGTERM)
  with pytest.raises(SystemExit) as stopped:
    export.export(str(tmp_path / "model.npz"), "stablehlo", str(tmp_path / "out"))
  assert stopped.value.code == 128 + signal.SIGTERM
  _nothing_written(tmp_path, tmp_path / "out", out_existed=False)
  assert signal.getsignal(signal.SIGTERM) == handler  # restored


def test_the_export_formats_and_their_hints_are_the_records():
  """--format's choices, each checkpoint format's export and the printed hint: one record."""
  assert export.FORMATS == tuple(e.name for e in exports.EXPORTS)
  written = {f.export for f in formats.FORMATS if f.export is not None}
  assert written | {e for e in exports.EXPORTS if e.serve} == set(exports.EXPORTS)
  with pytest.raises(errors.CommandLineError, match="Unknown format 'onnx'; choose one of hf,"):
    exports.by_name("onnx")
