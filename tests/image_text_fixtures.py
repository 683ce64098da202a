"""Tiny image-text data written by tests, importable without TensorFlow: a caption folder
(``captions:``), WebDataset tar shards (``wds:``), a tokenizer.json of their words and the
tiny SigLIP config that reads them. Image k of a split is a flat grey of level 10 * k with
two captions naming k, so a batch row's pixels tell which captions it may carry."""

from __future__ import annotations

import io
import json
import os
import tarfile

import ml_collections
from PIL import Image

from configs import siglip
from tests import train_fixtures
from vit_jax import models
from vit_jax.data import captions

N = 20  # examples per split: image k is grey level 10 * k
TEXT = dict(width=16, depth=1, mlp_dim=32, num_heads=2, vocab_size=64, pool="gap")


def captions_of(k: int) -> list[str]:
  """Image k's captions: two, both naming k (so a row's text tells its image)."""
  return [f"image {k} first", f"image {k} second"]


def png(k: int) -> bytes:
  out = io.BytesIO()
  Image.new("RGB", (8, 8), (10 * k,) * 3).save(out, format="PNG")
  return out.getvalue()


def write_tokenizer(path: str) -> str:
  """A tokenizer.json of every caption's words at ``path``; the path."""
  captions.CaptionTokenizer([c for k in range(N) for c in captions_of(k)]).save(path)
  return path


def image_text_config(name: str, tokenizer: str, **overrides) -> ml_collections.ConfigDict:
  """The SigLIP config of a tiny two-tower model on dataset ``name`` (6-token captions)."""
  config = siglip.get_config("digits")
  train_fixtures.override(config, train_fixtures.TINY)
  config.model = models.two_tower_config(
    models.get_model_config("testing"), text=TEXT, text_len=6, embed_dim=16
  )
  config.update(dict(dataset=name, train_split="train", test_split="test", batch=4))
  config.text.tokenizer = tokenizer
  config.pp.min_area, config.pp.flip = 1.0, False
  return train_fixtures.override(config, overrides)


def write_caption_folder(root, texts=captions_of) -> str:
  """Train and test folders of N images each with a captions.tsv; the ``captions:`` name."""
  for split in ("train", "test"):
    os.makedirs(root / split / "imgs")
    lines = []
    for k in reversed(range(N)):  # listed in any order: examples are sorted by file name
      (root / split / "imgs" / f"{k:02d}.png").write_bytes(png(k))
      lines += [f"imgs/{k:02d}.png\t{c}" for c in texts(k)]
    (root / split / "captions.tsv").write_text("\n".join(lines) + "\n")
  return f"captions:{root}"


def write_shard(path, keys, caption=lambda k: captions_of(k)[0], json_for=()) -> None:
  """One tar shard: image k as k.png with its caption as k.txt (k.json for ``json_for``;
  none where ``caption`` gives None)."""
  with tarfile.open(path, "w") as tar:
    for k in keys:
      members = [(f"{k:06d}.png", png(k))]
      if k in json_for:
        members.append((f"{k:06d}.json", json.dumps({"caption": caption(k)}).encode()))
      elif caption(k) is not None:
        members.append((f"{k:06d}.txt", caption(k).encode()))
      for name, payload in members:
        info = tarfile.TarInfo(name)
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))


def write_shards(root) -> str:
  """Train and test splits of two shards each (N images); the ``wds:`` name."""
  for split in ("train", "test"):
    os.makedirs(root / split)
    write_shard(root / split / "00000.tar", range(0, 12), json_for=(3, 5))
    write_shard(root / split / "00001.tar", range(12, N))
  return f"wds:{root}"


def class_folder(root, classes, images, labels) -> None:
  """A ``folder:`` dataset at ``root`` for zero-shot: test/<class>/<i>.png of each image
  in its labelled class, and one image per class in train/ (which names the classes)."""
  for c in classes:
    (root / "train" / c).mkdir(parents=True)
    Image.fromarray(images[0]).save(root / "train" / c / "0.png")
  for i, (pixels, label) in enumerate(zip(images, labels)):
    (root / "test" / classes[label]).mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(root / "test" / classes[label] / f"{i}.png")
