"""The PIL half of the eval transform `vit_jax.data.host_images.prepare`: images of any
kind (a file path, encoded bytes, a PIL image, a uint8 array [H, W], [H, W, 3|4] or
[N, H, W, 3], or a list of these) as a list (`image_list`), and for ``resizer='pil'``
configs the model's inputs float32 [N, H, W, 3] (`prepare_pil`), with no TensorFlow.

`prepare_pil` computes what timm's `create_transform(**resolve_data_config(...))` computes
on a PIL image (PIL decode, the same sizes, PIL's antialiased resize, torchvision's crop
offsets, x / 255 then (x - mean) / std in float32), and with ``crop_offset='floor'`` what
transformers' PIL image processors compute.
"""

from __future__ import annotations

import io
import os
from typing import Any, Sequence, Union

import numpy as np

from vit_jax.data.data_config import PIL_RESAMPLE, DataConfig
from vit_jax.infra import errors

Image = Any  # a PIL.Image.Image (PIL is imported where it is used)
ImageLike = Union[str, os.PathLike, bytes, np.ndarray, Image]


def prepare_pil(images: Sequence[ImageLike], data_config: DataConfig) -> np.ndarray:
  """``images`` (`image_list`'s) -> float32 [N, H, W, 3] through PIL, as timm does."""
  inputs = [normalize(transform(to_pil(image), data_config), data_config) for image in images]
  return np.stack(inputs)


def image_list(images: Any) -> list[Any]:
  """One image or a sequence of them -> a list of images, a batch array [N, H, W, 3]
  split; a float array or one of another shape is one error saying what to pass."""
  if isinstance(images, np.ndarray):
    _check_array(images)
    return list(images) if images.ndim == 4 else [images]
  if isinstance(images, (list, tuple)):
    if not images:
      raise errors.InputFileError("No images to prepare: pass at least one.")
    return [item for image in images for item in image_list(image)]
  return [images]


def _check_array(array: np.ndarray) -> None:
  if array.dtype != np.uint8:
    raise errors.InputFileError(
      f"An image array of dtype {array.dtype} is not read: pass uint8 pixels 0..255 (from "
      "floats in [0, 1]: (x * 255).round().astype(np.uint8))."
    )
  channels = {2: (array.shape[-1],), 3: (1, 3, 4), 4: (3,)}.get(array.ndim, ())
  if array.shape[-1] not in channels:
    raise errors.InputFileError(
      f"An image array of shape {array.shape} is not read: pass [H, W], [H, W, 3], "
      "[H, W, 4] or a batch [N, H, W, 3]."
    )


def to_pil(item: Any) -> Image:
  """An RGB PIL image of a path, bytes, a PIL image or a uint8 array (alpha dropped, grey
  repeated; a GIF's first frame)."""
  from PIL import Image as pil  # pylint: disable=g-import-not-at-top

  if isinstance(item, pil.Image):
    return item.convert("RGB")
  if isinstance(item, np.ndarray):
    pixels = item[..., :3] if item.ndim == 3 and item.shape[-1] == 4 else item  # alpha dropped
    return pil.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).convert("RGB")
  what = f"{os.fspath(item)!r}" if isinstance(item, (str, os.PathLike)) else "the bytes"
  if not isinstance(item, (str, os.PathLike, bytes)):
    raise errors.InputFileError(
      f"A {type(item).__name__} is not an image: pass a path, bytes, a PIL image or a uint8 array."
    )
  try:
    with pil.open(io.BytesIO(item) if isinstance(item, bytes) else item) as image:
      return image.convert("RGB")
  except (OSError, ValueError, pil.DecompressionBombError) as e:
    raise errors.InputFileError(f"{what}: not an image PIL decodes ({e}).") from None


def resize_size(height: int, width: int, data_config: DataConfig) -> tuple[int, int]:
  """(height, width) the image is resized to before the centre crop, as timm computes it."""
  scale_h, scale_w = data_config.scale_size
  if data_config.crop_mode == "squash":
    return scale_h, scale_w
  if data_config.crop_mode == "center" and scale_h == scale_w:  # torchvision's shortest edge
    short, long = min(height, width), max(height, width)
    new_long = int(scale_h * long / short)
    return (scale_h, new_long) if height <= width else (new_long, scale_h)
  # timm's ResizeKeepRatio: the shortest edge ('center') or the longest ('border') fits.
  ratios = (height / scale_h, width / scale_w)
  ratio = max(ratios) if data_config.crop_mode == "border" else min(ratios)
  return round(height / ratio), round(width / ratio)


def transform(image: Image, data_config: DataConfig) -> np.ndarray:
  """An RGB PIL image -> uint8 [H, W, 3]: resized with PIL, centre-cropped (padded where
  the crop is larger: zeros, the mean colour for 'border', as timm pads)."""
  from PIL import Image as pil  # pylint: disable=g-import-not-at-top

  height, width = resize_size(image.height, image.width, data_config)
  if (height, width) != (image.height, image.width):
    image = image.resize((width, height), pil.Resampling(PIL_RESAMPLE[data_config.interpolation]))
  pixels = np.asarray(image)  # [h, w, 3]
  fill = [round(255 * m) for m in data_config.mean] if data_config.crop_mode == "border" else 0
  return center_crop(pixels, data_config.input_size, fill, data_config.crop_offset)


def center_crop(
  pixels: np.ndarray, size: tuple[int, int], fill: Any = 0, offset: str = "round"
) -> np.ndarray:
  """uint8 [h, w, 3] -> [H, W, 3] from the centre, as torchvision's `center_crop`: padded
  first where smaller (the extra pixel after), the offset round((h - H) / 2), half to
  even; with ``offset='floor'`` (h - H) // 2, as transformers crops."""
  pad = [((t - s) // 2, (t - s + 1) // 2) if t > s else (0, 0) for s, t in zip(pixels.shape, size)]
  if any(p != (0, 0) for p in pad):
    (top, bottom), (left, right) = pad[0], pad[1]
    h, w = pixels.shape[:2]
    padded = np.empty((top + h + bottom, left + w + right, 3), np.uint8)
    padded[...] = np.asarray(fill, np.uint8)
    padded[top : top + h, left : left + w] = pixels
    pixels = padded
  if offset == "floor":
    top, left = ((s - t) // 2 for s, t in zip(pixels.shape, size))
  else:
    top, left = (int(round((s - t) / 2.0)) for s, t in zip(pixels.shape, size))
  return pixels[top : top + size[0], left : left + size[1]]


def normalize(pixels: np.ndarray, data_config: DataConfig) -> np.ndarray:
  """uint8 [H, W, 3] -> float32 (x / 255 - mean) / std, in float32 as torchvision does."""
  x = pixels.astype(np.float32) / np.float32(255)
  return (x - np.asarray(data_config.mean, np.float32)) / np.asarray(data_config.std, np.float32)
