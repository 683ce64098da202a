"""Image folders: `<root>/<split>/<class>/*.{jpg,jpeg,png}`.

Class names are the sorted sub-folder names of the train split; their position is the
label, and every other split is labelled with the same names (so a test folder that
lacks a class keeps the labels right). Within a split, files are listed in a fixed
pseudo-random order (sorted paths permuted with seed 0), so slices such as
`train[:90%]` and per-process shards mix all classes. Paths may be local or on a bucket
(gs://..., through fsspec: `filesystems`), whose images the decode workers read many at a
time (`example_images.ReadAhead`).
"""

from __future__ import annotations

import os

import numpy as np
from absl import logging

from vit_jax.data import filesystems
from vit_jax.data import splits as splits_lib
from vit_jax.infra import errors, input_files
from vit_jax.infra.printable import printable

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")  # Matched case-insensitively.
PREFIX = "folder:"  # config.dataset = 'folder:/path/to/root'
_LISTING_SEED = 0  # Seed of the fixed file order within a split; never change it.


def _subdirs(path: str) -> list[str]:
  """Sorted names of the visible sub-folders of `path`."""
  visible = [n for n in filesystems.listdir(path) if not n.startswith(".")]
  return sorted(n for n in visible if filesystems.isdir(os.path.join(path, n)))


def _regular_files(folder: str, names: list[str]) -> list[str]:
  """``names`` in ``folder`` without those that are no regular file (a FIFO would block the
  input pipeline for ever, a device never end), with one warning naming them. Checked
  locally only: a bucket holds nothing else."""
  if not input_files.is_local(folder):
    return names
  skipped = [(n, why) for n in names if (why := input_files.not_regular(os.path.join(folder, n)))]
  if skipped:
    logging.warning(
      "Skipping %d files of %s that are not regular files: %s.",
      len(skipped),
      printable(folder),
      "; ".join(f"{printable(n)} ({why})" for n, why in skipped[:5]),
    )
  return [n for n in names if n not in dict(skipped)]


class ImageFolder:
  """A root folder with one sub-folder per split and one per class inside it."""

  def __init__(self, root: str, train_split: str):
    """`train_split`: the split string whose folder defines the class names."""
    if not filesystems.isdir(root):
      raise errors.MissingError(
        f"Image folder {root!r} does not exist. config.dataset = "
        f'"{PREFIX}<root>" needs <root>/<split>/<class>/*.jpg|jpeg|png.'
      )
    self.root = root
    self.available_splits = _subdirs(root)
    self.class_names = self._class_dirs(self._names(train_split)[0])
    self._files: dict[str, tuple[np.ndarray, np.ndarray]] = {}

  def _names(self, spec: str) -> list[str]:
    """The split folders a split string names; error if one is missing."""
    names = [part.split("[")[0].strip() for part in spec.split("+")]
    for name in names:
      if name not in self.available_splits:
        raise errors.MissingError(
          f"Split folder {os.path.join(self.root, name)!r} (from split {spec!r}) "
          f"does not exist; {self.root!r} has {self.available_splits}. Create it "
          f"or set config.train_split / config.test_split to one of those."
        )
    return names

  def _class_dirs(self, split: str) -> list[str]:
    classes = _subdirs(os.path.join(self.root, split))
    if not classes:
      raise errors.MissingError(
        f"{os.path.join(self.root, split)!r} has no class folders; put the images "
        f"of each class in {os.path.join(self.root, split, '<class_name>')}/."
      )
    return classes

  def files(self, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(paths object [n], labels int64 [n]) of one split folder, in the fixed order."""
    if split not in self._files:
      self._names(split)
      index = {name: i for i, name in enumerate(self.class_names)}
      paths, labels = [], []
      for name in self._class_dirs(split):
        folder = os.path.join(self.root, split, name)
        if name not in index:
          raise errors.ConfigError(
            f"Class folder {folder!r} is not a class of the train split "
            f"({len(self.class_names)} classes: {self.class_names[:10]}...). Rename "
            f"or remove it, or add it to the train split."
          )
        found = _regular_files(
          folder,
          sorted(f for f in filesystems.listdir(folder) if f.lower().endswith(IMAGE_EXTENSIONS)),
        )
        if not found:
          raise errors.ConfigError(
            f"Class folder {folder!r} holds no {'/'.join(IMAGE_EXTENSIONS)} "
            f"images. Add images or remove the folder."
          )
        paths += [os.path.join(folder, f) for f in found]
        labels += [index[name]] * len(found)
      order = np.random.RandomState(_LISTING_SEED).permutation(len(paths))
      self._files[split] = (
        np.array(paths, dtype=object)[order],
        np.array(labels, dtype=np.int64)[order],
      )
    return self._files[split]

  def split(self, spec: str) -> "FolderSplit":
    """The examples a split string selects (e.g. 'train[:90%]')."""
    sizes = {name: len(self.files(name)[0]) for name in self._names(spec)}
    return FolderSplit(self, spec, splits_lib.resolve(spec, sizes))


class FolderSplit(splits_lib.RangedSplit):
  """A configured split of an ImageFolder; values are file paths."""

  kind = "path"

  def __init__(self, folder: ImageFolder, spec: str, ranges: list[splits_lib.Range]):
    super().__init__(f"{folder.root}:{spec}", ranges)
    self._folder = folder

  def _rows(self, split: str, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    paths, labels = self._folder.files(split)
    return paths[start:stop], labels[start:stop]
