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
library), which gives every image's and caption's byte offset, so an example is two seeks
and two reads anywhere in the split (random access). Nothing else is kept: the index is
25 bytes an example (`_Index`), and captions are read with their images, a block at a time,
so memory does not grow with the captions of the split (LAION-400M's index: 10 GB). Shards
on a bucket are read from local copies (`remote_cache`), made when the split is indexed
(which reads every shard whole anyway): an example read where it is would be two ranged
requests, each of the read-ahead's block.
"""

from __future__ import annotations

import json
import os
import tarfile

import numpy as np
from absl import logging

from vit_jax.data import filesystems, free_text, remote_cache
from vit_jax.data import splits as splits_lib
from vit_jax.infra import errors, storage

PREFIX = "wds:"  # config.dataset = 'wds:/path/to/shards'
IMAGES = ("jpg", "jpeg", "png")
TEXTS = ("txt", "json")
DEFAULT_SPLIT = "train"  # the split of shards lying directly in ROOT


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


Member = tuple[int, int]  # a member's data: (byte offset in the shard, size)


def _cut_short(path: str, offset: int, what: str) -> errors.InputFileError:
  """The error for a shard that is cut short or damaged at byte ``offset``."""
  return errors.InputFileError(
    f"Shard {path!r} is cut short or damaged at byte {offset} ({what}): put an intact copy "
    "of it in its place, then run the same command again."
  )


def _gone(path: str) -> errors.MissingError:
  """The error for a shard deleted after the split was listed."""
  return errors.MissingError(
    f"Shard {path!r} is missing (it was listed when the split was read): put it back, then "
    "run the same command again."
  )


def _member_name(f, offset: int) -> str:
  """The name in the tar header just before the data at ``offset`` (for an error)."""
  try:
    f.seek(offset - tarfile.BLOCKSIZE)
    return tarfile.TarInfo.frombuf(f.read(tarfile.BLOCKSIZE), "utf-8", "surrogateescape").name
  except (tarfile.TarError, ValueError, OSError):
    return f"the member at byte {offset}"


def index_shard(path: str, read: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(image offset and size [n, 2], caption offset and size [n, 2], caption is JSON
  bool [n]) of one shard, int64, in member order; an image without a caption (or a
  caption without an image) is an error naming the shard and the key. ``read``: the file
  read in its place (a local copy of a shard on a bucket)."""
  images: dict[str, Member] = {}
  texts: dict[str, tuple[str, Member]] = {}
  end = 0  # of the last member's data
  try:
    with filesystems.open_binary(read or path) as f, tarfile.open(fileobj=f, mode="r:") as tar:
      for member in tar:
        end = member.offset_data + member.size
        if not member.isfile():
          continue
        key, extension = _key_and_extension(member.name)
        where = (member.offset_data, member.size)
        if extension in IMAGES:
          images[key] = where
        elif extension in TEXTS and (extension == "txt" or texts.get(key, ("json",))[0] == "json"):
          texts[key] = (extension, where)
      tar.members = []  # the headers are in `images` and `texts` now
      # tarfile ends quietly at a header it cannot read: past the members, only the end
      # marker's zero blocks (or nothing) may follow, else the rest of the shard is lost.
      f.seek(tar.offset)
      tail = f.read(tarfile.BLOCKSIZE)
      if tail.strip(b"\0"):
        raise _cut_short(path, tar.offset, "an unreadable member header")
      if not tail:  # as GNU tar, accepted; but a writer closing the shard writes the marker
        logging.warning(
          "Shard %r ends after its member at byte %d without tar's end marker: it may have "
          "been cut short (its %d images are read).",
          path,
          end,
          len(images),
        )
  except FileNotFoundError:
    raise _gone(path) from None
  except tarfile.TarError as e:
    if end:  # "unexpected end of data": the file ends inside a member
      raise _cut_short(path, end, str(e)) from None
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
  return (
    np.array([images[k] for k in keys], np.int64).reshape(-1, 2),
    np.array([texts[k][1] for k in keys], np.int64).reshape(-1, 2),
    np.array([texts[k][0] == "json" for k in keys], bool),
  )


class _Index:
  """Where every example of one split's shards is: per shard its end (examples before
  it and in it), per example its image's and caption's byte offset and size and whether
  the caption is JSON: 8 + 4 + 8 + 4 + 1 bytes."""

  def __init__(self, shards: list[str]):
    self.shards = shards
    self.read = shards  # the files read: local copies of shards on a bucket
    if shards and storage.is_remote(shards[0]):
      try:
        copies = remote_cache.copies(shards)
        remote_cache.fetch(copies)
      except FileNotFoundError as e:
        raise _gone(e.filename) from None
      self.read = [c.path for c in copies]
    parts = [index_shard(path, read) for path, read in zip(shards, self.read)]
    largest = max(int(p[i][:, 1].max()) for p in parts for i in (0, 1))
    if largest >= 2**32:
      raise errors.InputFileError(
        f"A member of {len(shards)} shards ({shards[0]!r}, ...) is {largest} bytes: images "
        "and captions of 4 GiB or more are not read; split it."
      )
    self.ends = np.cumsum([len(p[0]) for p in parts])  # [S]
    self.image_offset = np.concatenate([p[0][:, 0] for p in parts])  # int64 [n]
    self.image_size = np.concatenate([p[0][:, 1] for p in parts]).astype(np.uint32)
    self.text_offset = np.concatenate([p[1][:, 0] for p in parts])
    self.text_size = np.concatenate([p[1][:, 1] for p in parts]).astype(np.uint32)
    self.text_json = np.concatenate([p[2] for p in parts])

  def __len__(self) -> int:
    return len(self.image_offset)

  def rows(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """(encoded images object [k] of bytes, captions object [k] of tuples) of examples
    [start, stop): one open per shard touched."""
    images, captions = np.empty(stop - start, object), np.empty(stop - start, object)
    shard_of = np.searchsorted(self.ends, np.arange(start, stop), side="right")
    for shard in np.unique(shard_of):
      path = self.shards[int(shard)]
      try:
        f = filesystems.open_binary(self.read[int(shard)])
      except FileNotFoundError:
        raise _gone(path) from None
      with f:
        for row in start + np.flatnonzero(shard_of == shard):
          images[row - start] = _read(f, path, int(self.image_offset[row]), self.image_size[row])
          offset, extension = int(self.text_offset[row]), "json" if self.text_json[row] else "txt"
          raw = _read(f, path, offset, self.text_size[row])
          try:
            captions[row - start] = _caption(raw, path, extension)
          except errors.InputFileError:  # again, naming the member (read from its header)
            _caption(raw, f"{path}, {_member_name(f, offset)}", extension)
    return images, captions


def _read(f, path: str, offset: int, size: int) -> bytes:
  """A member's data, whole: a shard cut short since it was indexed is one error."""
  f.seek(offset)
  data = f.read(int(size))
  if len(data) < size:
    raise _cut_short(path, offset + len(data), f"{_member_name(f, offset)} ends past the file")
  return data


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
    found = filesystems.glob(os.path.join(folder, "*.tar"))
    if not found:
      raise errors.MissingError(
        f"No .tar shards for split {split!r} in {folder!r}: put them in "
        f"{os.path.join(self.root, split, '*.tar')} (or set config.train_split / "
        "config.test_split to a folder that has them)."
      )
    return found

  @staticmethod
  def _has_tars(folder: str) -> bool:
    return bool(filesystems.glob(os.path.join(folder, "*.tar")))

  def index(self, split: str) -> _Index:
    if split not in self._indices:
      self._indices[split] = _Index(self.shards(split))
    return self._indices[split]

  def rows(self, split: str, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """(encoded images, captions) of examples [start, stop) of a split's shards."""
    return self.index(split).rows(start, stop)

  def split(self, spec: str) -> free_text.CaptionedSplit:
    """The examples a split string selects; values are encoded images."""
    sizes = {name: len(self.index(name)) for name in splits_lib.names(spec)}
    ranges = splits_lib.resolve(spec, sizes)
    return free_text.CaptionedSplit(f"{self.root}:{spec}", ranges, self.rows, "bytes")
