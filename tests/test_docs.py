"""The README and the docs/ pages as a user meets them: every relative link opens a file
that exists, at a heading that exists; the README stays a short user's document with its
licence, citation and notebooks; its test commands are the ones CI runs."""

import pathlib
import re

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"
PAGES = sorted([README, *(REPO_ROOT / "docs").glob("*.md")])
README_MAX_LINES = 505  # a user reads it in one sitting; detail goes to docs/

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target)
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _headings(text: str) -> list[str]:
  """The Markdown headings of a page, outside code blocks."""
  return re.findall(r"^#{1,6} +(.+?) *$", _FENCE.sub("", text), re.M)


def anchors(text: str) -> set[str]:
  """The anchors GitHub gives a page's headings: lower case, punctuation but `-` and `_`
  dropped, spaces to `-`; a repeated slug gets `-1`, `-2`, ..."""
  seen: dict[str, int] = {}
  result = set()
  for heading in _headings(text):
    slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    result.add(slug if count == 0 else f"{slug}-{count}")
  return result


def unclosed_fence(text: str):
  """The line number of a code fence that opens and never closes, else None."""
  opened = None
  for number, line in enumerate(text.splitlines(), 1):
    if line.lstrip().startswith("```"):
      opened = None if opened else number
  return opened


def test_an_unclosed_fence_is_found():
  assert unclosed_fence("a\n```bash\nx\n```\nb\n") is None
  assert unclosed_fence("a\n```\nx\n```\n\n```\nthe rest renders as code\n") == 6


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_code_fence_closes(page):
  line = unclosed_fence(page.read_text())
  assert line is None, f"{page.name}:{line}: a code fence that never closes"


def test_anchors_follow_github_rules():
  text = "# A\n## Many hosts: TPU pod slices\n```\n# not a heading\n```\n## `x='y'` z\n## A\n"
  assert anchors(text) == {"a", "many-hosts-tpu-pod-slices", "xy-z", "a-1"}


def _relative_links(page: pathlib.Path):
  for target in _LINK.findall(_FENCE.sub("", page.read_text())):
    if not re.match(r"[a-z]+:", target):  # http:, https:, mailto: are not checked here
      yield target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_opens_an_existing_file_at_an_existing_heading(page):
  broken = []
  for target in _relative_links(page):
    path, _, anchor = target.partition("#")
    linked = (page.parent / path).resolve() if path else page
    if not linked.exists():
      broken.append(f"{target}: no file {linked}")
    elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
      broken.append(f"{target}: no heading '#{anchor}' in {linked.name}")
  assert not broken, "\n".join(broken)


def test_the_readme_is_short_and_has_a_licence_a_citation_and_a_contents_list():
  text = README.read_text()
  assert len(text.splitlines()) <= README_MAX_LINES
  headings = _headings(text)
  for section in ("Contents", "Install", "Quickstart", "Results", "Licence", "Citation"):
    assert section in headings, section
  assert "(LICENSE)" in text and (REPO_ROOT / "LICENSE").read_text().lstrip().startswith(
    "Apache License"
  )
  assert "@inproceedings{dosovitskiy2021image" in text


def test_the_readme_names_every_notebook_with_a_colab_link():
  text = README.read_text()
  for notebook in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
    name = f"notebooks/{notebook.name}"
    assert f"`{name}`" in text, name
    assert f"colab.research.google.com/github/OWNER/vit_jax/blob/main/{name})" in text, name


def _bare(command: str) -> str:
  """A command without the interpreter prefix and pip's --quiet, as CI spells it."""
  return re.sub(r"python3? -m |--quiet ", "", command)


def test_the_readme_test_commands_are_what_ci_runs():
  readme = README.read_text()
  block = re.search(r"## Tests\s+```bash\n(.*?)```", readme, re.S).group(1)
  commands = [_bare(line.split("#")[0].strip()) for line in block.splitlines()]
  ci_lines = {_bare(line.strip()) for line in (REPO_ROOT / ".ci" / "run").read_text().splitlines()}
  commands = [c for c in commands if c]
  assert len(commands) == 3, block  # install, lint and format, the suite
  for command in commands:
    assert command in ci_lines, command
