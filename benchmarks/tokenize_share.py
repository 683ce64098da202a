r"""Tokenizing's share of an image-text train batch's CPU time.

The pipeline tokenizes each batch's captions in its main thread (`Dataset.tokenize`),
beside the decoding stage's workers. This prints process CPU milliseconds per batch of
``--batch`` captions for the two tokenizer kinds a run reads (a word-level
``tokenizer.json`` and a SentencePiece unigram ``.model``, both built here from the
captions), against the process CPU milliseconds per batch of the whole train pipeline
(read, decode, crop 224, tokenize, batch, to a global jax.Array; decoded in Grain's
threads, `decode_processes=0`, so that the process's CPU time holds the decode) over a
``captions:`` folder of photo-like 500x375 JPEGs (`input_data.photo_jpeg`) with captions
of 8-16 words (`caption_data.caption`). The rows alternate in each of ``--rounds``
rounds; medians, per-round values in brackets.

    python benchmarks/tokenize_share.py [--images 1024] [--batch 128] [--steps 6] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import caption_data  # noqa: E402
import input_data  # noqa: E402


def write_caption_folder(root: str, images: int) -> list[str]:
  """``root/train`` of ``images`` JPEGs and their captions.tsv; the captions."""
  rng = np.random.default_rng(0)
  folder = os.path.join(root, "train")
  os.makedirs(folder)
  texts = [caption_data.caption(k) for k in range(images)]
  for k in range(images):
    with open(os.path.join(folder, f"{k:05d}.jpg"), "wb") as f:
      f.write(input_data.photo_jpeg(rng))
  with open(os.path.join(folder, "captions.tsv"), "w") as f:
    f.write("".join(f"{k:05d}.jpg\t{t}\n" for k, t in enumerate(texts)))
  return texts


def sentencepiece_model(work: str, texts: list[str]) -> str:
  import sentencepiece  # pylint: disable=g-import-not-at-top

  with open(os.path.join(work, "captions.txt"), "w") as f:
    f.write("\n".join(texts))
  prefix = os.path.join(work, "spiece")
  sentencepiece.SentencePieceTrainer.train(
    input=f"{prefix[: -len('spiece')]}captions.txt", model_prefix=prefix, vocab_size=48,
    minloglevel=2, model_type="unigram",
  )  # fmt: skip
  return prefix + ".model"


def cpu_ms(fn: Callable[[], None], repeats: int) -> float:
  """Process CPU milliseconds of one call of ``fn``, averaged over ``repeats``."""
  start = time.process_time()
  for _ in range(repeats):
    fn()
  return 1e3 * (time.process_time() - start) / repeats


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--images", type=int, default=1024)
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--steps", type=int, default=6, help="timed train batches a round")
  parser.add_argument("--rounds", type=int, default=3)
  args = parser.parse_args()

  from configs import common  # pylint: disable=g-import-not-at-top
  from vit_jax import data  # pylint: disable=g-import-not-at-top
  from vit_jax.data import dataset as dataset_lib  # pylint: disable=g-import-not-at-top
  from vit_jax.data import free_text  # pylint: disable=g-import-not-at-top
  from vit_jax.infra import sharding  # pylint: disable=g-import-not-at-top
  from vit_jax.run import objectives  # pylint: disable=g-import-not-at-top

  work = tempfile.mkdtemp(prefix="tokenize_share_")
  try:
    texts = write_caption_folder(os.path.join(work, "data"), args.images)
    config = caption_data.run_config(work, caption_data.write_tokenizer(work), args.batch)
    config.dataset, config.test_split = f"captions:{os.path.join(work, 'data')}", "train"
    config.pp = common.get_config().pp  # the default train crop: 224, min_area 0.05, flip
    config.decode_processes = 0  # decoded in this process, so its CPU time holds the decode
    settings = objectives.data_settings(config)
    words = dataset_lib.Dataset(settings).tokenizer
    spiece = free_text.load_tokenizer(sentencepiece_model(work, texts), "sticky")
    batch = texts[: args.batch]
    mesh = sharding.make_mesh((("data", -1), ("model", 1)))

    def pipeline() -> float:
      batches = data.train_iterator(settings, mesh)
      next(batches)["text"].block_until_ready()  # started, not timed
      start = time.process_time()
      for _ in range(args.steps):
        next(batches)["text"].block_until_ready()
      del batches
      return 1e3 * (time.process_time() - start) / args.steps

    rows = {
      "tokenize, word-level tokenizer.json": lambda: cpu_ms(lambda: words.encode(batch, 16), 20),
      "tokenize, SentencePiece unigram": lambda: cpu_ms(lambda: spiece.encode(batch, 16), 20),
      "whole train pipeline (crop 224, all threads)": pipeline,
    }
    got: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
      for name, fn in rows.items():
        got[name].append(fn())
    whole = float(np.median(got["whole train pipeline (crop 224, all threads)"]))
    print(f"| row | process CPU ms per batch of {args.batch} | share of the pipeline's |")
    print("|---|---|---|")
    for name, values in got.items():
      each = ", ".join(f"{v:.1f}" for v in values)
      median = float(np.median(values))
      print(f"| {name} | {median:.1f} ({each}) | {100 * median / whole:.1f}% |")
  finally:
    shutil.rmtree(work)
  os._exit(0)  # the train pipeline's threads end with the process


if __name__ == "__main__":
  main()
