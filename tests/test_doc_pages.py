"""The docs pages the README links for a task, as tests (`tests.doc_blocks`, the machinery
of tests/test_readme.py): every fenced shell and python block of each page is run or
checked under the install the page names (`.[text]` for docs/image_text.md, `.[interop]`
for the block loading exports in PyTorch, else the core install), in one folder with the
README's runs.

* A ``python -m vit_jax`` command runs, sharing the README's quickstart run (its smoke
  test, a tiny model) and the README's identical commands; a training of the page's own is
  shortened to the tests' tiny loop (its step counts replaced) and is ``slow``, as is a
  command reading what it writes. One that needs the network, a TPU or GPU, or the user's
  data must say so in its block (a comment users read, or the sentence that introduces it)
  and ends in one ``Error:`` line, exit status 2, as does a command reading what such a
  command would have written.
* A python block runs in one namespace per page; one marked as needing the network is
  skipped by that mark.
* A benchmark's command: the script exists and takes every flag the page gives it (the
  benchmarks' own tests run their ``--smoke``); a template names a module that exists;
  another program's block (gcloud, srun, tfds) is marked.
"""

from __future__ import annotations

import os
import re
import shlex

import pytest

from tests import doc_blocks
from tests.core_install import setup_requirements
from tests.doc_blocks import kind

PAGES = doc_blocks.linked_pages()


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
  """(folder, {key: result}) of the README's and the docs pages' default runs, shared
  with tests/test_readme.py."""
  return doc_blocks.shared(tmp_path_factory, "pages", doc_blocks.make_default)


def _shell(page: str) -> list[doc_blocks.Block]:
  return [b for b in doc_blocks.blocks(page) if b.lang in ("bash", "sh")]


def test_the_readme_links_the_pages_with_commands():
  assert {"docs/finetuning.md", "docs/image_text.md", "docs/inference_export.md"} <= set(PAGES)
  langs = {b.lang for p in PAGES for b in doc_blocks.blocks(p)}
  assert langs <= {"bash", "sh", "python", "", "text", "json", "bibtex"}, langs


def test_every_block_is_run_checked_or_marked():
  """Counts what the other tests do with each page's blocks; an unmarked command that
  needs what a test machine lacks, or that this suite does not run, fails here."""
  counts: dict[str, int] = {}
  unmarked = []
  for page in PAGES:
    for command in doc_blocks.page_commands(doc_blocks.blocks(page)):
      counts[kind(command)] = counts.get(kind(command), 0) + 1
      if doc_blocks.needs_mark(command) and not doc_blocks.marks(command.block):
        unmarked.append(f"{command.where}: {command.text}")
  assert not unmarked, "unmarked:\n" + "\n".join(unmarked)
  shell = [b for p in PAGES for b in _shell(p)]
  python = [b for p in PAGES for b in doc_blocks.python_blocks(p)]
  marked = [b for b in shell + python if doc_blocks.marks(b)]
  print(
    f"docs: {len(PAGES)} pages, {len(shell)} shell blocks, {len(python)} python blocks "
    f"({len(marked)} blocks marked network/hardware); commands by kind: {counts}"
  )
  assert counts["run"] >= 30 and len(python) >= 4


def test_install_lines_templates_and_benchmarks_exist():
  _, extras = setup_requirements()
  for page in PAGES:
    for command in doc_blocks.page_commands(doc_blocks.blocks(page)):
      words = shlex.split(command.text)
      if kind(command) == "pip":
        for named in re.findall(r"\.\[([a-z,-]+)\]", command.text):
          assert set(named.split(",")) <= set(extras), command.where
      elif kind(command) == "template":
        module = os.path.join(doc_blocks.REPO, *words[2].split("."))
        assert os.path.isdir(module) or os.path.exists(module + ".py"), command.where
      elif kind(command) == "benchmark":
        source = open(os.path.join(doc_blocks.REPO, words[1])).read()
        flags = re.findall(r"(--[\w-]+)", f"{command.text} {command.comment}")
        missing = [f for f in flags if f'"{f}"' not in source]
        assert not missing, f"{command.where}: {words[1]} takes no {missing}"


def _python_keys(page: str) -> list[str]:
  return [
    f"python|{page}:{b.line}" for b in doc_blocks.python_blocks(page) if not doc_blocks.marks(b)
  ]


@pytest.mark.parametrize("page", PAGES)
def test_the_page_runs(pages, page):
  """The page's commands other than its trainings, and its python blocks, each as the
  page promises."""
  _, results = pages
  runs = doc_blocks.docs_runs(page)
  held = doc_blocks.slow(runs)
  runs = [c for c in runs if doc_blocks.key(c) not in held]
  failures = doc_blocks.failures(runs, [results[doc_blocks.key(c)] for c in runs])
  for name in _python_keys(page):
    if results[name]["status"] != 0:
      failures.append(f"{name}\n{results[name]['output'][-2000:]}")
  assert not failures, "\n\n".join(failures)


def _trained(page: str) -> list[doc_blocks.Command]:
  """The page's slow commands the README's tests do not run already, trainings first."""
  readme = {c.text for c in doc_blocks.readme_runs()}
  runs = doc_blocks.docs_runs(page)
  held = doc_blocks.slow(runs)
  runs = [c for c in runs if doc_blocks.key(c) in held and c.text not in readme]
  return sorted(runs, key=lambda c: not doc_blocks.trains(c))


def _slow_pages() -> list[str]:
  return [p for p in PAGES if _trained(p)]


@pytest.mark.slow
@pytest.mark.parametrize("page", _slow_pages())
def test_the_page_trains(pages, page, tmp_path):
  """The page's trainings (the tests' tiny loop) and the commands reading them, after the
  shared quickstart run; a training the README's test runs already is not run again."""
  folder, _ = pages
  tmp = str(tmp_path)
  doc_blocks.with_quickstart(folder, tmp)
  doc_blocks.user_files(tmp)
  runs = _trained(page)
  groups = doc_blocks.grouped(runs)
  steps = [doc_blocks.steps_of(g, tmp) for g in groups]
  results = doc_blocks.run(steps, tmp, runs[0].block.installs)
  firsts = [g[0] for g in groups]
  failures = doc_blocks.failures(firsts, results)
  assert not failures, "\n\n".join(failures)
