"""Tiny tfds datasets with the real builders' feature specs, prepared as ArrayRecord without
TensorFlow or network: the builder's own class with its example generation replaced, so
`tfds.builder(name, data_dir=...)` finds them prepared (images: PNG bytes made with Pillow,
since tfds encodes arrays with TensorFlow)."""

from __future__ import annotations

import inspect
import io
from typing import Any, Callable

import numpy as np
import tensorflow_datasets as tfds
from etils import epath
from PIL import Image


def png(rng: np.random.Generator, size: int = 8) -> io.BytesIO:
  """A random RGB image [size, size, 3], PNG-encoded."""
  out = io.BytesIO()
  Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(out, format="PNG")
  out.seek(0)
  return out


def prepare(
  name: str,
  data_dir: str,
  splits: dict[str, int],
  example: Callable[[int, np.random.Generator], dict[str, Any]],
  config: str | None = None,
) -> tfds.core.DatasetBuilder:
  """Prepares tfds ``name`` (its builder ``config``, else the default) into ``data_dir``
  with ``splits`` {split: examples}, example k of each split ``example(k, rng)`` (an
  'image' of `png` added where it sets none); the prepared builder."""
  base = tfds.builder_cls(name)

  with tfds.core.registered.skip_registration():

    class Tiny(base):  # pylint: disable=abstract-method
      # The real builder's file (tfds' own lookup of a class's package fails outside tfds).
      code_path = epath.Path(inspect.getfile(base))

      def _split_generators(self, dl_manager):
        del dl_manager
        return {split: self._generate_examples(n) for split, n in splits.items()}

      def _generate_examples(self, n):  # pylint: disable=arguments-differ
        rng = np.random.default_rng(n)
        for k in range(n):
          yield k, {"image": png(rng), **example(k, rng)}

  Tiny.name = name
  builder = Tiny(data_dir=data_dir, config=config) if config else Tiny(data_dir=data_dir)
  tfds.disable_progress_bar()
  try:
    builder.download_and_prepare(file_format="array_record")
  finally:
    tfds.enable_progress_bar()
  return builder
