"""WebDataset tar shards: ``config.dataset = 'wds:ROOT'``.

The layout LAION, DataComp and img2dataset ship: uncompressed tar files (``00000.tar``,
``00001.tar``, ...) whose members are grouped by key, the name up to the first dot of the
file name (``000017.jpg`` and ``000017.txt`` are one example): an image (``.jpg``,
``.jpeg``, ``.png``) and its caption (``.txt``, or ``.json`` with a ``"caption"``, as
img2dataset writes it; ``.txt`` first when both are there). Other members (``.json``
metadata) are ignored. The shards of split ``<split>`` are ``ROOT/<split>/*.tar``; shards
directly in ``ROOT`` are the split ``train``. Examples are numbered in shard name order,
then member order.

Read without the ``webdataset`` package: it streams shards start to end, shuffling in a
buffer, which gives neither this pipeline's exact resume nor its process-count
independence (`order`). Here each shard's tar headers are read once (`tarfile`, standard
library; the captions are read then and kept in memory), which gives every image's byte
offset, so an example is one seek and one read anywhere in the split (random access).
"""

from __future__ import annotations

import json
import os
import tarfile

import numpy as np
import tensorflow as tf

from vit_jax import errors
from vit_jax.data import free_text
from vit_jax.data import splits as splits_lib

PREFIX = "wds:"  # config.dataset = 'wds:/path/to/shards'
IMAGES = ("jpg", "jpeg", "png")
TEXTS = ("txt", "json")
DEFAULT_SPLIT = "train"  # the split of shards lying directly in ROOT


def _open(path: str):
  """A local file unbuffered by TensorFlow, or a bucket's through tf.io.gfile."""
  return tf.io.gfile.GFile(path, "rb") if "://" in path else open(path, "rb")


def _key_and_extension(name: str) -> tuple[str, str]:
  """'dir/000017.jpg' -> ('dir/000017', 'jpg'): WebDataset's key is the member name up
  to the first dot of its base name."""
  folder, base = os.path.split(name)
  stem, _, extension = base.partition(".")
  return os.path.join(folder, stem), extension.lower()


def _caption(raw: bytes, where: str, extension: str) -> tuple[str, ...]:
  try:
    text = raw.decode("utf-8")
    value = json.loads(text).get("caption") if extension == "json" else text
  except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
    raise errors.InputFileError(
      f"{where}: not a UTF-8 caption{' JSON object' if extension == 'json' else ''}."
    ) from None
  return free_text.as_captions(value, where)


def index_shard(path: str) -> tuple[np.ndarray, np.ndarray, list[tuple[str, ...]]]:
  """(image byte offsets int64 [n], sizes int64 [n], captions [n]) of one shard, in
  member order; an image without a caption (or a caption without an image) is an error
  naming the shard and the key."""
  images: dict[str, tuple[int, int]] = {}
  texts: dict[str, tuple[str, bytes]] = {}
  try:
    with _open(path) as f, tarfile.open(fileobj=f, mode="r:") as tar:
      for member in tar:
        if not member.isfile():
          continue
        key, extension = _key_and_extension(member.name)
        if extension in IMAGES:
          images[key] = (member.offset_data, member.size)
        elif extension in TEXTS and (extension == "txt" or texts.get(key, ("json",))[0] == "json"):
          texts[key] = (extension, tar.extractfile(member).read())
  except tarfile.TarError as e:
    raise errors.InputFileError(
      f"Shard {path!r} is not an uncompressed tar file ({e}); WebDataset shards are .tar."
    ) from None
  unpaired = sorted(set(images) ^ set(texts))
  if unpaired:
    key = unpaired[0]
    has, lacks = ("an image", "caption (.txt, .json)") if key in images else ("a caption", "image")
    raise errors.InputFileError(
      f"Shard {path!r}: key {key!r} has {has} but no {lacks} ({len(unpaired)} keys so); "
      "every example needs both."
    )
  if not images:
    raise errors.InputFileError(f"Shard {path!r} holds no {'/'.join(IMAGES)} images.")
  keys = list(images)  # member order
  captions = [_caption(texts[k][1], f"{path}, {k}.{texts[k][0]}", texts[k][0]) for k in keys]
  return (
    np.array([images[k][0] for k in keys], np.int64),
    np.array([images[k][1] for k in keys], np.int64),
    captions,
  )


class _Index:
  """Every example of one split's shards: its shard, image offset and size, captions."""

  def __init__(self, shards: list[str]):
    self.shards = shards
    parts = [index_shard(path) for path in shards]
    self.shard = np.concatenate([np.full(len(p[0]), i, np.int32) for i, p in enumerate(parts)])
    self.offset = np.concatenate([p[0] for p in parts])
    self.size = np.concatenate([p[1] for p in parts])
    self.captions = free_text.captions_array([c for p in parts for c in p[2]])

  def images(self, start: int, stop: int) -> np.ndarray:
    """Encoded images [stop - start] (object of bytes): one open per shard touched."""
    out = np.empty(stop - start, object)
    for shard in np.unique(self.shard[start:stop]):
      rows = start + np.flatnonzero(self.shard[start:stop] == shard)
      with _open(self.shards[int(shard)]) as f:
        for row in rows:
          f.seek(int(self.offset[row]))
          out[row - start] = f.read(int(self.size[row]))
    return out


class TarShards:
  """The shards under ROOT, by split."""

  def __init__(self, root: str):
    layout = f"<root>/<split>/*.tar (or <root>/*.tar, the split {DEFAULT_SPLIT!r})"
    self.root = free_text.check_root(root, "Shard folder", PREFIX, layout)
    self.class_names = None
    self._indices: dict[str, _Index] = {}

  def shards(self, split: str) -> list[str]:
    folder = self.root if split == DEFAULT_SPLIT and self._has_tars(self.root) else None
    folder = folder or os.path.join(self.root, split)
    found = sorted(tf.io.gfile.glob(os.path.join(folder, "*.tar")))
    if not found:
      raise errors.MissingError(
        f"No .tar shards for split {split!r} in {folder!r}: put them in "
        f"{os.path.join(self.root, split, '*.tar')} (or set config.train_split / "
        "config.test_split to a folder that has them)."
      )
    return found

  @staticmethod
  def _has_tars(folder: str) -> bool:
    return bool(tf.io.gfile.glob(os.path.join(folder, "*.tar")))

  def index(self, split: str) -> _Index:
    if split not in self._indices:
      self._indices[split] = _Index(self.shards(split))
    return self._indices[split]

  def rows(self, split: str, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """(encoded images, captions) of examples [start, stop) of a split's shards."""
    index = self.index(split)
    return index.images(start, stop), index.captions[start:stop]

  def split(self, spec: str) -> free_text.CaptionedSplit:
    """The examples a split string selects; values are encoded images."""
    sizes = {name: len(self.index(name).offset) for name in splits_lib.names(spec)}
    ranges = splits_lib.resolve(spec, sizes)
    return free_text.CaptionedSplit(f"{self.root}:{spec}", ranges, self.rows, "bytes")
