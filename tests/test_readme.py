"""The README as a test: every fenced bash, sh and python block of README.md is run or
checked under the install it names (`tests.doc_blocks`, which tests/test_doc_pages.py uses
for the docs pages the README links; the default runs of both are made once, together).

Each command of a shell block is one of:

* ``pip install``: the extras it names exist in setup.py, and a jax pin is setup.py's;
* ``python -m vit_jax.<command>``: run, in order, in one process per install
  (`tests.core_install`: the core install, or ``.[text]`` where the block installs it),
  with `/tmp/` in a test folder, offline (``HF_HUB_OFFLINE=1``), and training shortened:
  the quickstart by the README's own smoke-test overrides, the others by the tests' tiny
  loop, a plain ViT's config also by the tiny run's model (the runs besides the
  quickstart's, a compile each, are marked ``slow``). A command on a ``gs://`` bucket is
  not run (tests/test_bucket_*.py run them on a local server), only checked marked. One
  that needs the network, a TPU or GPU, or data of the user's (`doc_blocks.NEEDS`) must
  say so in its block (`doc_blocks.marks`: a comment, or the sentence that introduces the
  block) and ends in the README's promise for a mistake: one ``Error:`` line, exit status
  2; every other exits 0. The configs the core install refuses with the error naming the
  ``text`` extra are run only in blocks that install it;
* a template (``<file>``, ``[--json]``), the suite's own tools (ruff, pytest) or another
  program (gcloud, git, srun, hf): not run; the template's command exists, the tools are
  in the ``test`` extra, and another program's block is marked.

The python blocks (From Python) run in order under the core install on a model saved by
this package in timm's format as ``timm_vit`` (tests/test_model_face.py runs them against
timm itself), then the save line's every other format (SavedModel: the error naming the
``tf`` extra). The README's example terminal lines have the shape of the quickstart's.
"""

from __future__ import annotations

import os
import re
import shlex

import pytest

from tests import doc_blocks
from tests.core_install import setup_requirements
from tests.doc_blocks import Command, kind

README = doc_blocks.README


def _commands() -> list[Command]:
  return doc_blocks.page_commands(doc_blocks.blocks())


def _shell_blocks() -> list[doc_blocks.Block]:
  return [b for b in doc_blocks.blocks() if b.lang in ("bash", "sh")]


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
  """(folder, {key: result}) of the README's and the docs pages' default runs, shared
  with tests/test_doc_pages.py (`doc_blocks.shared`)."""
  return doc_blocks.shared(tmp_path_factory, "pages", doc_blocks.make_default)


def test_every_block_is_run_checked_or_marked():
  """Counts what the other tests do with each block. A command this suite does not run
  (another program, a bucket) or one that needs what a test machine lacks (a placeholder
  path of the user's aside) must be in a block that says so: that fails here."""
  counts: dict[str, int] = {}
  for command in _commands():
    k = kind(command)
    counts[k] = counts.get(k, 0) + 1
    if doc_blocks.needs_mark(command):
      assert doc_blocks.marks(command.block), f"{command.where}: {command.text!r} is unmarked"
  python = doc_blocks.python_blocks("README.md")
  langs = {b.lang for b in doc_blocks.blocks()}
  assert langs <= {"bash", "sh", "python", "bibtex", "text"}, langs  # text: an output
  marked = [b for b in _shell_blocks() if doc_blocks.marks(b)]
  print(
    f"README: {len(_shell_blocks())} shell blocks ({len(marked)} marked network/hardware), "
    f"{len(python)} python blocks; commands by kind: {counts}"
  )
  assert len(python) >= 7 and counts["run"] >= 20


def test_install_lines_name_extras_that_exist():
  core, extras = setup_requirements()
  jax_pin = next(r for r in core if r.startswith("jax"))[len("jax") :]
  lines = [c.text for c in _commands() if kind(c) == "pip"]
  assert len(lines) >= 8
  for line in lines:
    for named in re.findall(r"\.\[([a-z,-]+)\]", line):
      assert set(named.split(",")) <= set(extras), line
    for pin in re.findall(r"jax\[\w+\](\S+?)[\"']", line):
      assert pin == jax_pin, line
  for tool, dist in doc_blocks.TOOLS.items():
    assert any(r.startswith(dist) for r in extras["test"]), tool
  for command in _commands():
    if kind(command) == "template":
      module = shlex.split(command.text)[2]
      assert os.path.exists(os.path.join(doc_blocks.REPO, *module.split("."))) or os.path.exists(
        os.path.join(doc_blocks.REPO, *module.split(".")) + ".py"
      ), command.text


def test_the_core_install_runs_the_readme(pages):
  """The quickstart (the README's smoke test, a tiny model), every command that reads its
  run or needs what this machine lacks, and the python blocks (on a model saved by this
  package in timm's format as ``timm_vit``), then the save line's every format; the
  README's example terminal lines have the shape of the quickstart's own."""
  _, results = pages
  runs = [c for c in doc_blocks.readme_runs() if not doc_blocks.trains(c)]
  failures = doc_blocks.failures(runs, [results[doc_blocks.key(c)] for c in runs])
  python = [f"python|README.md:{b.line}" for b in doc_blocks.python_blocks("README.md")]
  for name in [*python, "python|README.md:formats"]:
    if results[name]["status"] != 0:
      failures.append(f"{name}\n{results[name]['output'][-2000:]}")
  assert not failures, "\n\n".join(failures)
  readme = open(README).read()
  quickstart = results[doc_blocks.key(runs[0])]["output"]
  assert doc_blocks.quickstart(runs[0])
  compiled = re.search(r"`(Compiled the train step in [^`]*?) \.\.\.`", readme)
  example = re.search(r"`(step 50/50 \| loss [^`]*)`", readme)
  assert compiled and example
  assert re.search(doc_blocks.shape(compiled.group(1)), quickstart), quickstart[-3000:]
  assert re.search(doc_blocks.shape(example.group(1)), quickstart), quickstart[-3000:]


def test_every_command_needing_the_text_extra_names_it(pages):
  """The configs whose runs the core install refuses with the one-line error naming the
  ``text`` extra (each run there, `doc_blocks.text_probes`): every command of the README
  and the docs pages using one is in a block, or on a page, that installs ``.[text]``."""
  _, results = pages
  refused = []
  for config, command in doc_blocks.text_probes().items():
    result = results[f"probe|{config}"]
    errors = [line for line in result["output"].splitlines() if line.startswith("Error: ")]
    assert result["status"] == 2 and len(errors) == 1, (command.where, result["output"][-1500:])
    if ".[text]" in errors[0]:
      refused.append(config)
  assert "configs/siglip.py" in refused and "configs/lit.py" in refused, refused
  unsaid = [
    f"{c.where}: {c.text}"
    for page in ["README.md", *doc_blocks.linked_pages()]
    for c in doc_blocks.page_commands(doc_blocks.blocks(page))
    if doc_blocks.config_file(c) in refused and "text" not in c.block.installs
  ]
  assert not unsaid, "run without the text extra:\n" + "\n".join(unsaid)


@pytest.mark.slow
def test_the_core_install_trains_every_readme_run(tmp_path):
  """Few-shot during training, MPP and the fine-tuning of its encoder (tiny)."""
  tmp = str(tmp_path)
  runs = [c for c in doc_blocks.readme_runs() if doc_blocks.trains(c)]
  assert len(runs) == 3
  results = doc_blocks.run([doc_blocks.step(c, tmp) for c in runs], tmp)
  failures = doc_blocks.failures(runs, results)
  assert not failures, "\n\n".join(failures)


@pytest.mark.slow
def test_the_text_install_runs_the_image_and_text_commands(pages, tmp_path):
  """After the README's quickstart (the shared run: LiT locks its model), on the text
  install."""
  tmp = str(tmp_path)
  doc_blocks.with_quickstart(pages[0], tmp)
  runs = [c for c in _commands() if kind(c) == "run" and "text" in c.block.installs]
  assert runs
  results = doc_blocks.run([doc_blocks.step(c, tmp) for c in runs], tmp, ("text",))
  failures = doc_blocks.failures(runs, results)
  assert not failures, "\n\n".join(failures)
