"""The README as a test: every fenced bash, sh and python block of README.md is run or
checked under the install it names.

Each command of a shell block is one of:

* ``pip install``: the extras it names exist in setup.py, and a jax pin is setup.py's;
* ``python -m vit_jax.<command>``: run, in order, in one fresh process per install
  (`tests.core_install`: the core install, or ``.[text]`` where the block installs it),
  with `/tmp/` in a test folder, offline (``HF_HUB_OFFLINE=1``), and training shortened:
  the quickstart by the README's own smoke-test overrides, the others by the tests' tiny
  loop, a plain ViT's config also by the tiny run's model (the runs besides the
  quickstart's, a compile each, are marked ``slow``). A command on a ``gs://`` bucket is
  not run (tests/test_bucket_*.py run them on a local server), only checked marked. One
  that needs the network, a TPU or GPU, or data of the user's (`NEEDS`) must
  say so in its block (`_marks`: a comment, or the sentence that introduces the block) and
  ends in the README's promise for a mistake: one ``Error:`` line, exit status 2; every
  other exits 0;
* a template (``<file>``, ``[--json]``), the suite's own tools (ruff, pytest) or another
  program (gcloud, git, srun, hf): not run; the template's command exists, the tools are
  in the ``test`` extra, and another program's block is marked.

The python blocks (From Python) run in order under the core install on a model saved by
this package in timm's format as ``timm_vit`` (tests/test_model_face.py runs them against
timm itself), then the save line's every other format (SavedModel: the error naming the
``tf`` extra). The README's example terminal lines have the shape of the quickstart's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
from typing import Optional

import numpy as np
import pytest
from PIL import Image

import vit_jax
from tests import core_install, finished_run, fresh_python, train_fixtures
from tests.core_install import setup_requirements

README = os.path.join(fresh_python.REPO, "README.md")
# What a command needs that a test machine has not: the network (hub and official names,
# tfds datasets to download, buckets), a TPU or GPU compiler, the user's own files.
NEEDS = re.compile(
  r"hf-hub:|ViT-B_16|imagenet|cifar10|gs://|path/to|--topology=|photo\.jpg|cat\.jpg"
)
NETWORK_MARK = re.compile(r"\bonline\b")
HARDWARE_MARK = re.compile(r"\b(?:TPUs?|GPUs?)\b")
TEMPLATE = re.compile(r"<[a-z]+>|\[--")
TOOLS = {"ruff": "ruff", "python -m pytest": "pytest"}
# The README's smoke test of the quickstart; the tests' tiny loop; the tiny run's model
# (`tests.finished_run`) for the configs of a plain ViT: a second of compiling, not tens.
SMOKE = ("--config.total_steps=50", "--config.lr.warmup_steps=10")
TINY = tuple(f"--config.{k}={v}" for k, v in train_fixtures.TINY.items())
TINY_MODEL = tuple(f"--config.{k}={v}" for k, v in finished_run.TINY.items() if "model." in k)
PLAIN_VIT_CONFIGS = ("configs/quickstart.py", "configs/mpp.py")


@dataclasses.dataclass(frozen=True)
class Block:
  lang: str
  section: str
  line: int
  text: str
  intro: str  # the paragraph just above the fence


@dataclasses.dataclass(frozen=True)
class Command:
  text: str  # continuations joined, its comment removed
  block: Block


def blocks() -> list[Block]:
  text = open(README).read()
  found = []
  for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
    before = text[: m.start()]
    section = re.findall(r"^## (.+)$", before, re.M)[-1] if "\n## " in before else ""
    intro = before.rstrip("\n").split("\n\n")[-1]
    found.append(Block(m.group(1), section, before.count("\n") + 1, m.group(2), intro))
  return found


def commands(block: Block) -> list[Command]:
  """The shell commands of ``block``: continuation lines joined, comments dropped; a flag
  line after a complete command (an alternative value, as in Fine-tune) is its own."""
  out, pending = [], ""
  for raw in block.text.splitlines():
    line = raw.split("  #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
    if not line:
      continue
    pending = f"{pending} {line.strip()}" if pending else line.strip()
    if pending.endswith("\\"):
      pending = pending[:-1].rstrip()
      continue
    out.append(Command(pending, block))
    pending = ""
  return out


def _marks(block: Block) -> set[str]:
  comments = " ".join(part.split("#", 1)[1] for part in block.text.splitlines() if "#" in part)
  said = f"{comments} {block.intro}"
  return {
    m for m, rx in (("network", NETWORK_MARK), ("hardware", HARDWARE_MARK)) if rx.search(said)
  }


def kind(command: Command) -> str:
  text = command.text
  if text.startswith("pip install"):
    return "pip"
  if any(text.startswith(t) for t in TOOLS):
    return "tool"
  if text.startswith("python -m vit_jax") and TEMPLATE.search(text):
    return "template"
  if text.startswith("python -m vit_jax") and "gs://" in text:
    return "bucket"  # a real bucket: not reached from a test (tests/test_bucket_*.py use a server)
  if text.startswith("python -m vit_jax"):
    return "run"
  if text.startswith("--config."):
    return "flag"
  return "other"


def _shell_blocks() -> list[Block]:
  return [b for b in blocks() if b.lang in ("bash", "sh")]


def _all_commands() -> list[Command]:
  return [c for b in _shell_blocks() for c in commands(b)]


def _text_install(command: Command) -> bool:
  """Whether the command's block installs the ``text`` extra (``pip install -e ".[text]"``):
  the one extra these tests install; a block naming another (tpu, gpu-plan) runs on the
  core install, where its commands must end in the error naming that extra."""
  installs = re.findall(r'pip install -e "\.\[([a-z,-]+)\]"', command.block.text)
  return any("text" in named.split(",") for named in installs)


def test_every_block_is_run_checked_or_marked():
  """Counts what the other tests do with each block. A command this suite does not run
  (another program, a bucket) or one that needs what a test machine lacks (a placeholder
  path of the user's aside) must be in a block that says so: that fails here."""
  counts: dict[str, int] = {}
  for command in _all_commands():
    k = kind(command)
    counts[k] = counts.get(k, 0) + 1
    needs = k in ("other", "bucket") or (
      k == "run" and NEEDS.search(command.text) and "path/to" not in command.text
    )
    if needs:
      assert _marks(command.block), (
        f"README line {command.block.line}: {command.text!r} is unmarked"
      )
  python = [b for b in blocks() if b.lang == "python"]
  langs = {b.lang for b in blocks()}
  assert langs <= {"bash", "sh", "python", "bibtex"}, langs
  marked = [b for b in _shell_blocks() if _marks(b)]
  print(
    f"README: {len(_shell_blocks())} shell blocks ({len(marked)} marked network/hardware), "
    f"{len(python)} python blocks; commands by kind: {counts}"
  )
  assert len(python) == 7 and counts["run"] >= 20


def test_install_lines_name_extras_that_exist():
  core, extras = setup_requirements()
  jax_pin = next(r for r in core if r.startswith("jax"))[len("jax") :]
  lines = [c.text for c in _all_commands() if kind(c) == "pip"]
  assert len(lines) >= 8
  for line in lines:
    for named in re.findall(r"\.\[([a-z,-]+)\]", line):
      assert set(named.split(",")) <= set(extras), line
    for pin in re.findall(r"jax\[\w+\](\S+?)[\"']", line):
      assert pin == jax_pin, line
  for tool, dist in TOOLS.items():
    assert any(r.startswith(dist) for r in extras["test"]), tool
  for command in _all_commands():
    if kind(command) == "template":
      module = shlex.split(command.text)[2]
      assert os.path.exists(os.path.join(fresh_python.REPO, *module.split("."))) or os.path.exists(
        os.path.join(fresh_python.REPO, *module.split(".")) + ".py"
      ), command.text


def _argv(command: Command, tmp: str, shorten: tuple[str, ...] = ()) -> list[str]:
  """The command's ``python -m`` arguments; a training run also ``shorten``'s overrides of
  keys it does not set itself (default: the quickstart's smoke test, the other runs' tiny
  loop; a tiny model for a plain ViT's config)."""
  args = shlex.split(command.text.replace("/tmp/", f"{tmp}/"))[2:]
  if args[0] == "vit_jax.main":
    quickstart = "configs/quickstart.py" in command.text
    plain = any(f"--config={c}" in command.text for c in PLAIN_VIT_CONFIGS)
    extra = shorten or ((SMOKE if quickstart else TINY) + (TINY_MODEL if plain else ()))
    given = {a.split("=", 1)[0] for a in args}
    args += [a for a in extra if a.split("=", 1)[0] not in given]
  return args


def _run(steps: list[dict], tmp: str, extras: tuple[str, ...] = ()) -> list[dict]:
  """``steps`` (`tests.readme_commands`) in ``tmp`` as the README's folder: a checkout's
  ``configs/`` there, the user's files beside it."""
  os.symlink(os.path.join(fresh_python.REPO, "configs"), os.path.join(tmp, "configs"))
  spec, out = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
  with open(spec, "w") as f:
    json.dump(steps, f)
  env = fresh_python.clean_env(HF_HUB_OFFLINE="1", TFDS_DATA_DIR=os.path.join(tmp, "tfds"))
  proc = subprocess.run(
    core_install.command(["-m", "tests.readme_commands", spec, out], extras),
    cwd=fresh_python.REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  with open(out) as f:
    return json.load(f)


def _check(command: Command, result: dict) -> Optional[str]:
  """None when ``result`` is what the README promises for ``command``, else why not."""
  output = result["output"]
  errors = [line for line in output.splitlines() if line.startswith("Error: ")]
  if NEEDS.search(command.text):
    if result["status"] != 2 or len(errors) != 1 or "Traceback" in output:
      return f"expected one Error line, exit 2; got {result['status']}: {output[-1500:]}"
  elif result["status"] != 0:
    return f"exit {result['status']}: {output[-1500:]}"
  return None


def _images(folder: str) -> None:
  os.makedirs(os.path.join(folder, "my_images"), exist_ok=True)
  rng = np.random.default_rng(0)
  for name in ("my_images/a.png", "my_images/b.jpg", "cat.jpg", "dog.png"):
    Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(
      os.path.join(folder, name)
    )


def _shape(line: str) -> str:
  """A regex of ``line`` with each of its figures generalised (the output's own differ)."""
  parts = re.split(r"\d[\d,]*(?:\.\d+)?(?:e[-+]\d+)?", line)
  return r"[\d.e+-]+".join(re.escape(part) for part in parts)


def _every_format(python: list[str]) -> str:
  """Code saving the README's model in each format its save line names: SavedModel one
  error naming the tf extra (core install), every other format written."""
  line = next(line for code in python for line in code.splitlines() if 'format="timm"' in line)
  formats = re.findall(r'"(\w+)"', line.split("#", 1)[1])
  assert {"hf", "saved_model", "stablehlo"} <= set(formats), line
  return f"""
from vit_jax import errors
for fmt in {formats!r}:
  try:
    model.save("every_" + fmt, format=fmt)
    assert fmt != "saved_model", "SavedModel written without TensorFlow"
  except errors.UserError as e:
    assert fmt == "saved_model" and '.[tf]' in str(e), (fmt, str(e))
"""


def _failures(runs: list[Command], results: list[dict]) -> list[str]:
  return [
    f"README line {c.block.line}: {c.text}\n{why}"
    for c, r in zip(runs, results)
    if (why := _check(c, r)) is not None
  ]


def _core_runs() -> list[Command]:
  """The core install's commands, each once (the TPU and GPU sections repeat the
  quickstart): the quickstart first."""
  runs = [c for c in _all_commands() if kind(c) == "run" and not _text_install(c)]
  return list({c.text: c for c in reversed(runs)}.values())[::-1]


def _trains(command: Command) -> bool:
  """A training run other than the quickstart's, which needs none of the network: the
  slow part (a compile of its own each)."""
  text = command.text
  return (
    text.startswith("python -m vit_jax.main")
    and not NEEDS.search(text)
    and ("--workdir=/tmp/vit_quickstart" not in text)
  )


def test_the_core_install_runs_the_readme(tmp_path):
  """The quickstart (the README's smoke test, a tiny model), every command that reads its
  run or needs what this machine lacks, and the python blocks; the README's example
  terminal lines have the shape of the quickstart's own."""
  tmp = str(tmp_path)
  _images(tmp)
  timm_vit = vit_jax.create("testing", num_classes=5, image_size=32)
  timm_vit.save(os.path.join(tmp, "timm_vit"), format="timm")
  runs = [c for c in _core_runs() if not _trains(c)]
  steps: list[dict] = [{"argv": _argv(c, tmp)} for c in runs]
  python = [b.text for b in blocks() if b.lang == "python"]
  steps += [{"python": code} for code in python]
  # "every export but SavedModel" on the core install: each format the save block names
  steps.append({"python": _every_format(python)})
  results = _run(steps, tmp)
  failures = _failures(runs, results)
  failures += [r["output"][-2000:] for r in results[len(runs) :] if r["status"] != 0]
  assert not failures, "\n\n".join(failures)
  readme = open(README).read()
  quickstart = results[0]["output"]
  compiled = re.search(r"`(Compiled the train step in [^`]*?) \.\.\.`", readme)
  example = re.search(r"`(step 50/50 \| loss [^`]*)`", readme)
  assert compiled and example
  assert re.search(_shape(compiled.group(1)), quickstart), quickstart[-3000:]
  assert re.search(_shape(example.group(1)), quickstart), quickstart[-3000:]


@pytest.mark.slow
def test_the_core_install_trains_every_readme_run(tmp_path):
  """Few-shot during training, MPP and the fine-tuning of its encoder (tiny)."""
  tmp = str(tmp_path)
  runs = [c for c in _core_runs() if _trains(c)]
  assert len(runs) == 3
  failures = _failures(runs, _run([{"argv": _argv(c, tmp)} for c in runs], tmp))
  assert not failures, "\n\n".join(failures)


@pytest.mark.slow
def test_the_text_install_runs_the_image_and_text_commands(tmp_path):
  """After the README's quickstart (its model: LiT locks it), on the text install."""
  tmp = str(tmp_path)
  quickstart = _core_runs()[0]
  runs = [quickstart] + [c for c in _all_commands() if kind(c) == "run" and _text_install(c)]
  steps = [{"argv": _argv(quickstart, tmp, TINY)}] + [{"argv": _argv(c, tmp)} for c in runs[1:]]
  failures = _failures(runs, _run(steps, tmp, ("text",)))
  assert not failures, "\n\n".join(failures)
