"""`image_header.decodable`: the first frame only, the decoded bytes bounded from the header,
for every format TensorFlow's `decode_image` reads."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from tests import image_bombs
from vit_jax.data import image_header


def _encoded(image: Image.Image, fmt: str, **kwargs) -> bytes:
  buffer = io.BytesIO()
  image.save(buffer, fmt, **kwargs)
  return buffer.getvalue()


def _decode(data: bytes) -> np.ndarray:
  return tf.io.decode_image(data, channels=3, expand_animations=False).numpy()


@pytest.mark.parametrize(
  "fmt,kwargs",
  [("JPEG", {}), ("PNG", {}), ("BMP", {}), ("WEBP", {}), ("WEBP", {"lossless": True})],
)
def test_a_still_image_passes_unchanged(fmt, kwargs):
  pixels = np.random.default_rng(0).integers(0, 256, (20, 30, 3), np.uint8)
  data = _encoded(Image.fromarray(pixels), fmt, **kwargs)
  assert image_header.decodable(data) == data


def test_a_gif_is_cut_after_its_first_frame_which_decodes_the_same(tmp_path):
  path = str(tmp_path / "a.gif")
  image_bombs.gif_frames(path, frames=50, size=64)
  with open(path, "rb") as f:
    data = f.read()
  cut = image_header.decodable(data)
  assert len(cut) < len(data) / 40
  every = tf.io.decode_image(data, channels=3, expand_animations=True).numpy()
  assert every.shape == (50, 64, 64, 3)
  np.testing.assert_array_equal(_decode(cut), every[0])


def test_an_apng_decodes_its_default_image_only():
  frames = [Image.new("RGB", (16, 16), (i * 60, 0, 0)) for i in range(4)]
  data = _encoded(frames[0], "PNG", save_all=True, append_images=frames[1:])
  assert image_header.decodable(data) == data
  assert _decode(data).shape == (16, 16, 3)
  assert tf.io.decode_image(data, channels=3, expand_animations=True).shape == (16, 16, 3)


def _png_claiming(width: int, height: int) -> bytes:
  header = b"IHDR" + struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
  return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + header + b"\0" * 8


def _jpeg_claiming(width: int, height: int) -> bytes:
  app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\0" + b"\0" * 9
  sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\0" * 9
  return b"\xff\xd8" + app0 + sof


def _bmp_claiming(width: int, height: int) -> bytes:
  return b"BM" + b"\0" * 12 + struct.pack("<Iii", 40, width, -height) + b"\0" * 28


def _webp_claiming(width: int, height: int) -> bytes:
  size = (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
  return b"RIFF\0\0\0\0WEBPVP8X" + struct.pack("<I", 10) + b"\0" * 4 + size


@pytest.mark.parametrize(
  "kind,data",
  [
    ("PNG", _png_claiming(20000, 20000)),
    ("JPEG", _jpeg_claiming(65000, 65000)),
    ("BMP", _bmp_claiming(30000, 30000)),
    ("WebP", _webp_claiming(16000, 16000)),
  ],
)
def test_a_header_claiming_more_decoded_bytes_than_the_bound_is_refused(kind, data):
  with pytest.raises(ValueError, match=f"its {kind} header claims .* decoded bytes, more than"):
    image_header.decodable(data)


def test_the_bound_is_total_decoded_bytes_of_one_rgb_image():
  side = int((image_header.MAX_DECODED_BYTES // 3) ** 0.5)
  assert image_header.decodable(_png_claiming(side, side))
  with pytest.raises(ValueError, match="decoded bytes"):
    image_header.decodable(_png_claiming(side + 1, side + 1))


def test_a_gif_frame_claiming_a_huge_raster_is_refused(tmp_path):
  path = str(tmp_path / "frame.gif")
  image_bombs.gif_claiming(path, 30000, 30000)
  with open(path, "rb") as f, pytest.raises(ValueError, match="its GIF header claims 900,000,003"):
    image_header.decodable(f.read())


@pytest.mark.parametrize(
  "write,reason",
  [
    (image_bombs.animated_webp, "an animated WebP"),
    (image_bombs.jpeg_xl, "a JPEG XL image"),
    (lambda p: open(p, "wb").write(b"GIF89a\x01\x00"), "a truncated GIF"),
    (lambda p: open(p, "wb").write(b"not an image"), "not a JPEG, PNG, GIF, BMP or WebP image"),
  ],
)
def test_what_cannot_be_bounded_is_refused_with_a_reason(tmp_path, write, reason):
  path = str(tmp_path / "x")
  write(path)
  with open(path, "rb") as f, pytest.raises(ValueError, match=reason):
    image_header.decodable(f.read())


def _jpeg_patched(width: int, height: int) -> bytes:
  """A real JPEG whose frame header is changed to claim ``width`` x ``height``."""
  data = bytearray(_encoded(Image.new("RGB", (30, 20)), "JPEG"))
  at = data.index(b"\xff\xc0")
  data[at + 5 : at + 9] = struct.pack(">HH", height, width)
  return bytes(data)
