"""Image folders with a captions file: ``config.dataset = 'captions:ROOT'``.

Each split is a folder ``ROOT/<split>/`` holding its images and one captions file that
names them by path relative to the folder:

  * ``captions.tsv``: ``file<TAB>caption`` per line; a file on several lines has several
    captions;
  * ``captions.jsonl``: one JSON object per line, ``{"file": "a.jpg", "caption": "..."}``
    (``"image"`` for ``"file"``; ``"caption"`` may be a list, or ``"captions"`` a list).

Examples are the named files in sorted order (the same on every machine; split strings
such as ``train[:90%]`` slice that order); images the file does not name are not read.
The captions file is read once to check it and to note, per example, the byte offsets of
its lines (`_CaptionFile`: 8 bytes a line, 8 an example); a block of examples reads its
lines again (on a bucket, from a local copy of the file: `remote_cache`). The names are
held only while they are sorted; images are read by path in the pipeline, like `folder`'s.
"""

from __future__ import annotations

import json
import os

import numpy as np

from vit_jax.data import filesystems, free_text, remote_cache
from vit_jax.data import splits as splits_lib
from vit_jax.infra import errors, storage

PREFIX = "captions:"  # config.dataset = 'captions:/path/to/root'
FILES = ("captions.tsv", "captions.jsonl")


Row = tuple[str, object]  # (file name, its caption value) of one line


def _parse_tsv(path: str, number: int, line: str) -> Row:
  name, tab, caption = line.rstrip("\r\n").partition("\t")
  if not tab:
    raise errors.InputFileError(
      f"{path}:{number}: no tab; each line is file<TAB>caption (got {line[:80]!r})."
    )
  return name, caption


def _parse_jsonl(path: str, number: int, line: str) -> Row:
  try:
    item = json.loads(line)
  except json.JSONDecodeError as e:
    raise errors.InputFileError(f"{path}:{number}: not JSON ({e.msg}).") from None
  name = item.get("file", item.get("image")) if isinstance(item, dict) else None
  if not isinstance(name, str):
    raise errors.InputFileError(
      f'{path}:{number}: each line is an object with "file" (or "image") and "caption" '
      f'(or a list in "captions"); got {line.strip()[:80]!r}.'
    )
  return name, item.get("caption", item.get("captions"))


def _decode(path: str, number: int, raw: bytes) -> str:
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError:
    raise errors.InputFileError(f"{path}:{number}: not UTF-8 text.") from None


class _CaptionFile:
  """One split folder's captions file, indexed: examples in sorted file order, each the
  byte offsets of its lines (``lines[starts[i]:starts[i + 1]]``, int64)."""

  def __init__(self, folder: str):
    found = [f for f in FILES if filesystems.exists(os.path.join(folder, f))]
    if len(found) != 1:
      what = "both " + " and ".join(found) if found else f"no {' or '.join(FILES)}"
      raise errors.MissingError(
        f"Caption folder {folder!r} has {what}: put exactly one captions file beside the "
        "images (file<TAB>caption lines, or JSON lines with file and caption)."
      )
    self.folder, self.path = folder, os.path.join(folder, found[0])
    # On a bucket, a local copy: each block of examples reads its lines again, by offset.
    self._read = remote_cache.local_copy(self.path) if storage.is_remote(self.path) else self.path
    self._parse = _parse_tsv if self.path.endswith(".tsv") else _parse_jsonl
    names, offsets, offset = [], [], 0
    with filesystems.open_binary(self._read) as f:
      for number, raw in enumerate(f, 1):
        line = _decode(self.path, number, raw)
        if line.strip():
          name, caption = self._parse(self.path, number, line)
          free_text.as_captions(caption, f"{self.path}, {name!r}")
          names.append(name)
          offsets.append(offset)
        offset += len(raw)
    if not names:
      raise errors.InputFileError(f"Captions file {self.path!r} names no image: it is empty.")
    order = sorted(range(len(names)), key=names.__getitem__)  # stable: a file's lines in order
    self.lines = np.array(offsets, np.int64)[order]  # [lines]
    new = [i for i in range(len(order)) if i == 0 or names[order[i]] != names[order[i - 1]]]
    self.starts = np.array([*new, len(order)], np.int64)  # [n + 1]

  def __len__(self) -> int:
    return len(self.starts) - 1

  def rows(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """(image paths object [k], captions object [k] of tuples) of examples [start, stop)."""
    paths, captions = np.empty(stop - start, object), np.empty(stop - start, object)
    with filesystems.open_binary(self._read) as f:
      for i in range(start, stop):
        texts: list[str] = []
        for offset in self.lines[self.starts[i] : self.starts[i + 1]]:
          f.seek(int(offset))
          name, caption = self._parse(self.path, 0, f.readline().decode("utf-8"))
          texts += free_text.as_captions(caption, f"{self.path}, {name!r}")
        paths[i - start], captions[i - start] = os.path.join(self.folder, name), tuple(texts)
    return paths, captions


class CaptionFolder:
  """``ROOT/<split>/`` folders of images, each with its captions file."""

  def __init__(self, root: str):
    layout = f"<root>/<split>/ folders of images, each with a {' or '.join(FILES)}"
    self.root = free_text.check_root(root, "Caption folder", PREFIX, layout)
    self.class_names = None
    self._files: dict[str, _CaptionFile] = {}

  def _file(self, split: str) -> _CaptionFile:
    if split not in self._files:
      self._files[split] = _CaptionFile(os.path.join(self.root, split))
    return self._files[split]

  def rows(self, split: str, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """(image paths, captions) of examples [start, stop) of a split folder."""
    return self._file(split).rows(start, stop)

  def split(self, spec: str) -> free_text.CaptionedSplit:
    """The examples a split string selects (e.g. 'train[:90%]'); values are file paths."""
    names = splits_lib.names(spec)
    for name in names:
      if not filesystems.isdir(os.path.join(self.root, name)):
        raise errors.MissingError(
          f"Split folder {os.path.join(self.root, name)!r} (from split {spec!r}) does not "
          "exist: create it or set config.train_split / config.test_split to a folder of "
          f"{self.root!r}."
        )
    sizes = {name: len(self._file(name)) for name in names}
    ranges = splits_lib.resolve(spec, sizes)
    return free_text.CaptionedSplit(f"{self.root}:{spec}", ranges, self.rows, "path")
