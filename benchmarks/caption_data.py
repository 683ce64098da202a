r"""Image-text data at scale: resident memory over N and 10N examples of WebDataset shards,
and the cost per example of tokenising beside the rest of the input pipeline.

Both write their own data: uncompressed tar shards of 1,000 examples (an 8x8 PNG and a
caption of 8-16 words each, as img2dataset lays them out) and the word-level
``tokenizer.json`` of the captions' words.

  * ``memory``: for each size (``--examples`` N and ``--scale`` x N), a fresh process opens
    the shards as a contrastive run's data (``config.dataset = 'wds:ROOT'``: the whole
    split is indexed then) and reads ``--steps`` train batches of ``--batch`` (their
    images and captions read and tokenised); its peak resident memory (``ru_maxrss``)
    after the first batch and after the last is printed. ``--code=DIR`` runs the same
    children on another checkout of the package (e.g. ``git archive main | tar -x -C
    /tmp/main``), for a before/after table.

      python benchmarks/caption_data.py memory [--examples 20000] [--scale 10] \
        [--batch 256] [--steps 40] [--code /tmp/main]

  * ``cost``: microseconds per example, in one process, alternating in each of
    ``--rounds`` rounds: tokenising a batch of ``--batch`` captions (the run's tokenizer,
    and a SentencePiece unigram model trained on the captions), reading images and
    captions from the shards (`tar_shards`), and the whole train pipeline (read, decode,
    crop, tokenise, batch, decoded in this process's threads; wall time over all cores and
    its process CPU time).

      python benchmarks/caption_data.py cost [--examples 20000] [--batch 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.argv[1:2] != ["child"]:  # a child imports the checkout its PYTHONPATH names
  sys.path.insert(0, REPO)

PER_SHARD = 1000
WORDS = (
  "a photo of the small large red blue green dog cat bird car tree house person on in "
  "with near under old new two three city river beach street night morning"
).split()


def caption(k: int) -> str:
  rng = np.random.default_rng(k)
  return " ".join(rng.choice(WORDS, rng.integers(8, 17)))


def write_shards(root: str, n: int) -> None:
  """``n`` examples in shards of `PER_SHARD` under ``root``; one PNG's bytes for all."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  out = io.BytesIO()
  Image.new("RGB", (8, 8), (90, 120, 30)).save(out, format="PNG")
  png = out.getvalue()
  os.makedirs(root, exist_ok=True)
  for shard in range(0, n, PER_SHARD):
    with tarfile.open(os.path.join(root, f"{shard // PER_SHARD:05d}.tar"), "w") as tar:
      for k in range(shard, min(shard + PER_SHARD, n)):
        for name, payload in ((f"{k:09d}.png", png), (f"{k:09d}.txt", caption(k).encode())):
          info = tarfile.TarInfo(name)
          info.size = len(payload)
          tar.addfile(info, io.BytesIO(payload))


def write_tokenizer(folder: str) -> str:
  from vit_jax.data import captions  # pylint: disable=g-import-not-at-top

  path = os.path.join(folder, "tokenizer.json")
  captions.CaptionTokenizer([" ".join(WORDS)]).save(path)
  return path


def run_config(root: str, tokenizer: str, batch: int):
  """A tiny contrastive run's config over the shards in ``root``."""
  from configs import siglip  # pylint: disable=g-import-not-at-top
  from vit_jax import models  # pylint: disable=g-import-not-at-top

  config = siglip.get_config("digits")
  text = dict(width=16, depth=1, mlp_dim=32, num_heads=2, vocab_size=64, pool="gap")
  config.model = models.two_tower_config(
    models.get_model_config("testing"), text=text, text_len=16, embed_dim=16
  )
  config.update(dict(dataset=f"wds:{root}", train_split="train", test_split="train"))
  config.update(dict(batch=batch, batch_eval=batch, shuffle_buffer=batch))
  config.pp.crop, config.pp.min_area, config.pp.flip = 8, 1.0, False
  config.text.tokenizer = tokenizer
  return config


def max_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child(root: str, tokenizer: str, batch: int, steps: int) -> None:
  """``steps`` train batches over ``root``: prints {examples, rss_open, rss_end, s}."""
  from vit_jax import data  # pylint: disable=g-import-not-at-top
  from vit_jax.data import dataset  # pylint: disable=g-import-not-at-top
  from vit_jax.infra import sharding  # pylint: disable=g-import-not-at-top
  from vit_jax.run import objectives  # pylint: disable=g-import-not-at-top

  start = time.perf_counter()
  settings = objectives.data_settings(run_config(root, tokenizer, batch))
  mesh = sharding.make_mesh((("data", -1), ("model", 1)))
  batches = data.train_iterator(settings, mesh)
  first = next(batches)  # the index is built, the first block read
  rss_open = max_rss_mb()
  n = dataset.Dataset(settings).split("train").num_examples
  for _ in range(steps - 1):
    first = next(batches)
  first["text"].block_until_ready()
  print(
    json.dumps(
      dict(
        examples=n,
        rss_open=rss_open,
        rss_end=max_rss_mb(),
        seconds=time.perf_counter() - start,
      )
    )
  )
  os._exit(0)  # the pipeline's threads end with the process


def memory(args: argparse.Namespace, work: str) -> None:
  tokenizer = write_tokenizer(work)
  sizes = (args.examples, args.examples * args.scale)
  for n in sizes:
    write_shards(os.path.join(work, str(n)), n)
  codes = [("this checkout", REPO)]
  if args.code:
    codes.append((args.code, os.path.abspath(args.code)))
  print("| code | examples | peak RSS after the first batch (MB) | after the last (MB) | s |")
  print("|---|---|---|---|---|")
  for name, code in codes:
    for n in sizes:
      env = dict(os.environ, PYTHONPATH=code, TF_CPP_MIN_LOG_LEVEL="3")
      command = [sys.executable, os.path.abspath(__file__), "child", os.path.join(work, str(n))]
      command += [tokenizer, str(args.batch), str(args.steps)]
      out = subprocess.run(command, env=env, cwd=code, capture_output=True, text=True)
      if out.returncode:
        raise SystemExit(out.stderr[-3000:])
      row = json.loads(out.stdout.strip().splitlines()[-1])
      print(
        f"| {name} | {row['examples']:,} | {row['rss_open']:.0f} | {row['rss_end']:.0f} "
        f"| {row['seconds']:.0f} |"
      )


def cost(args: argparse.Namespace, work: str) -> None:
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  from vit_jax import data  # pylint: disable=g-import-not-at-top
  from vit_jax.data import dataset as dataset_lib  # pylint: disable=g-import-not-at-top
  from vit_jax.data import free_text, tar_shards  # pylint: disable=g-import-not-at-top
  from vit_jax.infra import sharding  # pylint: disable=g-import-not-at-top
  from vit_jax.run import objectives  # pylint: disable=g-import-not-at-top

  root = os.path.join(work, "shards")
  write_shards(root, args.examples)
  texts = [caption(k) for k in range(args.examples)]
  with open(os.path.join(work, "captions.txt"), "w") as f:
    f.write("\n".join(texts))
  spm.SentencePieceTrainer.train(
    input=os.path.join(work, "captions.txt"),
    model_prefix=os.path.join(work, "spiece"),
    vocab_size=48,
    minloglevel=2,
    model_type="unigram",
  )
  config = run_config(root, write_tokenizer(work), args.batch)
  config.decode_processes = 0  # decoded in this process: its CPU time holds the decode
  settings = objectives.data_settings(config)
  dataset = dataset_lib.Dataset(settings)
  spiece = free_text.load_tokenizer(os.path.join(work, "spiece.model"), "sticky")
  batch = np.array([t.encode() for t in texts[: args.batch]], object)
  index = tar_shards.TarShards(root).index("train")
  mesh = sharding.make_mesh((("data", -1), ("model", 1)))
  steps = 20

  def tokenize_words():
    dataset.tokenize(batch)
    return args.batch

  def tokenize_spiece():
    spiece.encode([t.decode() for t in batch], 16)
    return args.batch

  def read_shards():
    index.rows(0, 4 * args.batch)
    return 4 * args.batch

  def pipeline():
    batches = data.train_iterator(settings, mesh)
    next(batches)  # the first block: started, not timed
    start = time.process_time()
    wall = time.perf_counter()
    for _ in range(steps):
      next(batches)["text"].block_until_ready()
    pipeline.cpu = (time.process_time() - start) / (steps * args.batch)
    del batches
    return steps * args.batch, time.perf_counter() - wall

  rows = {
    "tokenise, word-level tokenizer.json (1 thread)": tokenize_words,
    "tokenise, SentencePiece unigram (1 thread)": tokenize_spiece,
    "read image + caption from the shards (1 thread)": read_shards,
    "whole train pipeline, wall (all cores)": pipeline,
  }
  times: dict[str, list[float]] = {k: [] for k in rows}
  cpu: list[float] = []
  for _ in range(args.rounds):
    for name, fn in rows.items():
      start = time.perf_counter()
      out = fn()
      if isinstance(out, tuple):
        times[name].append(out[1] / out[0])
        cpu.append(pipeline.cpu)
      else:
        times[name].append((time.perf_counter() - start) / out)
  print(f"| stage | µs per example (median of {args.rounds}) |")
  print("|---|---|")
  for name, values in times.items():
    print(f"| {name} | {1e6 * float(np.median(values)):.1f} |")
  print(f"| whole train pipeline, process CPU time | {1e6 * float(np.median(cpu)):.1f} |")


def main() -> None:
  if sys.argv[1] == "child":
    child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("mode", choices=("memory", "cost"))
  parser.add_argument("--examples", type=int, default=20000)
  parser.add_argument("--scale", type=int, default=10)
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=40, help="train batches read (memory)")
  parser.add_argument("--code", default=None, help="another checkout to compare (memory)")
  args = parser.parse_args()
  work = tempfile.mkdtemp(prefix="caption_data_")
  try:
    (memory if args.mode == "memory" else cost)(args, work)
  finally:
    shutil.rmtree(work)
  os._exit(0)  # the train pipelines' threads end with the process


if __name__ == "__main__":
  main()
