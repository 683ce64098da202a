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


def random_value(feature: tfds.features.FeatureConnector, rng: np.random.Generator) -> Any:
  """A random value of a tfds ``feature`` as its builder would yield it: a PNG of the
  image's shape (8x8 where it is free), a class below the label's count, 3 to 10 elements of a
  sequence, zeros-to-ones of a tensor's shape, a name for a text."""
  f = tfds.features
  if isinstance(feature, f.FeaturesDict):
    return {key: random_value(sub, rng) for key, sub in feature.items()}
  if isinstance(feature, f.Sequence):
    return [random_value(feature.feature, rng) for _ in range(rng.integers(3, 11))]
  if isinstance(feature, f.Image):
    height, width, channels = (d or 8 for d in feature.shape)
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels[..., 0] if channels == 1 else pixels).save(out, format="PNG")
    out.seek(0)
    return out
  if isinstance(feature, f.ClassLabel):
    return int(rng.integers(feature.num_classes))
  if isinstance(feature, f.BBoxFeature):
    ymin, xmin = rng.uniform(0, 0.5, 2)
    return f.BBox(ymin, xmin, ymin + 0.5, xmin + 0.5)
  if isinstance(feature, f.Text):
    return f"text {rng.integers(1000)}"
  if isinstance(feature, f.Tensor):
    return rng.uniform(0, 1, feature.shape).astype(feature.np_dtype)
  raise TypeError(f"No random value for the tfds feature {feature!r}")


def prepare(
  name: str,
  data_dir: str,
  splits: dict[str, int],
  example: Callable[[int, np.random.Generator], dict[str, Any]] | None = None,
  config: str | None = None,
) -> tfds.core.DatasetBuilder:
  """Prepares tfds ``name`` (its builder ``config``, else the default) into ``data_dir``
  with ``splits`` {split: examples}, example k of each split ``example(k, rng)`` (an
  'image' of `png` added where it sets none); the prepared builder. ``example=None``: every
  feature a `random_value`."""
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
          if example is None:
            yield k, random_value(self.info.features, rng)
          else:
            yield k, {"image": png(rng), **example(k, rng)}

  Tiny.name = name
  builder = Tiny(data_dir=data_dir, config=config) if config else Tiny(data_dir=data_dir)
  tfds.disable_progress_bar()
  try:
    builder.download_and_prepare(file_format="array_record")
  finally:
    tfds.enable_progress_bar()
  return builder
