"""Encoded images that claim far more than they hold, written in milliseconds: multi-frame
GIFs, GIFs whose frame header claims a huge raster, animated WebPs, JPEG XL signatures.
Shared by the image-header tests and the hostile-input table."""

from __future__ import annotations

import io
import struct

from PIL import Image


def gif_frames(path: str, frames: int, size: int = 1024) -> None:
  """A GIF of ``frames`` frames of ``size`` x ``size`` pixels, frame i all of grey i % 256:
  one frame's block encoded by PIL, repeated (a few kB per 1024x1024 frame)."""
  blocks = []
  for grey in range(min(frames, 256)):
    buffer = io.BytesIO()
    Image.new("L", (size, size), grey).save(buffer, "GIF")
    data = buffer.getvalue()
    head = 13 + (3 << ((data[10] & 7) + 1) if data[10] & 0x80 else 0)
    blocks.append((data[:head], data[head:-1]))  # (header + colour table, image block)
  with open(path, "wb") as f:
    f.write(blocks[0][0])
    for i in range(frames):
      f.write(blocks[i % len(blocks)][1])
    f.write(b"\x3b")


def gif_claiming(path: str, width: int, height: int) -> None:
  """A GIF of a 1x1 canvas whose one frame's descriptor claims ``width`` x ``height``."""
  descriptor = b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0)
  with open(path, "wb") as f:
    f.write(b"GIF89a" + struct.pack("<HHBBB", 1, 1, 0, 0, 0) + descriptor)
    f.write(b"\x02\x02\x44\x01\x00\x3b")


def animated_webp(path: str, frames: int = 3) -> None:
  images = [Image.new("RGBA", (64, 64), (i * 80, 0, 0, 255)) for i in range(frames)]
  images[0].save(path, "WEBP", save_all=True, append_images=images[1:])


def jpeg_xl(path: str) -> None:
  """The JPEG XL codestream signature and a few bytes (TensorFlow would decode a real one)."""
  with open(path, "wb") as f:
    f.write(b"\xff\x0a" + b"\x00" * 32)
