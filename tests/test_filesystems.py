"""File access by path: local and file:// paths through os (no TensorFlow), a remote path
through tf.io.gfile (TensorFlow's in-memory ram:// filesystem stands in for a bucket), and
without TensorFlow one error line naming the path and the fix."""

from __future__ import annotations

import io
import os
import sys

import pytest

from vit_jax import errors, input_files
from vit_jax.data import caption_folder, example_images, filesystems


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


@pytest.mark.parametrize("call", ["isdir", "exists", "listdir", "glob", "open_binary", "read_head"])
def test_a_remote_path_without_tensorflow_is_one_line_naming_it_and_the_fix(call, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow", None)
  with pytest.raises(errors.ConfigError) as raised:
    getattr(filesystems, call)("gs://bucket/data/train", *([1] if call == "read_head" else []))
  message = str(raised.value)
  assert "\n" not in message and "'gs://bucket/data/train'" in message
  assert 'pip install -e ".[tf]"' in message and "copy it to a local disk" in message


def test_a_remote_caption_folder_and_its_images_read_through_tf_gfile(monkeypatch):
  """ram:// is no local path, so each call goes to tf.io.gfile, as a gs:// one would."""
  tf = pytest.importorskip("tensorflow")
  root = "ram://filesystems_test/captions"
  tf.io.gfile.makedirs(f"{root}/train/imgs")
  for name in ("b.png", "a.png"):
    with tf.io.gfile.GFile(f"{root}/train/imgs/{name}", "wb") as f:
      f.write(b"not decoded here " + name.encode())
  with tf.io.gfile.GFile(f"{root}/train/captions.tsv", "wb") as f:
    f.write(b"imgs/b.png\tthe second\nimgs/a.png\tthe first\n")
  assert sorted(filesystems.listdir(f"{root}/train")) == ["captions.tsv", "imgs"]  # no trailing '/'
  images = [f"{root}/train/imgs/a.png", f"{root}/train/imgs/b.png"]
  assert filesystems.glob(f"{root}/train/imgs/*.png") == images
  paths, texts = caption_folder.CaptionFolder(root).rows("train", 0, 2)
  assert list(paths) == images
  assert list(texts) == [("the first",), ("the second",)]
  assert example_images.read_bytes(paths[0]) == b"not decoded here a.png"
  with pytest.raises(OSError, match="missing.png"):  # as a local file's: the image is left out
    example_images.read_bytes(f"{root}/train/imgs/missing.png")
  # The bound on an image's bytes holds for a remote file too.
  monkeypatch.setattr(input_files, "MAX_IMAGE_BYTES", 8)
  with pytest.raises(OSError, match="more than 8 bytes"):
    example_images.read_bytes(paths[0])
