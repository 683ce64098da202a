"""Image folders with a captions file: ``config.dataset = 'captions:ROOT'``.

Each split is a folder ``ROOT/<split>/`` holding its images and one captions file that
names them by path relative to the folder:

  * ``captions.tsv``: ``file<TAB>caption`` per line; a file on several lines has several
    captions;
  * ``captions.jsonl``: one JSON object per line, ``{"file": "a.jpg", "caption": "..."}``
    (``"image"`` for ``"file"``; ``"caption"`` may be a list, or ``"captions"`` a list).

Examples are the named files in sorted order (the same on every machine; split strings
such as ``train[:90%]`` slice that order); images the file does not name are not read.
Captions are kept in memory; images are read by path in the pipeline, like `folder`'s.
"""

from __future__ import annotations

import collections
import json
import os

import numpy as np
import tensorflow as tf

from vit_jax import errors
from vit_jax.data import free_text
from vit_jax.data import splits as splits_lib

PREFIX = "captions:"  # config.dataset = 'captions:/path/to/root'
FILES = ("captions.tsv", "captions.jsonl")


def _parse_tsv(path: str, lines: list[str]) -> list[tuple[str, object]]:
  rows = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    name, tab, caption = line.rstrip("\r\n").partition("\t")
    if not tab:
      raise errors.InputFileError(
        f"{path}:{number}: no tab; each line is file<TAB>caption (got {line[:80]!r})."
      )
    rows.append((name, caption))
  return rows


def _parse_jsonl(path: str, lines: list[str]) -> list[tuple[str, object]]:
  rows = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
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
    rows.append((name, item.get("caption", item.get("captions"))))
  return rows


def read_captions(folder: str) -> tuple[np.ndarray, np.ndarray]:
  """(image paths object [n], captions object [n] of tuples) of one split folder, in
  sorted file order; a missing, empty or malformed captions file is an error naming it."""
  found = [f for f in FILES if tf.io.gfile.exists(os.path.join(folder, f))]
  if len(found) != 1:
    what = "both " + " and ".join(found) if found else f"no {' or '.join(FILES)}"
    raise errors.MissingError(
      f"Caption folder {folder!r} has {what}: put exactly one captions file beside the "
      "images (file<TAB>caption lines, or JSON lines with file and caption)."
    )
  path = os.path.join(folder, found[0])
  with tf.io.gfile.GFile(path, "r") as f:
    lines = f.read().splitlines()
  parse = _parse_tsv if path.endswith(".tsv") else _parse_jsonl
  texts: dict[str, list[str]] = collections.defaultdict(list)
  for name, caption in parse(path, lines):
    texts[name] += free_text.as_captions(caption, f"{path}, {name!r}")
  if not texts:
    raise errors.InputFileError(f"Captions file {path!r} names no image: it is empty.")
  names = sorted(texts)
  paths = np.array([os.path.join(folder, n) for n in names], dtype=object)
  return paths, free_text.captions_array([tuple(texts[n]) for n in names])


class CaptionFolder:
  """``ROOT/<split>/`` folders of images, each with its captions file."""

  def __init__(self, root: str):
    layout = f"<root>/<split>/ folders of images, each with a {' or '.join(FILES)}"
    self.root = free_text.check_root(root, "Caption folder", PREFIX, layout)
    self.class_names = None
    self._splits: dict[str, tuple[np.ndarray, np.ndarray]] = {}

  def rows(self, split: str, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """(image paths, captions) of examples [start, stop) of a split folder."""
    if split not in self._splits:
      self._splits[split] = read_captions(os.path.join(self.root, split))
    paths, captions = self._splits[split]
    return paths[start:stop], captions[start:stop]

  def split(self, spec: str) -> free_text.CaptionedSplit:
    """The examples a split string selects (e.g. 'train[:90%]'); values are file paths."""
    names = splits_lib.names(spec)
    for name in names:
      if not tf.io.gfile.isdir(os.path.join(self.root, name)):
        raise errors.MissingError(
          f"Split folder {os.path.join(self.root, name)!r} (from split {spec!r}) does not "
          "exist: create it or set config.train_split / config.test_split to a folder of "
          f"{self.root!r}."
        )
    sizes = {name: len(self.rows(name, 0, None)[0]) for name in names}
    ranges = splits_lib.resolve(spec, sizes)
    return free_text.CaptionedSplit(f"{self.root}:{spec}", ranges, self.rows, "path")
