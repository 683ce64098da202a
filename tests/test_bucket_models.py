"""Models read from and written to a gs:// bucket, on a real GCS server (`tests.gcs_server`):
`vit_jax.load`, `predict` and `export` of a training run on a bucket give what they give
of the same run in a local folder; an export and `Model.save` into a bucket load back as
the original, on the core install (TensorFlow hidden) too; a used output folder on a
bucket is refused with one line, and a failed upload leaves nothing there."""

from __future__ import annotations

import io
import subprocess
import sys

import jax
import numpy as np
import pytest
from PIL import Image

import vit_jax
from tests.fresh_python import REPO, clean_env
from vit_jax import export, predict
from vit_jax.infra import errors, storage
from vit_jax.weights import npz

pytest_plugins = ["tests.finished_run"]  # the finished_run fixture


def _upload(local: str, url: str) -> str:
  storage.filesystem(url).put(local, url, recursive=True)
  return url


def _assert_same_model(got: vit_jax.Model, want: vit_jax.Model) -> None:
  """Equal parameters (bitwise), classes, and logits of the same images."""
  assert jax.tree.structure(got.params) == jax.tree.structure(want.params)
  for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(want.params)):
    np.testing.assert_array_equal(a, b)
  assert got.class_names == want.class_names and got.image_size == want.image_size
  x = np.random.default_rng(0).uniform(-1, 1, (3, *want.image_size, 3)).astype(np.float32)
  np.testing.assert_array_equal(got(x), want(x))


def _png(seed: int) -> bytes:
  pixels = np.random.default_rng(seed).integers(0, 256, (16, 16, 3), np.uint8)
  out = io.BytesIO()
  Image.fromarray(pixels).save(out, format="PNG")
  return out.getvalue()


def test_a_run_on_a_bucket_loads_and_predicts_as_its_local_copy(gcs_bucket, finished_run, tmp_path):
  url = _upload(finished_run, f"{gcs_bucket}/run")
  _assert_same_model(vit_jax.load(url), vit_jax.load(finished_run))
  _assert_same_model(
    vit_jax.load(f"{url}/checkpoints/3"), vit_jax.load(f"{finished_run}/checkpoints/3")
  )
  images = tmp_path / "images"
  images.mkdir()
  fs = storage.filesystem(gcs_bucket)
  for k in range(3):
    (images / f"{k}.png").write_bytes(_png(k))
    fs.pipe_file(f"{gcs_bucket}/images/sub/{k}.png", _png(k))
  fs.pipe_file(f"{gcs_bucket}/images/notes.txt", b"not an image: not listed")
  local = list(predict.predict(finished_run, [str(images)], k=3))
  remote = list(predict.predict(url, [f"{gcs_bucket}/images"], k=3))
  assert [p.path for p in remote] == [f"{gcs_bucket}/images/sub/{k}.png" for k in range(3)]
  assert [p.top for p in remote] == [p.top for p in local]
  one = list(predict.predict(url, [f"{gcs_bucket}/images/sub/1.png"], k=3))
  assert [p.top for p in one] == [local[1].top]


def test_an_export_to_a_bucket_without_tensorflow_loads_back_as_the_original(
  gcs_bucket, finished_run
):
  """The command on the core install: the run read from the bucket, the npz export
  written into it; loaded back, from the folder or its `.npz`, it is the run's model."""
  url = _upload(finished_run, f"{gcs_bucket}/run")
  out = f"{gcs_bucket}/exported"
  done = subprocess.run(
    [sys.executable, "-m", "tests.no_tensorflow", "vit_jax.export", f"--checkpoint={url}",
     "--format=npz", f"--out={out}"],
    cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=240,
  )  # fmt: skip
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.startswith(f"Wrote the npz export of {url} to {out}:")
  assert f"  {npz.EXPORT_FILE}  (" in done.stdout and "cp -r" not in done.stdout
  assert sorted(storage.filesystem(out).ls(out, detail=False)) == [
    f"{out.removeprefix('gs://')}/{name}"
    for name in ("labels.txt", "model.config.json", "model.npz")
  ]
  original = vit_jax.load(finished_run)
  _assert_same_model(vit_jax.load(out), original)
  from_file = vit_jax.load(f"{out}/{npz.EXPORT_FILE}")  # its config beside it; no labels.txt read
  assert from_file.config == original.config
  np.testing.assert_array_equal(
    from_file.params["head"]["kernel"], original.params["head"]["kernel"]
  )


def test_model_save_to_a_bucket_loads_back(gcs_bucket, finished_run):
  """npz bitwise; timm (a `.safetensors` and timm's configs) to the same logits."""
  model = vit_jax.load(finished_run)
  url = f"{gcs_bucket}/saved"
  assert model.save(url + "/") == url
  _assert_same_model(vit_jax.load(url), model)
  timm_url = model.save(f"{gcs_bucket}/timm", format="timm")
  again = vit_jax.load(timm_url)
  x = np.random.default_rng(1).uniform(-1, 1, (2, *model.image_size, 3)).astype(np.float32)
  np.testing.assert_allclose(again(x), model(x), rtol=1e-5, atol=1e-5)


def test_a_used_output_folder_on_a_bucket_is_refused_with_one_line(
  gcs_bucket, finished_run, capsys
):
  out = f"{gcs_bucket}/used"
  fs = storage.filesystem(out)
  fs.pipe_file(f"{out}/keep.txt", b"mine")
  status = export.main(["export", f"--checkpoint={finished_run}", "--format=npz", f"--out={out}/"])
  err = capsys.readouterr().err.strip()
  assert status == 2 and len(err.splitlines()) == 1, err
  assert err.startswith("Error:") and f"--out={out!r} exists and is not an empty folder" in err
  with pytest.raises(errors.OutputExistsError):
    vit_jax.load(finished_run).save(out)
  assert fs.find(out) == [f"{out.removeprefix('gs://')}/keep.txt"]
  assert fs.cat_file(f"{out}/keep.txt") == b"mine"
  fs.pipe_file(f"{gcs_bucket}/file", b"an object, not a folder")
  with pytest.raises(errors.OutputExistsError):
    vit_jax.load(finished_run).save(f"{gcs_bucket}/file")


def test_a_failed_upload_leaves_nothing_on_the_bucket(gcs_bucket, finished_run, monkeypatch):
  """The second file's upload fails: one StorageError naming the folder, and the first
  file is deleted again."""
  fs = storage.filesystem(gcs_bucket)
  put_file, calls = fs.put_file, []

  def fail_second(local: str, target: str, **kwargs) -> None:
    calls.append(target)
    if len(calls) == 2:
      raise ConnectionError("connection reset")
    put_file(local, target, **kwargs)

  out = f"{gcs_bucket}/partial"
  with monkeypatch.context() as patch:
    patch.setattr(fs, "put_file", fail_second)
    with pytest.raises(errors.StorageError, match=f"Writing {out} failed .*connection reset"):
      vit_jax.load(finished_run).save(out)
  assert len(calls) == 2 and calls[0].endswith("labels.txt") and not fs.exists(out)


def test_a_damaged_npz_on_a_bucket_is_one_error_naming_it(gcs_bucket):
  url = f"{gcs_bucket}/weights/model.npz"
  storage.filesystem(url).pipe_file(url, b"PK\x03\x04 not a whole archive")
  with pytest.raises(errors.CheckpointError) as raised:
    vit_jax.load(url)
  assert repr(url) in str(raised.value) and "/tmp" not in str(raised.value)
  with pytest.raises(errors.MissingError, match="No checkpoint at"):
    vit_jax.load(f"{gcs_bucket}/weights/missing.npz")
