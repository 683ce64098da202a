"""Per-example image preprocessing on the host, without TensorFlow (the input pipeline's,
`decode_stage`, and `Model.prepare`'s): JPEGs decoded by simplejpeg with TensorFlow's
decode settings (the same pixels as `tf.io.decode_image`), other formats by Pillow;
NumPy and OpenCV crop, flip and resize.

Every function takes the encoded bytes of one image and returns its pixels as float32
(the train crop's before normalisation, the eval image's normalised), so it runs in any
thread (the decoders and OpenCV release the GIL).
Randomness comes only from a generator keyed by (config.seed, uid), uid = epoch *
num_examples + index in the split, so the same example in the same epoch always gets the
same crop and flip, whatever the batch size, the process count or the resume step.

The train crop follows torchvision's `RandomResizedCrop` (area uniform in
[min_area, 1] of the image, log-uniform aspect ratio in 3/4..4/3, 10 proposals) and, as
TensorFlow's `sample_distorted_bounding_box` in big_vision's `inception_crop`, falls back
to the whole image when no proposal fits; its window is resized as `tf.image.resize`
resizes (bilinear, no antialiasing; OpenCV, within 0.01 of TensorFlow's values). The
official eval resize ('tf' resizer) is TensorFlow's bilinear resize, by OpenCV too
(`resize_bilinear`); its other methods are TensorFlow's own.

Every image passes `image_header.decodable` first (decoded size bounded from the header,
a GIF cut after its first frame); a refused or damaged image raises ValueError naming why.
"""

from __future__ import annotations

import io
import math
import os
from typing import Sequence

import cv2
import numpy as np
import simplejpeg
from PIL import Image

from vit_jax.data import eval_images, image_header
from vit_jax.data.data_config import DataConfig
from vit_jax.infra import errors, platforms
from vit_jax.infra.image_constants import OFFICIAL_INPUT_MEAN, OFFICIAL_INPUT_STD

RGB = tuple[float, float, float]
CROP_ASPECT_RANGE = (3.0 / 4.0, 4.0 / 3.0)  # width / height, Szegedy et al. (2015)
_CROP_ATTEMPTS = 10
_JPEG = b"\xff\xd8\xff"


def open_image(data: bytes) -> Image.Image:
  """Encoded bytes -> a lazily decoded Pillow image (its first frame); ValueError when
  `image_header.decodable` refuses it or Pillow cannot read it."""
  return _open(image_header.decodable(data))


def _open(data: bytes) -> Image.Image:
  """Bytes `image_header.decodable` passed -> a lazily decoded Pillow image."""
  try:
    return Image.open(io.BytesIO(data))
  except (OSError, SyntaxError) as e:
    raise ValueError(f"not an image Pillow decodes ({e})") from None


def _rgb(image: Image.Image) -> Image.Image:
  """Decoded as RGB: grey repeated on three channels, an alpha channel dropped."""
  try:
    return image if image.mode == "RGB" else image.convert("RGB")
  except (OSError, SyntaxError, ValueError) as e:
    raise ValueError(f"a damaged image ({e})") from None


def crop_window(
  height: int, width: int, rng: np.random.Generator, min_area: float
) -> tuple[int, int, int, int]:
  """A random crop window (y, x, h, w) covering min_area..100% of the image area with
  aspect ratio in CROP_ASPECT_RANGE; the whole image when no proposal fits."""
  area = height * width
  log_lo, log_hi = math.log(CROP_ASPECT_RANGE[0]), math.log(CROP_ASPECT_RANGE[1])
  for _ in range(_CROP_ATTEMPTS):
    target = area * rng.uniform(min_area, 1.0)
    aspect = math.exp(rng.uniform(log_lo, log_hi))
    w = int(round(math.sqrt(target * aspect)))
    h = int(round(math.sqrt(target / aspect)))
    if 0 < w <= width and 0 < h <= height:
      y = int(rng.integers(0, height - h + 1))
      x = int(rng.integers(0, width - w + 1))
      return y, x, h, w
  return 0, 0, height, width


def example_rng(seed: int, uid: int) -> np.random.Generator:
  """The generator of one example's crop and flip, keyed by (config.seed, uid)."""
  return np.random.default_rng([seed % 2**63, uid])


def _decode(data: bytes) -> np.ndarray:
  """Bytes `image_header.decodable` passed -> uint8 RGB [H, W, 3]. JPEGs by libjpeg-turbo
  through simplejpeg with TensorFlow's `decode_jpeg` defaults (the fast integer DCT, fancy
  upsampling: the same pixels, and 1.6x Pillow's decode here); other formats, and the
  JPEGs simplejpeg refuses (CMYK), by Pillow."""
  if data[:3] == _JPEG:
    try:
      return simplejpeg.decode_jpeg(data, "RGB", fastdct=True)
    except ValueError:
      pass
  return np.asarray(_rgb(_open(data)))


def train_crop(
  data: bytes,
  rng: np.random.Generator,
  *,
  crop: int,
  min_area: float,
  flip: bool,
  out: np.ndarray | None = None,
) -> np.ndarray:
  """Encoded bytes -> float32 [crop, crop, 3] in 0..255, before normalisation: inception
  crop, bilinear resize, optional horizontal flip (big_vision's `inception_crop` and
  `flip_lr`), written into ``out`` where given (a C-contiguous float32 [crop, crop, 3],
  e.g. a row of a batch), else into a new array.

  The window is resized as `tf.image.resize` resizes it (half-pixel centres, no
  antialiasing) by OpenCV on float32 pixels, within 0.01 of TensorFlow's values: about 6x
  faster than Pillow's antialiased resize, and it releases the GIL. Unlike TensorFlow's
  `decode_and_crop_jpeg`, the whole image is decoded (simplejpeg has no crop decode; the
  entropy decoding of every block, which both do, is most of the time)."""
  pixels = _decode(image_header.decodable(data))  # [H, W, 3]
  y, x, h, w = crop_window(pixels.shape[0], pixels.shape[1], rng, min_area)
  window = pixels[y : y + h, x : x + w].astype(np.float32)  # [h, w, 3]
  if out is None:
    out = np.empty([crop, crop, 3], np.float32)
  if flip and rng.random() < 0.5:
    resized = cv2.resize(window, (crop, crop), interpolation=cv2.INTER_LINEAR)
    return cv2.flip(resized, 1, dst=out)
  return cv2.resize(window, (crop, crop), dst=out, interpolation=cv2.INTER_LINEAR)


def decode(data: bytes) -> np.ndarray:
  """Encoded bytes -> uint8 RGB [H, W, 3], the whole image (`image_header.decodable`'s
  bound on its decoded size first)."""
  return _decode(image_header.decodable(data))


def train_window(
  data: bytes, rng: np.random.Generator, *, min_area: float, flip: bool
) -> np.ndarray:
  """Encoded bytes -> uint8 [h, w, 3]: `train_crop`'s window (the same random draws) at its
  own size and aspect ratio, flipped as it flips; NaFlex resizes it to a patch grid."""
  pixels = decode(data)
  y, x, h, w = crop_window(pixels.shape[0], pixels.shape[1], rng, min_area)
  window = pixels[y : y + h, x : x + w]
  return window[:, ::-1] if flip and rng.random() < 0.5 else window


def normalize(
  pixels: np.ndarray, mean: RGB = OFFICIAL_INPUT_MEAN, std: RGB = OFFICIAL_INPUT_STD
) -> np.ndarray:
  """0..255 -> float32 (x - 127.5) / 127.5 clipped to [-1, 1]; with another mean/std (per
  RGB channel, 0..1 scale) (x / 255 - mean) / std, as big_vision's ``value_range`` and
  ``vgg_value_range``."""
  if tuple(mean) == OFFICIAL_INPUT_MEAN and tuple(std) == OFFICIAL_INPUT_STD:
    return np.clip((pixels.astype(np.float32) - 127.5) / 127.5, -1.0, 1.0)
  mean_, std_ = np.asarray(mean, np.float32), np.asarray(std, np.float32)
  return (pixels.astype(np.float32) / 255.0 - mean_) / std_


def normalize_into(
  pixels: np.ndarray,
  out: np.ndarray,
  randaug: bool,
  mean: RGB = OFFICIAL_INPUT_MEAN,
  std: RGB = OFFICIAL_INPUT_STD,
) -> None:
  """A train crop (float32 or uint8 [crop, crop, 3] in 0..255) -> ``out`` (float32, same
  shape): `normalize`d, or with RandAugment rounded to its uint8 values (the train step
  augments and normalises them).
  In place, with scalar factors where the channels share them (the official recipe):
  NumPy's loops over a last axis of 3 are about 15x slower."""
  if randaug:
    np.clip(np.rint(pixels, out=out), 0.0, 255.0, out=out)  # rint: half to even, as tf.round
    return
  std_, mean_ = np.asarray(std, np.float32), np.asarray(mean, np.float32)
  if (std_ == std_[0]).all() and (mean_ == mean_[0]).all():  # scalars: vectorised loops
    std_, mean_ = std_[:1].reshape(()), mean_[:1].reshape(())
  np.multiply(pixels, (1.0 / (255.0 * std_)).astype(np.float32), out=out)
  out -= mean_ / std_
  if tuple(mean) == OFFICIAL_INPUT_MEAN and tuple(std) == OFFICIAL_INPUT_STD:
    np.clip(out, -1.0, 1.0, out=out)  # within [-1, 1] exactly, as `normalize`


def resize_bilinear(
  pixels: np.ndarray, size: tuple[int, int], out: np.ndarray | None = None
) -> np.ndarray:
  """uint8 [h, w, 3] -> float32 [H, W, 3] (into ``out`` where given):
  `tf.image.resize(..., 'bilinear')` (half-pixel centres, no antialiasing), the official
  eval recipe's resize, by OpenCV on float32: within 0.013 of TensorFlow's values on the
  0..255 scale (1e-4 after normalisation), in 0.26 ms for a 500x375 photo with the GIL
  released, where TensorFlow's arithmetic in NumPy (its exact values) took 1.7 ms holding
  it, which capped a pass at one core."""
  return cv2.resize(pixels.astype(np.float32), size[::-1], dst=out, interpolation=cv2.INTER_LINEAR)


def check_eval_config(data_config: DataConfig) -> None:
  """One error line, before any image is read, where ``data_config`` asks for a resize of
  TensorFlow's (the official recipe's methods other than bilinear) and it is not installed."""
  if data_config.resizer == "tf" and data_config.interpolation != "bilinear":
    if not platforms.installed("tensorflow"):
      raise errors.ConfigError(
        f"Resizing with interpolation={data_config.interpolation!r} and resizer='tf' is "
        "TensorFlow's own resize: pip install -e \".[tf]\", or use interpolation='bilinear'."
      )


def _tf_resize(pixels: np.ndarray, data_config: DataConfig) -> np.ndarray:
  """uint8 [h, w, 3] -> float32 [H, W, 3]: the official recipe's resize of the whole image
  by a method other than bilinear, TensorFlow's own (`check_eval_config`)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  resized = tf.image.resize(pixels, data_config.input_size, method=data_config.interpolation)
  return resized.numpy().astype(np.float32)  # 'nearest' keeps uint8


def eval_image(data: bytes, data_config: DataConfig, out: np.ndarray | None = None) -> np.ndarray:
  """Encoded bytes -> float32 [H, W, 3] as ``data_config`` says: the official recipe (the
  whole image, TensorFlow's bilinear resize) or timm's PIL transform; written into ``out``
  where given (e.g. a row of a batch)."""
  if data_config.resizer == "pil":
    pixels = eval_images.transform(_rgb(open_image(data)), data_config)  # uint8 [H, W, 3]
    image = eval_images.normalize(pixels, data_config)
    if out is None:
      return image
    out[...] = image
    return out
  return _official_pixels(_decode(image_header.decodable(data)), data_config, out)


def _official_pixels(
  pixels: np.ndarray, data_config: DataConfig, out: np.ndarray | None = None
) -> np.ndarray:
  """uint8 [h, w, 3] -> the official recipe's float32 [H, W, 3], resized and normalised
  in ``out`` where given (no array made on the way for the bilinear resize)."""
  if data_config.interpolation == "bilinear":
    out = resize_bilinear(pixels, data_config.input_size, out)
  elif out is None:
    out = _tf_resize(pixels, data_config)
  else:
    out[...] = _tf_resize(pixels, data_config)
  normalize_into(out, out, False, data_config.mean, data_config.std)
  return out


def prepare(
  images: eval_images.ImageLike | Sequence[eval_images.ImageLike], data_config: DataConfig
) -> np.ndarray:
  """The eval transform: ``images`` (paths, bytes, PIL images, uint8 arrays, or a list of
  them) -> float32 [N, H, W, 3] as ``data_config`` says. 'pil' configs: timm's transform
  (`eval_images.prepare_pil`); the official recipe ('tf'): the eval pipeline's, files and
  bytes decoded and resized as the eval pipeline does (`eval_image`), so
  `predict` gives a file the evaluator's input."""
  items = eval_images.image_list(images)
  if data_config.resizer == "pil":
    return eval_images.prepare_pil(items, data_config)
  check_eval_config(data_config)
  return np.stack([_official(item, data_config) for item in items])


def _official(item: eval_images.ImageLike, data_config: DataConfig) -> np.ndarray:
  """One image as the official recipe prepares it: float32 [H, W, 3]."""
  if isinstance(item, (str, os.PathLike)):
    with open(item, "rb") as f:
      item = f.read()
  if isinstance(item, bytes):
    try:
      return eval_image(item, data_config)
    except ValueError as e:
      raise errors.InputFileError(f"not an image this package decodes ({e}).") from None
  pixels = np.asarray(eval_images.to_pil(item))  # pixels: an array or a PIL image
  return _official_pixels(pixels, data_config)
