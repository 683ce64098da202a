"""Hostile and clumsy input against every command: one `Error:` line, exit 2, nothing
written, bounded time and memory.

The cases run in two bounded subprocesses at the same time (`tests/hostile_runner.py`:
each command's `main(argv)` in turn, an alarm per case, the process under an
address-space limit and a timeout): the FIFO and device-file cases in one, everything else
in the other, so that a regression that hangs shows in its own group. The inputs are built once
in one folder, which every case must leave exactly as it found it.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib
from typing import Callable

import numpy as np
import pytest
from PIL import Image

from tests import fresh_python, image_bombs
from tests import interop_fixtures as fx
from tests.finished_run import copy_run, tiny_flags
from tests.test_expressible import write_checkpoint

pytest_plugins = ["tests.finished_run"]  # the finished_run fixture
# The subprocesses' address-space limit is set between fork and exec (preexec_fn).
pytestmark = pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")

ADDRESS_SPACE_BYTES = 6 * 2**30  # JAX and TensorFlow reserve about 3 GiB of it at import
GROUP_SECONDS = 900  # a whole group, imports included (well under a minute when idle)

PREDICT, EXPORT, CONVERT, FEWSHOT, MAIN, PLAN = (
  f"vit_jax.{m}" for m in ("predict", "export", "convert", "fewshot", "main", "plan.cli")
)
M = "--checkpoint={tmp}/m.npz"  # a ViT-Ti/16 (2 layers) with 5 classes, at 32x32
IMG = "{tmp}/image.png"
TO_NPZ = ("--format=npz", "--out={tmp}/o")  # export's output, never written
TINY = "{tiny}"  # the tiny run's flags (tests/finished_run.py), with a fresh workdir

# timm checkpoints whose config.json names a model this package does not compute, or one
# it computes but whose arrays (a small rotary ViT's) do not fit it:
# {case: (architecture, fragment of the error)}.
TIMM_REFUSED = {
  "dinov3": ("vit_small_patch16_dinov3", "does not fit the timm Eva its config names"),
  "eva02": ("eva02_base_patch14_224", "does not fit the timm Eva its config names"),
  "pe": ("vit_pe_core_base_patch16_224", "this is not a timm Eva state dict"),
  "sapiens": ("vit_base_patch16_sapiens2", "(timm eva.py) has attn_only_layer_scale=True"),
  "rope": ("vit_base_patch16_rope_reg1_gap_256", "does not fit the timm Eva its config names"),
  "naflex": ("naflexvit_base_patch16_map", "(timm naflexvit.py) has"),
}

# (id, command, arguments, fragment of the one Error: line). `{tmp}` is the inputs'
# folder (`_inputs`), `{digits}` the tfds data_dir of the built-in digits dataset.
CASES = [
  # predict: images.
  ("predict text as image", PREDICT, [M, "{tmp}/text.jpg"], "text.jpg"),
  ("predict empty image", PREDICT, [M, "{tmp}/empty.jpg"], "empty.jpg"),
  ("predict 20000x20000 png", PREDICT, [M, "{tmp}/big.png"], "big.png (its PNG header claims"),
  ("predict gif frame 30000x30000", PREDICT, [M, "{tmp}/frame.gif"], "frame.gif (its GIF header"),
  ("predict animated webp", PREDICT, [M, "{tmp}/anim.webp"], "anim.webp (an animated WebP"),
  ("predict jpeg xl", PREDICT, [M, "{tmp}/jxl.jpg"], "jxl.jpg (a JPEG XL image"),
  ("predict huge image file", PREDICT, [M, "{tmp}/huge.jpg"], "huge.jpg"),
  ("predict only bad files", PREDICT, [M, "{tmp}/bad_images"], "bad_images"),
  ("predict newline in name", PREDICT, [M, "{tmp}/a\nError: forged.png"], "forged.png"),
  ("predict link loop", PREDICT, [M, "{tmp}/loop.jpg"], "loop.jpg"),
  # predict: flags.
  ("predict batch 0", PREDICT, [M, "--batch=0", IMG], "--batch=0"),
  ("predict batch -3", PREDICT, [M, "--batch=-3", IMG], "--batch=-3"),
  ("predict batch huge", PREDICT, [M, "--batch=100000000", IMG], "--batch=100000000"),
  ("predict top_k 0", PREDICT, [M, "--top_k=0", IMG], "--top_k=0"),
  ("predict top_k -1", PREDICT, [M, "--top_k=-1", IMG], "--top_k=-1"),
  ("predict top_k > classes", PREDICT, [M, "--top_k=6", IMG], "--top_k=6"),
  ("predict top_k text", PREDICT, [M, "--top_k=abc", IMG], "--top_k"),
  ("predict resolution 0", PREDICT, [M, "--resolution=0", IMG], "--resolution=0"),
  ("predict resolution -32", PREDICT, [M, "--resolution=-32", IMG], "--resolution=-32"),
  ("predict labels huge", PREDICT, [M, "--labels={tmp}/huge.txt", IMG], "huge.txt"),
  ("predict labels latin-1", PREDICT, [M, "--labels={tmp}/latin1.txt", IMG], "latin1.txt"),
  ("predict labels folder", PREDICT, [M, "--labels={tmp}/bad_images", IMG], "bad_images"),
  # predict: checkpoints and run folders.
  ("predict run json broken", PREDICT, ["--checkpoint={tmp}/run_broken", IMG], "run_broken"),
  ("predict run json list", PREDICT, ["--checkpoint={tmp}/run_list", IMG], "run_list"),
  ("predict run json huge", PREDICT, ["--checkpoint={tmp}/run_huge", IMG], "run_huge"),
  ("predict run json types", PREDICT, ["--checkpoint={tmp}/run_types", IMG], "run_types"),
  ("predict run json binary", PREDICT, ["--checkpoint={tmp}/run_binary", IMG], "run_binary"),
  ("predict hf json types", PREDICT, ["--checkpoint={tmp}/hf_types", IMG], "hf_types"),
  ("predict npz huge", PREDICT, ["--checkpoint={tmp}/huge.npz", IMG], "huge.npz"),
  # predict, export, convert: checkpoints of models this package does not compute.
  *[
    (f"predict timm {name}", PREDICT, [f"--checkpoint={{tmp}}/timm_{name}", IMG], fragment)
    for name, (_, fragment) in TIMM_REFUSED.items()
  ],
  ("predict timm never seen", PREDICT, ["--checkpoint={tmp}/timm_swin", IMG], "'swin_tiny"),
  ("predict hf dinov3", PREDICT, ["--checkpoint={tmp}/hf_dinov3", IMG], "model_type 'dinov3_vit'"),
  ("export timm pe", EXPORT, ["--checkpoint={tmp}/timm_pe", *TO_NPZ], TIMM_REFUSED["pe"][1]),
  (
    "convert timm eva02 file",
    CONVERT,
    ["{tmp}/timm_eva02/model.safetensors", "--out={tmp}/c.npz"],
    TIMM_REFUSED["eva02"][1],
  ),
  # export.
  ("export out a file", EXPORT, [M, "--format=npz", "--out={tmp}/text.jpg"], "text.jpg"),
  (
    "export labels huge",
    EXPORT,
    [M, *TO_NPZ, "--labels={tmp}/huge.txt"],
    "huge.txt",
  ),
  (
    "export labels latin-1",
    EXPORT,
    [M, *TO_NPZ, "--labels={tmp}/latin1.txt"],
    "latin1.txt",
  ),
  (
    "export run json broken",
    EXPORT,
    ["--checkpoint={tmp}/run_broken", *TO_NPZ],
    "run_broken",
  ),
  (
    "export run json types",
    EXPORT,
    ["--checkpoint={tmp}/run_types", *TO_NPZ],
    "run_types",
  ),
  (
    "export resolution -1",
    EXPORT,
    [M, *TO_NPZ, "--resolution=-1"],
    "--resolution=-1",
  ),
  ("export out empty", EXPORT, [M, "--format=npz", "--out="], "--out"),
  # convert.
  ("convert out exists", CONVERT, ["{tmp}/m.npz", "--out={tmp}/text.jpg"], "text.jpg"),
  ("convert out a folder", CONVERT, ["{tmp}/m.npz", "--out={tmp}/bad_images"], "bad_images"),
  (
    "convert out under a file",
    CONVERT,
    ["{tmp}/m.npz", "--out={tmp}/text.jpg/x.npz"],
    "text.jpg/x.npz",
  ),
  ("convert out in /proc", CONVERT, ["{tmp}/m.npz", "--out=/proc/vit_jax.npz"], "/proc/vit_jax"),
  ("convert out empty", CONVERT, ["{tmp}/m.npz", "--out="], "--out"),
  (
    "convert two sources",
    CONVERT,
    ["{tmp}/m.npz", "{tmp}/m.npz", "--out={tmp}/c.npz"],
    "Name one source",
  ),
  ("convert run json broken", CONVERT, ["{tmp}/run_broken", "--out={tmp}/c.npz"], "run_broken"),
  ("convert run json types", CONVERT, ["{tmp}/run_types", "--out={tmp}/c.npz"], "run_types"),
  ("convert text as npz", CONVERT, ["{tmp}/text.jpg", "--out={tmp}/c.npz"], "text.jpg"),
  # fewshot.
  ("fewshot shots text", FEWSHOT, [M, "--shots=abc"], "--shots=abc"),
  ("fewshot shots 0", FEWSHOT, [M, "--shots=0"], "--shots=0"),
  ("fewshot shots -5", FEWSHOT, [M, "--shots=1,-5"], "--shots=1,-5"),
  ("fewshot seeds 0", FEWSHOT, [M, "--seeds=0"], "--seeds=0"),
  ("fewshot batch 0", FEWSHOT, [M, "--batch=0"], "--batch=0"),
  ("fewshot batch -1", FEWSHOT, [M, "--batch=-1"], "--batch=-1"),
  ("fewshot l2_reg nan", FEWSHOT, [M, "--l2_reg=nan"], "--l2_reg=nan"),
  ("fewshot crop -8", FEWSHOT, [M, "--crop=-8"], "--crop=-8"),
  ("fewshot data_dir a file", FEWSHOT, [M, "--data_dir={tmp}/text.jpg"], "text.jpg"),
  ("fewshot run json broken", FEWSHOT, ["--checkpoint={tmp}/run_broken"], "run_broken"),
  ("fewshot run json huge", FEWSHOT, ["--checkpoint={tmp}/run_huge"], "run_huge"),
  # main: settings that fail before anything is written.
  ("main lr nan", MAIN, [TINY, "--config.lr.base=nan"], "config.lr.base=nan"),
  ("main lr inf", MAIN, [TINY, "--config.lr.base=inf"], "config.lr.base=inf"),
  ("main lr negative", MAIN, [TINY, "--config.lr.base=-0.1"], "config.lr.base=-0.1"),
  ("main lr end nan", MAIN, [TINY, "--config.lr.end=nan"], "config.lr.end=nan"),
  ("main smoothing nan", MAIN, [TINY, "--config.label_smoothing=nan"], "label_smoothing=nan"),
  ("main split < batch", MAIN, [TINY, "--config.train_split=train[:8]"], "train[:8]"),
  ("main one class", MAIN, [TINY, "--config.dataset=folder:{tmp}/one_class"], "one_class"),
  ("main data_dir a file", MAIN, [TINY, "--config.data_dir={tmp}/text.jpg"], "text.jpg"),
  ("main gif frame 30000x30000", MAIN, [TINY, "--config.dataset=folder:{tmp}/gif_data"], "frame"),
  ("main dataset a file", MAIN, [TINY, "--config.dataset=folder:{tmp}/text.jpg"], "text.jpg"),
  ("main batch 0", MAIN, [TINY, "--config.batch=0"], "config.batch=0"),
  ("main batch -3", MAIN, [TINY, "--config.batch=-3"], "config.batch=-3"),
  ("main config raises", MAIN, [TINY, "--config={tmp}/raises.py"], "raises.py"),
  ("main config binary", MAIN, [TINY, "--config={tmp}/latin1.txt"], "latin1.txt"),
  ("main workdir json huge", MAIN, [TINY, "--workdir={tmp}/wd_huge"], "wd_huge/config.json"),
  ("main diverges unsaved", MAIN, [TINY, "--config.lr.base=1e30"], "Training diverged"),
  # plan.
  (
    "plan topology unknown",
    PLAN,
    ["--config=configs/quickstart.py", "--topology=bogus"],
    "--topology=bogus",
  ),
  ("plan topology v3-7", PLAN, ["--config=configs/quickstart.py", "--topology=v3-7"], "v3-7"),
  ("plan topology h100x0", PLAN, ["--config=configs/quickstart.py", "--topology=h100x0"], "h100x0"),
]

# Inputs that hang or grow without bound when opened: run in their own process.
BLOCKING_CASES = [
  ("predict fifo image", PREDICT, [M, "{tmp}/fifo.jpg"], "fifo.jpg"),
  ("predict dev zero", PREDICT, [M, "/dev/zero"], "/dev/zero"),
  ("predict link to dev zero", PREDICT, [M, "{tmp}/zero.jpg"], "zero.jpg"),
  ("predict folder of fifos", PREDICT, [M, "{tmp}/fifo_only"], "fifo_only"),
  ("predict labels fifo", PREDICT, [M, "--labels={tmp}/fifo.txt", IMG], "fifo.txt"),
  ("predict labels dev zero", PREDICT, [M, "--labels=/dev/zero", IMG], "/dev/zero"),
  ("predict checkpoint fifo", PREDICT, ["--checkpoint={tmp}/fifo.npz", IMG], "fifo.npz"),
  ("predict checkpoint dev zero", PREDICT, ["--checkpoint=/dev/zero", IMG], "/dev/zero"),
  ("predict run json fifo", PREDICT, ["--checkpoint={tmp}/run_fifo", IMG], "run_fifo"),
  (
    "export labels fifo",
    EXPORT,
    [M, *TO_NPZ, "--labels={tmp}/fifo.txt"],
    "fifo.txt",
  ),
  (
    "export checkpoint dev zero",
    EXPORT,
    ["--checkpoint=/dev/zero", *TO_NPZ],
    "/dev/zero",
  ),
  ("convert source fifo", CONVERT, ["{tmp}/fifo.npz", "--out={tmp}/c.npz"], "fifo.npz"),
  ("convert source dev zero", CONVERT, ["/dev/zero", "--out={tmp}/c.npz"], "/dev/zero"),
  ("fewshot checkpoint fifo", FEWSHOT, ["--checkpoint={tmp}/fifo.npz"], "fifo.npz"),
  ("main config fifo", MAIN, [TINY, "--config={tmp}/fifo.py"], "fifo.py"),
  ("main config dev zero", MAIN, [TINY, "--config=/dev/zero"], "/dev/zero"),
  ("main workdir json fifo", MAIN, [TINY, "--workdir={tmp}/wd_fifo"], "wd_fifo/config.json"),
]


# Legitimate input that once wrote, hung or printed forged lines: (id, command, arguments),
# checked by the tests below. In the process of CASES, then in that of BLOCKING_CASES.
# What they write goes to `{out}`, beside the watched folder `{tmp}`: the two processes
# run at once, and each reports every change under `{tmp}`.
LEGIT_CASES = [
  ("escaped names", PREDICT, [M, "--labels={tmp}/odd_labels.txt", "--top_k=5", "{tmp}/odd"]),
  ("run data_dir elsewhere", PREDICT, ["--checkpoint={tmp}/run_data_dir", IMG]),
  ("run huggingface dataset", PREDICT, ["--checkpoint={tmp}/run_hf", IMG]),
  ("run without class names", PREDICT, ["--checkpoint={tmp}/run_old", IMG]),
  ("export out with a glob", EXPORT, [M, "--format=npz", "--out={out}/exports/*"]),
  ("convert overwrite", CONVERT, ["{tmp}/m.npz", "--out={out}/old.npz", "--overwrite"]),
  ("predict gif of 4000 frames", PREDICT, [M, "{tmp}/bomb.gif"]),
]
TRAINED = "--workdir={out}/trained"  # the legitimate run's workdir
BOMBS = "--workdir={out}/bombs"  # the run over an image folder holding GIFs of 4000 frames
BOMB_FRAMES = 4000  # of 1024x1024: 4 GiB decoded whole, more than the address space left
LEGIT_BLOCKING_CASES = [
  ("mixed folder", PREDICT, [M, "--batch=2", "{tmp}/mixed"]),
  ("train beside a fifo", MAIN, [TINY, "--config.dataset=folder:{tmp}/fifo_data", TRAINED]),
  ("train beside gif bombs", MAIN, [TINY, "--config.dataset=folder:{tmp}/bomb_data", BOMBS]),
]
ODD_LABELS = ["a\tb", "c\x1b[2Jd", "e\rf", "g\x85h", "i"]
STALE = "{out}/exports/.victim.tmp-x"  # a stale temporary of another export


def _png(path: str, size: int = 32, seed: int = 0) -> None:
  pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
  Image.fromarray(pixels).save(path)


def _png_header_only(path: str, width: int, height: int) -> None:
  """A PNG that claims ``width`` x ``height`` RGB pixels in a few dozen bytes."""

  def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

  header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
  idat = zlib.compress(b"\0" * 64)
  with open(path, "wb") as f:
    f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat))
    f.write(chunk(b"IEND", b""))


def _sparse(path: str, size: int) -> None:
  with open(path, "wb") as f:
    f.truncate(size)


def _image_folder(root: str, extra: dict[str, Callable[[str], None]]) -> None:
  """``root``/{train,test}/{a..j}/ with 4 8x8 PNGs each, and ``extra`` {name: writer} in
  a/ and b/. Ten classes, as digits: a training over it (the tiny run's flags) runs the
  programs `finished_run` compiled, read from the session's compilation cache."""
  for split in ("train", "test"):
    for label in "abcdefghij":
      folder = os.path.join(root, split, label)
      os.makedirs(folder)
      for i in range(4):
        _png(os.path.join(folder, f"{i}.png"), 8, i)
      for name, write in extra.items() if label in "ab" else ():
        write(os.path.join(folder, name))


def _legit_inputs(tmp: str, finished_run: str) -> None:
  """The inputs of LEGIT_CASES: copies of a finished run whose config.json points
  elsewhere, odd names, a stale temporary, images beside FIFOs and devices."""
  for name, change in (
    ("run_data_dir", {"data_dir": os.path.join(tmp, "never_created")}),
    ("run_hf", {"dataset": "huggingface:mnist"}),
    ("run_old", {}),
  ):
    run = copy_run(finished_run, os.path.join(tmp, name))
    with open(os.path.join(run, "config.json")) as f:
      config = json.load(f)
    with open(os.path.join(run, "config.json"), "w") as f:
      json.dump({**config, **change}, f)
  os.remove(os.path.join(tmp, "run_old", "class_names.json"))
  with open(os.path.join(tmp, "odd_labels.txt"), "w") as f:
    f.write("\n".join(ODD_LABELS) + "\n")
  os.makedirs(os.path.join(tmp, "odd"))
  _png(os.path.join(tmp, "odd", "x\nError: forged.png"))
  _png(os.path.join(tmp, "odd", "y\x1b[2J.png"))
  stale = STALE.format(out=_out(tmp))
  os.makedirs(stale)
  hours_ago = os.path.getmtime(tmp) - 3 * 3600
  os.utime(stale, (hours_ago, hours_ago))
  shutil.copy(os.path.join(tmp, "text.jpg"), os.path.join(_out(tmp), "old.npz"))
  os.makedirs(os.path.join(tmp, "mixed"))
  _png(os.path.join(tmp, "mixed", "a.png"))
  os.mkfifo(os.path.join(tmp, "mixed", "b.jpg"))
  os.symlink("/dev/zero", os.path.join(tmp, "mixed", "c.jpg"))
  shutil.copy(os.path.join(tmp, "text.jpg"), os.path.join(tmp, "mixed", "d.jpg"))
  _png(os.path.join(tmp, "mixed", "e.png"), seed=1)
  _image_folder(os.path.join(tmp, "fifo_data"), {"fifo.png": os.mkfifo})
  bomb = os.path.join(tmp, "bomb.gif")
  image_bombs.gif_frames(bomb, BOMB_FRAMES)
  _image_folder(os.path.join(tmp, "bomb_data"), {"bomb.png": lambda p: shutil.copy(bomb, p)})


def _inputs(tmp: str) -> None:
  """The hostile inputs every case refers to (`{tmp}` in CASES)."""
  fx.write_npz(os.path.join(tmp, "m.npz"), "vit_ti16")
  _png(os.path.join(tmp, "image.png"))
  with open(os.path.join(tmp, "text.jpg"), "w") as f:
    f.write("not an image\n")
  open(os.path.join(tmp, "empty.jpg"), "wb").close()
  _png_header_only(os.path.join(tmp, "big.png"), 20000, 20000)
  image_bombs.gif_claiming(os.path.join(tmp, "frame.gif"), 30000, 30000)
  for name, (architecture, _) in TIMM_REFUSED.items():
    write_checkpoint(os.path.join(tmp, f"timm_{name}"), {"architecture": architecture})
  write_checkpoint(os.path.join(tmp, "timm_swin"), {"architecture": "swin_tiny_patch4_window7_224"})
  write_checkpoint(os.path.join(tmp, "hf_dinov3"), {"model_type": "dinov3_vit"})
  image_bombs.animated_webp(os.path.join(tmp, "anim.webp"))
  image_bombs.jpeg_xl(os.path.join(tmp, "jxl.jpg"))
  _image_folder(
    os.path.join(tmp, "gif_data"),
    {"frame.png": lambda p: image_bombs.gif_claiming(p, 30000, 30000)},
  )
  _sparse(os.path.join(tmp, "huge.jpg"), 3 * 2**30)
  _sparse(os.path.join(tmp, "huge.txt"), 2**30)
  _sparse(os.path.join(tmp, "huge.npz"), 3 * 2**30)
  with open(os.path.join(tmp, "latin1.txt"), "wb") as f:
    f.write(b"caf\xe9\n" * 5)
  os.symlink("loop.jpg", os.path.join(tmp, "loop.jpg"))
  os.symlink("/dev/zero", os.path.join(tmp, "zero.jpg"))
  for name in ("fifo.jpg", "fifo.txt", "fifo.npz", "fifo.py"):
    os.mkfifo(os.path.join(tmp, name))
  os.makedirs(os.path.join(tmp, "bad_images"))
  shutil.copy(os.path.join(tmp, "text.jpg"), os.path.join(tmp, "bad_images", "a.jpg"))
  open(os.path.join(tmp, "bad_images", "b.png"), "wb").close()
  os.makedirs(os.path.join(tmp, "fifo_only"))
  os.mkfifo(os.path.join(tmp, "fifo_only", "f.jpg"))
  runs = {
    "run_broken": b"{",
    "run_list": b"[]",
    "run_types": json.dumps({"model": 3, "pp": "crop"}).encode(),
    "run_binary": b"\xff\xfe\x00",
  }
  for name, content in runs.items():
    os.makedirs(os.path.join(tmp, name, "checkpoints"))
    with open(os.path.join(tmp, name, "config.json"), "wb") as f:
      f.write(content)
  os.makedirs(os.path.join(tmp, "run_huge", "checkpoints"))
  _sparse(os.path.join(tmp, "run_huge", "config.json"), 2 * 2**30)
  os.makedirs(os.path.join(tmp, "run_fifo", "checkpoints"))
  os.mkfifo(os.path.join(tmp, "run_fifo", "config.json"))
  os.makedirs(os.path.join(tmp, "hf_types"))
  with open(os.path.join(tmp, "hf_types", "config.json"), "w") as f:
    json.dump({"model_type": "vit", "hidden_size": "large", "architectures": ["ViTModel"]}, f)
  open(os.path.join(tmp, "hf_types", "model.safetensors"), "wb").close()
  for split in ("train", "test"):
    os.makedirs(os.path.join(tmp, "one_class", split, "only"))
    for i in range(16):
      _png(os.path.join(tmp, "one_class", split, "only", f"{i}.png"), 8, i)
  with open(os.path.join(tmp, "raises.py"), "w") as f:
    f.write("def get_config():\n  raise RuntimeError('a config file that raises')\n")
  os.makedirs(os.path.join(tmp, "workdirs"))  # each main case's fresh workdir goes in it
  os.makedirs(os.path.join(tmp, "wd_huge"))
  _sparse(os.path.join(tmp, "wd_huge", "config.json"), 2 * 2**30)
  os.makedirs(os.path.join(tmp, "wd_fifo"))
  os.mkfifo(os.path.join(tmp, "wd_fifo", "config.json"))


def _argv(case: tuple, tmp: str, digits: str) -> list[str]:
  """The command line of a case: `{tiny}` expands to the tiny run's flags with a fresh
  workdir, which a later --workdir or --config replaces."""
  case_id, module, args, _ = case
  argv = []
  for arg in args:
    if arg == TINY:
      workdir = os.path.join(tmp, "workdirs", case_id.replace(" ", "_"))
      argv += [*tiny_flags(digits), f"--workdir={workdir}"]
    else:
      argv.append(arg.format(tmp=tmp, out=_out(tmp)))
  for flag in ("--workdir=", "--config="):
    given = [a for a in argv if a.startswith(flag)]
    if len(given) > 1:  # the case's own value replaces the tiny run's
      argv = [a for a in argv if not a.startswith(flag) or a == given[-1]]
  return [module.rsplit(".", 1)[-1], *argv]


def _limit_address_space() -> None:
  resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))


def bounded_python(module: str, *args: str) -> subprocess.Popen:
  """``python -m module args`` from the repository, under the address-space limit; its
  stderr piped as text."""
  return subprocess.Popen(
    [sys.executable, "-m", module, *args],
    cwd=fresh_python.REPO,
    env=fresh_python.clean_env(),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
    preexec_fn=_limit_address_space,
  )


def run_cases(groups: list[list[tuple]], tmp: str, digits: str, work: str) -> dict[str, dict]:
  """Every case's result (`tests/hostile_runner.py`), a bounded subprocess per group, the
  groups at the same time."""
  running = []
  for i, cases in enumerate(groups):
    cases_path, results_path = (os.path.join(work, f"{name}{i}.json") for name in ("cases", "out"))
    with open(cases_path, "w") as f:
      json.dump([[c[0], c[1], _argv(c, tmp, digits)] for c in cases], f)
    proc = bounded_python("tests.hostile_runner", cases_path, results_path, tmp)
    running.append((proc, results_path))
  results = {}
  for proc, results_path in running:
    try:
      _, err = proc.communicate(timeout=GROUP_SECONDS)
    finally:
      proc.kill()
    assert proc.returncode == 0, err[-3000:]
    with open(results_path) as f:
      results.update(json.load(f))
  return results


def _out(tmp: str) -> str:
  return tmp + "_out"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, digits_dir, finished_run) -> tuple[str, dict[str, dict]]:
  """(the inputs' folder, every case's result)."""
  tmp = str(tmp_path_factory.mktemp("hostile"))
  work = str(tmp_path_factory.mktemp("hostile_work"))
  _inputs(tmp)
  os.makedirs(_out(tmp))
  _legit_inputs(tmp, finished_run)
  # The digits dataset is built once, outside the watched folder, before the cases run.
  from tests.finished_run import tiny_run_config  # pylint: disable=g-import-not-at-top
  from vit_jax import data  # pylint: disable=g-import-not-at-top

  data.dataset_info(tiny_run_config(digits_dir))
  groups = [CASES + _legit(LEGIT_CASES), BLOCKING_CASES + _legit(LEGIT_BLOCKING_CASES)]
  results = run_cases(groups, tmp, digits_dir, work)
  return tmp, results


def _legit(cases: list[tuple]) -> list[tuple]:
  return [(*case, None) for case in cases]


def test_the_table_has_at_least_100_distinct_inputs():
  ids = [c[0] for c in CASES + BLOCKING_CASES]
  assert len(ids) >= 100 and len(set(ids)) == len(ids)


@pytest.mark.parametrize("case", CASES + BLOCKING_CASES, ids=[c[0] for c in CASES + BLOCKING_CASES])
def test_hostile_input_is_one_line_exit_2_and_writes_nothing(case, hostile):
  tmp, results = hostile
  result = results[case[0]]
  errors = [line for line in result["err"].splitlines() if line.startswith("Error:")]
  fragment = case[3].format(tmp=tmp)
  assert result["status"] == 2, (result["status"], result["err"][-2000:])
  assert len(errors) == 1 and fragment in errors[0], result["err"][-2000:]
  assert "Traceback" not in result["err"]
  assert not result["changed"]


def _ok(result: dict) -> str:
  assert result["status"] == 0, (result["status"], result["err"][-2000:])
  assert "Traceback" not in result["err"] and "Error:" not in result["err"]
  return result["out"]


def test_names_and_labels_are_printed_escaped(hostile):
  tmp, results = hostile
  lines = _ok(results["escaped names"]).splitlines()
  assert len(lines) == 2 and not any(line.startswith("Error") for line in lines)
  assert lines[0].startswith(f"{tmp}/odd/x\\nError: forged.png\t")
  assert lines[1].startswith(f"{tmp}/odd/y\\x1b[2J.png\t")
  labels = [pair.rsplit(":", 1)[0] for pair in lines[0].split("\t")[1].split(" ")]
  assert sorted(labels) == sorted(label.encode("unicode_escape").decode() for label in ODD_LABELS)


@pytest.mark.parametrize("case", ["run data_dir elsewhere", "run huggingface dataset"])
def test_a_run_folder_config_makes_predict_neither_write_nor_fetch(case, hostile):
  tmp, results = hostile
  lines = _ok(results[case]).splitlines()
  with open(os.path.join(tmp, "run_hf", "class_names.json")) as f:
    names = json.load(f)
  assert len(lines) == 1 and lines[0].split("\t")[1].split(":")[0] in names
  assert not results[case]["changed"]  # no never_created/, no tfds download folder


def test_a_run_that_saved_no_class_names_prints_indices_with_a_warning(hostile):
  _, results = hostile
  result = results["run without class names"]
  assert _ok(result).split("\t")[1].split(":")[0].isdigit()
  assert "saved no class names" in result["err"] and not result["changed"]


def test_export_removes_no_stale_folder_its_out_does_not_name(hostile):
  tmp, results = hostile
  result = results["export out with a glob"]
  _ok(result)
  assert os.path.isdir(STALE.format(out=_out(tmp)))
  assert os.path.isfile(f"{_out(tmp)}/exports/*/model.npz")


def test_convert_replaces_an_existing_file_only_when_told(hostile):
  tmp, results = hostile
  _ok(results["convert overwrite"])
  with open(os.path.join(_out(tmp), "old.npz"), "rb") as f:
    assert f.read(2) == b"PK"  # now an .npz (a zip); without --overwrite: "convert out exists"


def test_predict_prints_the_good_images_and_warns_once_for_the_rest(hostile):
  tmp, results = hostile
  result = results["mixed folder"]
  lines = _ok(result).splitlines()
  assert [line.split("\t")[0] for line in lines] == [f"{tmp}/mixed/a.png", f"{tmp}/mixed/e.png"]
  warnings = [line for line in result["err"].splitlines() if "Skipped" in line]
  assert len(warnings) == 1 and "Skipped 3 of 5 files" in warnings[0]
  for name, why in (("b.jpg", "FIFO"), ("c.jpg", "character device"), ("d.jpg", "not a JPEG")):
    assert f"mixed/{name} (a {why}" in warnings[0] or f"mixed/{name} ({why}" in warnings[0]


def test_training_skips_a_fifo_in_an_image_folder_and_leaves_no_lock(hostile):
  tmp, results = hostile
  result = results["train beside a fifo"]
  _ok(result)
  assert "Skipping 1 files of" in result["err"] and "fifo.png (a FIFO" in result["err"]
  workdir = os.path.join(_out(tmp), "trained")
  assert os.path.exists(os.path.join(workdir, "config.json"))
  assert not os.path.exists(os.path.join(workdir, "run.lock"))


def test_predict_reads_the_first_frame_of_a_gif_of_thousands(hostile):
  tmp, results = hostile
  lines = _ok(results["predict gif of 4000 frames"]).splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"{tmp}/bomb.gif\t")


def test_training_decodes_the_first_frame_of_gifs_of_thousands(hostile):
  tmp, results = hostile
  _ok(results["train beside gif bombs"])
  assert os.path.isdir(os.path.join(_out(tmp), "bombs", "checkpoints", "6"))


def test_ctrl_c_during_start_up_leaves_a_fresh_workdir_absent(tmp_path, digits_dir):
  """SIGINT as soon as the run takes its folder (the lock), before its first save."""
  workdir = tmp_path / "run"
  proc = bounded_python("vit_jax.main", *tiny_flags(digits_dir), f"--workdir={workdir}")
  deadline = time.monotonic() + GROUP_SECONDS
  while not workdir.exists() and proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.002)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=GROUP_SECONDS)
  assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
  assert "Traceback" not in err
  assert not workdir.exists()
