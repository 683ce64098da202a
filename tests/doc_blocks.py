"""The fenced blocks of README.md and of the docs pages it links, as tests: parsed into
commands, sorted by what the suite does with each, run in order under the install a page
names (`tests.readme_commands` in `tests.core_install`) and checked against the page's
promises. Shared by tests/test_readme.py and tests/test_doc_pages.py.

A page's shell variables (``Q=...; SRC=...``, ``export NAME=...``) carry from block to
block as in one shell; a ``for`` loop is one command per value; ``nice`` and a trailing
``&`` are dropped (``&`` in a loop over ``--process_id`` runs the processes at once).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
from typing import Any, Callable, Optional

import numpy as np
from PIL import Image

from tests import core_install, finished_run, fresh_python, train_fixtures

REPO = fresh_python.REPO
README = os.path.join(REPO, "README.md")
# What a command needs that a test machine has not: the network (hub and official names,
# tfds datasets to download, big_vision's releases, buckets), a TPU or GPU compiler, the
# user's own files.
NEEDS = re.compile(
  r"hf-hub:|ViT-B_16|imagenet|cifar10|webli_|gs://|path/to|--topology=|photo\.jpg|cat\.jpg"
)
NETWORK_MARK = re.compile(r"\bonline\b")
HARDWARE_MARK = re.compile(r"\b(?:TPUs?|GPUs?)\b")
# A need of the user's own (a placeholder path, a hub cache made by hand): the command is
# checked to end in the one-line error, its block need not say so.
USERS_OWN = re.compile(r"path/to|hf-hub:local/")
TEMPLATE = re.compile(r"<[a-z_]+>|\[--")
TOOLS = {"ruff": "ruff", "python -m pytest": "pytest"}
# The README's smoke test of the quickstart; the tests' tiny loop; the tiny run's model
# (`tests.finished_run`) for the configs of a plain ViT: a second of compiling, not tens.
SMOKE = ("--config.total_steps=50", "--config.lr.warmup_steps=10")
TINY = tuple(f"--config.{k}={v}" for k, v in train_fixtures.TINY.items())
TINY_MODEL = tuple(f"--config.{k}={v}" for k, v in finished_run.TINY.items() if "model." in k)
PLAIN_VIT_CONFIGS = ("configs/quickstart.py", "configs/mpp.py")
# The image tower of an image-text config made the tiny model too: LiT locks the shared
# quickstart run's (tiny) encoder, which must fit it.
TINY_IMAGE = tuple(a.replace("--config.model.", "--config.model.image.") for a in TINY_MODEL)
TWO_TOWER_CONFIGS = ("configs/siglip.py", "configs/lit.py")
QUICKSTART_DIR = "/tmp/vit_quickstart"
# The extras the tests install (`tests.core_install`); a block naming another runs on the
# core install, where its commands must end in the error naming that extra.
INSTALLED_EXTRAS = ("text", "interop")


@dataclasses.dataclass(frozen=True)
class Block:
  page: str  # relative to the repository: README.md, docs/x.md
  lang: str
  section: str
  line: int
  text: str
  intro: str  # the paragraph just above the fence
  installs: tuple[str, ...] = ()  # the extras (of INSTALLED_EXTRAS) it runs under


@dataclasses.dataclass(frozen=True)
class Command:
  text: str  # continuations joined, comment removed, the page's variables substituted
  block: Block
  comment: str = ""  # its line's comment (a smoke flag: ``# --smoke: 48 images``)
  env: tuple[tuple[str, str], ...] = ()  # ``export``ed or ``NAME=value`` before it
  together: bool = False  # one of a loop's commands run at once (``&``)

  @property
  def where(self) -> str:
    return f"{self.block.page}:{self.block.line}"


def _extras(text: str) -> tuple[str, ...]:
  named = re.findall(r'pip install -e "\.\[([a-z,-]+)\]"', text)
  return tuple(e for n in named for e in n.split(",") if e in INSTALLED_EXTRAS)


def blocks(page: str = "README.md") -> list[Block]:
  """The fenced blocks of ``page`` in order. A block runs under the extras its own lines
  name (a ``pip install -e ".[x]"``), else those the page's introduction (before its first
  ``##``) names for every command of the page."""
  text = open(os.path.join(REPO, page)).read()
  page_extras = () if page == "README.md" else _extras(text.split("\n## ", 1)[0])
  found = []
  for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
    before = text[: m.start()]
    section = re.findall(r"^## (.+)$", before, re.M)[-1] if "\n## " in before else ""
    intro = before.rstrip("\n").split("\n\n")[-1]
    installs = _extras(m.group(2)) or page_extras
    found.append(
      Block(page, m.group(1), section, before.count("\n") + 1, m.group(2), intro, installs)
    )
  return found


def linked_pages() -> list[str]:
  """The docs pages README.md links (for a task: the detail of a section) that hold a
  shell or python block, in the README's order."""
  readme = open(README).read()
  pages = []
  for target in re.findall(r"\]\((docs/[\w.-]+\.md)(?:#[\w-]+)?\)", readme):
    if target not in pages and any(b.lang in ("bash", "sh", "python") for b in blocks(target)):
      pages.append(target)
  return pages


def _complete(line: str) -> bool:
  try:
    shlex.split(line)
  except ValueError:
    return False  # a quote opened on an earlier line closes on a later one
  return True


def _substitute(text: str, variables: dict[str, str]) -> str:
  return re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), m.group(0)), text)


def _assignments(line: str) -> Optional[list[tuple[str, str]]]:
  """``A=1; B="x y"`` or ``export A=1 B=2`` as [(name, value)], else None."""
  words = shlex.split(line.replace(";", " "))
  if words and words[0] == "export":
    words = words[1:]
  pairs = [w.split("=", 1) for w in words]
  if words and all(re.fullmatch(r"[A-Z_][A-Z0-9_]*", p[0]) and len(p) == 2 for p in pairs):
    return [(p[0], p[1]) for p in pairs]
  return None


def page_commands(page_blocks: list[Block]) -> list[Command]:
  """The shell commands of ``page_blocks`` (one page's, in order): continuation lines and
  lines inside an open quote joined, comments dropped; a flag line after a complete command
  (an alternative value, as in Fine-tune) is its own; variables and loops expanded."""
  variables: dict[str, str] = {}
  env: dict[str, str] = {}
  out: list[Command] = []
  for block in page_blocks:
    if block.lang not in ("bash", "sh"):
      continue
    loop: Optional[tuple[str, list[str], list[str]]] = None  # (variable, values, body)
    pending, comment = "", ""
    for raw in block.text.splitlines():
      if raw.lstrip().startswith("#"):
        continue
      line, _, said = raw.partition("  #")
      line = line.rstrip()
      if not line:
        continue
      pending = f"{pending} {line.strip()}" if pending else line.strip()
      comment = said.strip() or comment
      if pending.endswith("\\") or not _complete(pending):
        pending = pending.rstrip("\\").rstrip()
        continue
      text, pending, said, comment = pending, "", comment, ""
      head = re.fullmatch(r"for (\w+) in ([^;]+); do", text)
      if head:
        loop = (head.group(1), head.group(2).split(), [])
        continue
      if loop and re.match(r"done\b", text):
        name, values, body = loop
        for value in values:
          for command in body:
            out.append(_command(command.replace(f"${name}", value), block, said, variables, env))
        loop = None
        continue
      if loop:
        loop[2].append(text)
        continue
      pairs = _assignments(text) if "=" in text.split()[0] or text.startswith("export ") else None
      if pairs is not None:
        target = env if text.startswith("export ") else variables
        target.update((k, _substitute(v, variables)) for k, v in pairs)
        continue
      out.append(_command(text, block, said, variables, env))
  return out


def _command(
  text: str, block: Block, comment: str, variables: dict[str, str], env: dict[str, str]
) -> Command:
  text = _substitute(text, variables)
  together = text.endswith("&")
  text = re.sub(r"^nice -n \d+ ", "", text.rstrip("& ").strip())
  own = {}
  while (m := re.match(r"([A-Z_][A-Z0-9_]*)=(\S+) ", text)) and not text.startswith("python"):
    own[m.group(1)] = m.group(2)
    text = text[m.end() :]
  return Command(text, block, comment, tuple({**env, **own}.items()), together)


def marks(block: Block) -> set[str]:
  """What the block says it needs, in a comment or the sentence introducing it."""
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
  if text.startswith("python benchmarks/"):
    return "benchmark"
  if text.startswith("python -m vit_jax") and TEMPLATE.search(text):
    return "template"
  if text.startswith("python -m vit_jax") and "gs://" in text:
    return "bucket"  # a real bucket: not reached from a test (tests/test_bucket_*.py use a server)
  if text.startswith("python -m vit_jax"):
    return "run"
  if text.startswith("--config."):
    return "flag"
  return "other"


def needs_mark(command: Command) -> bool:
  """Whether the command needs what a test machine lacks (a placeholder path of the user's
  aside) or is not run by this suite: its block must say so (`marks`)."""
  k = kind(command)
  return k in ("other", "bucket") or (
    k == "run" and bool(NEEDS.search(command.text)) and not USERS_OWN.search(command.text)
  )


def written(command: Command) -> set[str]:
  """The /tmp/ folders the command writes (its workdir, its export)."""
  return set(re.findall(r"--(?:workdir|out)=(/tmp/[\w.-]+)", command.text))


def read(command: Command) -> set[str]:
  return {p for p in re.findall(r"(/tmp/[\w.-]+)", command.text)} - written(command)


def quickstart(command: Command) -> bool:
  return command.text.startswith("python -m vit_jax.main") and (
    f"--workdir={QUICKSTART_DIR} " in f"{command.text} "
  )


def trains(command: Command) -> bool:
  """A training run other than the quickstart's, which needs none of the network: the
  slow part (a compile of its own each); an evaluation (``total_steps=0``) is not one."""
  text = command.text
  return (
    text.startswith("python -m vit_jax.main")
    and not NEEDS.search(text)
    and not quickstart(command)
    and "--config.total_steps=0" not in text
  )


def argv(command: Command, tmp: str, shorten: tuple[str, ...] = ()) -> list[str]:
  """The command's ``python -m`` arguments; a training run also ``shorten``'s overrides of
  keys it does not set itself (default: the quickstart's smoke test, the other runs' tiny
  loop; a tiny model for a plain ViT's config and an image-text config's image tower). A
  run the page sets to more steps than the
  tiny loop's is shortened to the tiny loop (its step counts replaced), an evaluation
  (``total_steps=0``) kept."""
  args = shlex.split(command.text.replace("/tmp/", f"{tmp}/"))[2:]
  if args[0] == "vit_jax.main":
    plain = any(f"--config={c}" in command.text for c in PLAIN_VIT_CONFIGS)
    two_tower = any(f"--config={c}" in command.text for c in TWO_TOWER_CONFIGS)
    extra = shorten or (
      (SMOKE if quickstart(command) else TINY)
      + (TINY_MODEL if plain else ())
      + (TINY_IMAGE if two_tower else ())
    )
    given = {a.split("=", 1)[0] for a in args}
    if not quickstart(command) and "--config.total_steps=0" not in args and not shorten:
      counts = {a.split("=", 1)[0] for a in TINY if re.search(r"steps|every", a)}
      args = [a for a in args if a.split("=", 1)[0] not in counts]
      given -= counts
    args += [a for a in extra if a.split("=", 1)[0] not in given]
  return args


def step(command: Command, tmp: str, shorten: tuple[str, ...] = ()) -> dict[str, Any]:
  """The `tests.readme_commands` step of ``command``: its argv, its environment."""
  out: dict[str, Any] = {"argv": argv(command, tmp, shorten)}
  if command.env:
    out["env"] = {k: v.replace("/tmp/", f"{tmp}/") for k, v in command.env}
  return out


def start(
  steps: list[dict], tmp: str, extras: tuple[str, ...] = (), tfds: str = "tfds"
) -> tuple[subprocess.Popen, str]:
  """Starts ``steps`` (`tests.readme_commands`) on the install of ``extras`` in ``tmp`` as
  the pages' folder (a checkout's ``configs/`` there, the user's files beside it; tfds data
  in ``tmp/tfds``); (the process, its results' file) for `finish`."""
  configs = os.path.join(tmp, "configs")
  if not os.path.exists(configs):
    os.symlink(os.path.join(REPO, "configs"), configs)
  name = "-".join(("steps", *extras))
  spec, out = os.path.join(tmp, f"{name}.json"), os.path.join(tmp, f"{name}.out.json")
  with open(spec, "w") as f:
    json.dump(steps, f)
  env = fresh_python.clean_env(HF_HUB_OFFLINE="1", TFDS_DATA_DIR=os.path.join(tmp, tfds))
  proc = subprocess.Popen(
    core_install.command(["-m", "tests.readme_commands", spec, out], extras),
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  return proc, out


def finish(started: tuple[subprocess.Popen, str]) -> list[dict]:
  """The results of a `start`ed process, once it has ended."""
  proc, out = started
  _, stderr = proc.communicate(timeout=900)
  assert proc.returncode == 0, stderr[-4000:]
  with open(out) as f:
    return json.load(f)


def run(steps: list[dict], tmp: str, extras: tuple[str, ...] = ()) -> list[dict]:
  """``steps`` run on the install of ``extras`` in ``tmp`` (`start`), their results."""
  return finish(start(steps, tmp, extras))


def expected_to_fail(command: Command, failing: set[str]) -> bool:
  """Whether the page promises one ``Error:`` line, exit 2, for ``command``: it needs what
  a test machine lacks, or reads a folder only such a command writes (``failing``)."""
  return bool(NEEDS.search(command.text) or read(command) & failing)


def check(command: Command, result: dict, fails: bool) -> Optional[str]:
  """None when ``result`` is what the page promises for ``command``, else why not."""
  output = result["output"]
  errors = [line for line in output.splitlines() if line.startswith("Error: ")]
  if fails:
    if result["status"] != 2 or len(errors) != 1 or "Traceback" in output:
      return f"expected one Error line, exit 2; got {result['status']}: {output[-1500:]}"
  elif result["status"] != 0:
    return f"exit {result['status']}: {output[-1500:]}"
  return None


def failures(runs: list[Command], results: list[dict]) -> list[str]:
  """Each run whose result breaks its page's promise, with why."""
  failing: set[str] = set()
  found = []
  for command, result in zip(runs, results):
    fails = expected_to_fail(command, failing)
    if fails:
      failing |= written(command)
    why = check(command, result, fails)
    if why is not None:
      found.append(f"{command.where}: {command.text}\n{why}")
  return found


def user_files(folder: str) -> None:
  """The files a user of the pages has beside them: images, a folder of photos, prompts."""
  rng = np.random.default_rng(0)
  for name in ("my_images/a.png", "my_images/b.jpg", "cat.jpg", "dog.png", "photos/c.png"):
    path = os.path.join(folder, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(path)
  with open(os.path.join(folder, "prompts.txt"), "w") as f:
    f.write("a photo of a zero\na photo of a one\n")


def shape(line: str) -> str:
  """A regex of ``line`` with each of its figures generalised (the output's own differ)."""
  parts = re.split(r"\d[\d,]*(?:\.\d+)?(?:e[-+]\d+)?", line)
  return r"[\d.e+-]+".join(re.escape(part) for part in parts)


def shared(tmp_path_factory: Any, name: str, make: Callable[[str], Any]) -> tuple[str, Any]:
  """(folder, ``make(folder)``'s JSON result), made once per session: the first test
  process (pytest-xdist's workers included) to ask makes it under a lock, the others wait
  and read it."""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # the workers' common folder
  folder, result = os.path.join(root, name), os.path.join(root, f"{name}.json")
  with open(os.path.join(root, f"{name}.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.exists(result):
      shutil.rmtree(folder, ignore_errors=True)
      os.makedirs(folder)
      made = make(folder)
      with open(result + ".part", "w") as f:
        json.dump(made, f)
      os.replace(result + ".part", result)
  with open(result) as f:
    return folder, json.load(f)


def python_blocks(page: str) -> list[Block]:
  return [b for b in blocks(page) if b.lang == "python"]


def key(command: Command) -> str:
  """Identical commands run once: the same text, environment and install (the quickstart
  on any install is the README's, a core install run)."""
  extras = "" if quickstart(command) else ",".join(command.block.installs)
  return f"{extras}|{dict(command.env)}|{command.text}"


def every_format(python: list[str]) -> str:
  """Code saving the README's model in each format its save line names: SavedModel one
  error naming the tf extra (core install), every other format written."""
  line = next(line for code in python for line in code.splitlines() if 'format="timm"' in line)
  formats = re.findall(r'"(\w+)"', line.split("#", 1)[1])
  assert {"hf", "saved_model", "stablehlo"} <= set(formats), line
  return f"""
from vit_jax.infra import errors
for fmt in {formats!r}:
  try:
    model.save("every_" + fmt, format=fmt)
    assert fmt != "saved_model", "SavedModel written without TensorFlow"
  except errors.UserError as e:
    assert fmt == "saved_model" and '.[tf]' in str(e), (fmt, str(e))
"""


def readme_runs() -> list[Command]:
  """The README's core-install commands, each once (the TPU and GPU sections repeat the
  quickstart): the quickstart first."""
  runs = [c for c in page_commands(blocks()) if kind(c) == "run" and "text" not in c.block.installs]
  return list({c.text: c for c in reversed(runs)}.values())[::-1]


def slow(commands: list[Command]) -> set[str]:
  """The keys of the commands that train (`trains`) or read what such a command writes."""
  keys, made = set(), set()
  for command in sorted(commands, key=lambda c: not trains(c)):
    if trains(command) or read(command) & made:
      keys.add(key(command))
      made |= written(command)
  return keys


def docs_runs(page: str) -> list[Command]:
  """A docs page's commands that the suite runs (`kind` run), in its order."""
  return [c for c in page_commands(blocks(page)) if kind(c) == "run"]


def grouped(commands: list[Command]) -> list[list[Command]]:
  """The commands as steps: those of one multi-process run (a loop over ``--process_id``
  run with ``&``) one step, the others one each."""
  steps: list[list[Command]] = []
  for command in commands:
    if command.together and "--process_id" in command.text and steps:
      last = steps[-1]
      if last[-1].together and last[-1].block == command.block:
        last.append(command)
        continue
    steps.append([command])
  return steps


def steps_of(group: list[Command], tmp: str, shorten: tuple[str, ...] = ()) -> dict[str, Any]:
  if len(group) == 1:
    return step(group[0], tmp, shorten)
  return {
    "together": [argv(c, tmp, shorten) for c in group],
    "extras": list(group[0].block.installs),
    "env": {k: v for k, v in group[0].env},
  }


def python_step(block: Block, tmp: str) -> dict[str, Any]:
  return {"python": block.text.replace("/tmp/", f"{tmp}/"), "scope": block.page}


def _writes(steps: list[dict[str, Any]]) -> set[str]:
  return {
    a.split("=", 1)[1]
    for one in steps
    for a in one.get("argv", [])
    if re.match(r"--(workdir|out)=", a)
  }


def run_pages(tmp: str, jobs: list[tuple[str, tuple[str, ...], dict[str, Any]]]) -> dict:
  """{key: result} of ``jobs`` ((key, extras, step)), one process per install in the order
  of each install's first job; a key already run is not run again. An install whose steps
  read nothing the earlier ones write runs at the same time as them (its own tfds folder)."""
  by_install: dict[tuple[str, ...], list[tuple[str, dict[str, Any]]]] = {}
  seen: set[str] = set()
  for key, extras, one in jobs:
    if key not in seen:
      seen.add(key)
      by_install.setdefault(extras, []).append((key, one))
  results: dict[str, dict] = {}
  running: list[tuple[list[str], tuple[subprocess.Popen, str]]] = []
  written: set[str] = set()

  def wait() -> None:
    for keys, started in running:
      results.update(zip(keys, finish(started)))
    running.clear()

  for extras, todo in by_install.items():
    steps = [one for _, one in todo]
    if any(path in json.dumps(steps) for path in written):
      wait()
    tfds = "-".join(("tfds", *extras))
    running.append(([key for key, _ in todo], start(steps, tmp, extras, tfds)))
    written |= _writes(steps)
  wait()
  return results


def default_jobs(tmp: str) -> list[tuple[str, tuple[str, ...], dict[str, Any]]]:
  """What the suite runs by default, README and docs pages together in one folder: the
  quickstart (the README's smoke test, a tiny model) once, every command that reads its run
  or needs what this machine lacks, every python block; a page's trainings are `slow`."""
  jobs = []
  runs = [c for c in readme_runs() if not trains(c)]
  jobs += [(key(c), (), step(c, tmp)) for c in runs]
  python = [b.text for b in python_blocks("README.md")]
  jobs += [
    (f"python|README.md:{b.line}", (), python_step(b, tmp)) for b in python_blocks("README.md")
  ]
  jobs.append(
    ("python|README.md:formats", (), {"python": every_format(python), "scope": "README.md"})
  )
  for page in linked_pages():
    page_runs = docs_runs(page)
    held = slow(page_runs)
    for c in page_runs:
      if key(c) not in held:
        jobs.append((key(c), c.block.installs, step(c, tmp)))
    for b in python_blocks(page):
      if not marks(b):
        jobs.append((f"python|{page}:{b.line}", b.installs, python_step(b, tmp)))
  return jobs


def config_file(command: Command) -> Optional[str]:
  m = re.search(r"--config=(configs/\w+\.py)", command.text)
  return m.group(1) if m and command.text.startswith("python -m vit_jax.main") else None


def text_probes() -> dict[str, Command]:
  """{config file: the first command using it} of the training commands in blocks that
  install the ``text`` extra (README and docs pages), one needing nothing this machine
  lacks where there is one: each is run on the core install too, where it must stop at
  once with the error naming the extra."""
  probes: dict[str, Command] = {}
  for page in ["README.md", *linked_pages()]:
    for command in page_commands(blocks(page)):
      config = config_file(command)
      if config and "text" in command.block.installs and not quickstart(command):
        if (
          config not in probes
          or NEEDS.search(probes[config].text)
          and not NEEDS.search(command.text)
        ):
          probes[config] = command
  return probes


def needs_text(tmp: str) -> list[tuple[str, tuple[str, ...], dict[str, Any]]]:
  """The `text_probes` as core-install jobs: each stops before compiling anything, as its
  page gives it (an evaluation at most, where it would not stop)."""
  return [
    (f"probe|{config}", (), step(c, tmp, ("--config.total_steps=0",)))
    for config, c in text_probes().items()
  ]


def with_quickstart(folder: str, tmp: str) -> None:
  """The shared quickstart run of ``folder`` (`make_default`'s) copied into ``tmp``, for
  the commands that read it."""
  shutil.copytree(os.path.join(folder, "vit_quickstart"), os.path.join(tmp, "vit_quickstart"))


def make_default(folder: str) -> dict:
  """The default runs' results (`default_jobs`), keyed, in ``folder`` with the user's files."""
  import vit_jax  # pylint: disable=g-import-not-at-top

  user_files(folder)
  vit_jax.create("testing", num_classes=5, image_size=32).save(
    os.path.join(folder, "timm_vit"), format="timm"
  )
  return run_pages(folder, default_jobs(folder) + needs_text(folder))
