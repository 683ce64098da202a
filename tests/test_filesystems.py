"""File access by path: local and file:// paths through os, a bucket through fsspec (a
real GCS server, `tests.gcs_server`), TensorFlow installed or not; a storage that keeps
failing is one error line naming the path."""

from __future__ import annotations

import io
import os
import sys

import pytest

from tests import gcs_proxy
from vit_jax.data import caption_folder, example_images, filesystems
from vit_jax.infra import errors, input_files, storage


def test_local_and_file_url_paths_read_through_os(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow", None)  # `import tensorflow` now raises
  (tmp_path / "sub").mkdir()
  (tmp_path / "b.tar").write_bytes(b"0123456789")
  (tmp_path / "a.tar").write_bytes(b"")
  for root in (str(tmp_path), f"file://{tmp_path}"):
    assert filesystems.isdir(root) and not filesystems.isdir(os.path.join(root, "b.tar"))
    assert filesystems.exists(os.path.join(root, "b.tar"))
    assert not filesystems.exists(os.path.join(root, "c.tar"))
    assert sorted(filesystems.listdir(root)) == ["a.tar", "b.tar", "sub"]
    found = filesystems.glob(os.path.join(root, "*.tar"))
    assert found == [os.path.join(root, "a.tar"), os.path.join(root, "b.tar")]
    with filesystems.open_binary(found[1], exact=True) as f:
      assert isinstance(f, io.FileIO)  # unbuffered: a read reads what it asks, no more
      f.seek(3)
      assert f.read(4) == b"3456"
    with filesystems.open_binary(found[1]) as f:
      assert isinstance(f, io.BufferedReader) and f.read() == b"0123456789"
    assert example_images.read_bytes(found[1].encode()) == b"0123456789"


def _hide_tensorflow(monkeypatch) -> None:
  monkeypatch.setitem(sys.modules, "tensorflow", None)  # `import tensorflow` now raises


@pytest.mark.parametrize("tensorflow", ["hidden", "installed"])
def test_a_caption_folder_and_its_images_on_a_bucket(tensorflow, gcs_bucket, tmp_path, monkeypatch):
  """Every call reads the bucket through fsspec (gcsfs), TensorFlow or not."""
  if tensorflow == "hidden":
    _hide_tensorflow(monkeypatch)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the captions file's local copy
  root = f"{gcs_bucket}/captions"
  fs = storage.filesystem(root)
  for name in ("b.png", "a.png"):
    fs.pipe_file(f"{root}/train/imgs/{name}", b"not decoded here " + name.encode())
  fs.pipe_file(f"{root}/train/captions.tsv", b"imgs/b.png\tthe second\nimgs/a.png\tthe first\n")
  assert sorted(filesystems.listdir(f"{root}/train")) == ["captions.tsv", "imgs"]
  assert filesystems.isdir(f"{root}/train/imgs") and not filesystems.isdir(f"{root}/x")
  assert filesystems.exists(f"{root}/train/captions.tsv")
  images = [f"{root}/train/imgs/a.png", f"{root}/train/imgs/b.png"]
  assert filesystems.glob(f"{root}/train/imgs/*.png") == images
  paths, texts = caption_folder.CaptionFolder(root).rows("train", 0, 2)
  assert list(paths) == images
  assert list(texts) == [("the first",), ("the second",)]
  assert example_images.read_bytes(paths[0]) == b"not decoded here a.png"
  with filesystems.open_binary(paths[1], exact=True) as f:
    f.seek(4)
    assert f.read(7) == b"decoded"
  with pytest.raises(FileNotFoundError, match="missing.png"):  # as a local file's: left out
    example_images.read_bytes(f"{root}/train/imgs/missing.png")
  # The bound on an image's bytes holds for a remote file too.
  monkeypatch.setattr(input_files, "MAX_IMAGE_BYTES", 8)
  with pytest.raises(OSError, match="more than 8 bytes"):
    example_images.read_bytes(paths[0])


def test_a_bucket_that_keeps_failing_is_one_storage_error_naming_the_path(
  gcs_server, gcs_bucket, monkeypatch
):
  """gcsfs retries a 503 with backoff (made instant here); once its retries are spent the
  read is one StorageError line naming the file, not a missing file (left out)."""
  import gcsfs.retry  # pylint: disable=g-import-not-at-top

  async def no_wait(_):
    pass

  monkeypatch.setattr(gcsfs.retry.asyncio, "sleep", no_wait)
  path = f"{gcs_bucket}/images/a.jpg"
  storage.filesystem(path).pipe_file(path, b"jpeg")
  proxy = gcs_proxy.GcsProxy(gcs_server.url)
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
  try:
    proxy.fail(5)  # fewer than gcsfs's 6 tries: read after retries
    assert filesystems.read_head(path, 100) == b"jpeg"
    proxy.fail(100)
    with pytest.raises(errors.StorageError) as raised:
      filesystems.read_head(path, 100)
  finally:
    proxy.close()
  message = str(raised.value)
  assert "\n" not in message and path in message and "503" in message
