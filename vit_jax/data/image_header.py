"""Encoded images made safe to decode: the first frame only, its decoded bytes bounded from
the header before anything is decoded.

TensorFlow's `decode_image` (the train and eval pipelines, `predict`) reads JPEG, PNG,
GIF, BMP, WebP and JPEG XL, whatever a file's name. Its GIF decoder decodes every frame
of an animation before it keeps the first (`expand_animations=False`): a GIF of
thousands of frames of 1024x1024 pixels, a few megabytes on disk, takes gigabytes.
`decodable` therefore cuts a GIF after its first frame, and refuses, with a reason in
words, what cannot be bounded before decoding:

* the decoded bytes of the one frame decoded (width x height x 3, plus a GIF frame's
  own raster) over `MAX_DECODED_BYTES`, read from the header;
* an animated WebP (TensorFlow reads no single frame of one);
* JPEG XL (its size is not in a fixed place of its header) and any other format.

A PNG's APNG frames and a JPEG's further pictures (MPO) are never decoded: libpng and
libjpeg read the first image only.
"""

from __future__ import annotations

import struct

from vit_jax.infra import input_files

# One RGB image of the pixel bound (PIL's decompression-bomb threshold): 256 MiB.
MAX_DECODED_BYTES = 3 * input_files.MAX_IMAGE_PIXELS
FORMATS = "a JPEG, PNG, GIF, BMP or WebP image"
_JPEG_FRAMES = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_JXL = (b"\xff\x0a", b"\x00\x00\x00\x0cJXL \r\n\x87\n")


def _color_table(flags: int) -> int:
  """Bytes of the GIF colour table a descriptor's ``flags`` announce."""
  return 3 << ((flags & 7) + 1) if flags & 0x80 else 0


def _after_sub_blocks(data: bytes, pos: int) -> int:
  """The position after the GIF data sub-blocks starting at ``pos``."""
  while pos < len(data):
    size = data[pos]
    pos += 1 + size
    if size == 0:
      return pos
  raise ValueError("a truncated GIF")


def _gif_first_frame(data: bytes) -> tuple[bytes, int]:
  """(the GIF cut after its first image, with its trailer; the bytes decoding it takes)."""
  if len(data) < 13:
    raise ValueError("a truncated GIF")
  width, height = struct.unpack_from("<HH", data, 6)
  pos = 13 + _color_table(data[10])
  while pos < len(data):
    block = data[pos]
    if block == 0x21:  # an extension: its label, then sub-blocks
      pos = _after_sub_blocks(data, pos + 2)
    elif block == 0x2C:  # the first image: descriptor, colour table, LZW code size, data
      if pos + 10 > len(data):
        break
      frame_w, frame_h = struct.unpack_from("<HH", data, pos + 5)
      end = _after_sub_blocks(data, pos + 11 + _color_table(data[pos + 9]))
      return data[:end] + b"\x3b", width * height * 3 + frame_w * frame_h
    elif block == 0x3B:  # the trailer before any image
      raise ValueError("a GIF without an image")
    else:
      raise ValueError(f"a damaged GIF (block 0x{block:02x} at byte {pos})")
  raise ValueError("a truncated GIF")


def _jpeg_size(data: bytes) -> tuple[int, int]:
  """(width, height) from a JPEG's first frame header (SOFn)."""
  pos = 2
  while pos + 4 <= len(data):
    if data[pos] != 0xFF:
      raise ValueError(f"a damaged JPEG (no marker at byte {pos})")
    marker = data[pos + 1]
    if marker == 0xFF:  # fill byte
      pos += 1
    elif marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
      pos += 2
    elif marker in _JPEG_FRAMES and pos + 9 <= len(data):
      height, width = struct.unpack_from(">HH", data, pos + 5)
      return width, height
    else:
      pos += 2 + struct.unpack_from(">H", data, pos + 2)[0]
  raise ValueError("a JPEG without a frame header")


def _webp_size(data: bytes) -> tuple[int, int]:
  """(width, height) of a still WebP; a ValueError for an animated one."""
  chunk = data[12:16]
  if chunk == b"VP8X" and len(data) >= 30:
    if data[20] & 0x02:
      raise ValueError("an animated WebP (only still images are read): save its first frame")
    w, h = (int.from_bytes(data[i : i + 3], "little") + 1 for i in (24, 27))
    return w, h
  if chunk == b"VP8 " and len(data) >= 30:
    w, h = struct.unpack_from("<HH", data, 26)
    return w & 0x3FFF, h & 0x3FFF
  if chunk == b"VP8L" and len(data) >= 25:
    bits = struct.unpack_from("<I", data, 21)[0]
    return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
  raise ValueError("a damaged WebP")


def _bmp_size(data: bytes) -> tuple[int, int]:
  if len(data) < 26:
    raise ValueError("a truncated BMP")
  if struct.unpack_from("<I", data, 14)[0] == 12:  # the old OS/2 header: 16-bit sizes
    return struct.unpack_from("<HH", data, 18)
  width, height = struct.unpack_from("<ii", data, 18)
  return abs(width), abs(height)


def decodable(data: bytes) -> bytes:
  """``data`` as TensorFlow should decode it (a GIF cut after its first frame); a
  ValueError saying why when it is no image whose decoded bytes, read from its header,
  are within `MAX_DECODED_BYTES`."""
  if data[:3] == b"\xff\xd8\xff":
    kind, (width, height) = "JPEG", _jpeg_size(data)
  elif data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
    kind, (width, height) = "PNG", struct.unpack_from(">II", data, 16)
  elif data[:2] == b"BM":
    kind, (width, height) = "BMP", _bmp_size(data)
  elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
    kind, (width, height) = "WebP", _webp_size(data)
  elif data[:6] in (b"GIF87a", b"GIF89a"):
    data, decoded = _gif_first_frame(data)
    if decoded > MAX_DECODED_BYTES:
      raise ValueError(
        f"its GIF header claims {decoded:,} decoded bytes for one frame, more than "
        f"{MAX_DECODED_BYTES:,}"
      )
    return data
  elif data.startswith(_JXL):
    raise ValueError("a JPEG XL image, not read (its size is not bounded): convert it to PNG")
  else:
    raise ValueError(f"not {FORMATS}")
  decoded = width * height * 3
  if decoded > MAX_DECODED_BYTES:
    raise ValueError(
      f"its {kind} header claims {width}x{height} pixels, {decoded:,} decoded bytes, more "
      f"than {MAX_DECODED_BYTES:,}"
    )
  return data
