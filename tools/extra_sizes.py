r"""What each extra of setup.py adds to the disk, measured on the installed environment.

    python tools/extra_sizes.py

For the base install and each extra: the distributions it pulls in (its requirements and
theirs, as installed here; an extra counts only what the base install does not already
bring), and their size on disk, the sum of the file sizes each distribution's RECORD
lists. Installed sizes, not downloads: wheels are compressed, by about 2-3x for the CUDA
libraries. Nothing is fetched; a requirement that is not installed is listed as missing.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import runpy
from typing import Any
from unittest import mock

import setuptools
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SETUP_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "setup.py")


def setup_arguments() -> dict[str, Any]:
  """The keyword arguments setup.py passes to setuptools.setup (which is not run)."""
  captured: dict[str, Any] = {}
  with mock.patch.object(setuptools, "setup", lambda **kwargs: captured.update(kwargs)):
    runpy.run_path(SETUP_PY)
  return captured


def _closure(requirements: list[str], extras_env: dict[str, str]) -> tuple[set[str], set[str]]:
  """(installed distributions ``requirements`` pull in, transitively; those missing)."""
  found: set[str] = set()
  missing: set[str] = set()
  todo = [Requirement(r) for r in requirements]
  while todo:
    req = todo.pop()
    if req.marker is not None and not req.marker.evaluate(extras_env):
      continue
    name = canonicalize_name(req.name)
    if name in found:
      continue
    try:
      dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
      missing.add(name)
      continue
    found.add(name)
    for text in dist.requires or []:
      child = Requirement(text)
      wanted = child.marker is None or any(
        child.marker.evaluate({**extras_env, "extra": extra}) for extra in req.extras or {""}
      )
      if wanted:
        child.marker = None
        todo.append(child)
  return found, missing


def installed_bytes(name: str) -> int:
  """The bytes of the files a distribution's RECORD lists (what pip installed)."""
  return sum(f.size or 0 for f in metadata.distribution(name).files or [])


def main() -> None:
  env = {"extra": ""}
  arguments = setup_arguments()
  base, base_missing = _closure(arguments["install_requires"], env)
  rows = [("(base install)", base, base_missing)]
  for extra, requirements in arguments["extras_require"].items():
    added, missing = _closure(requirements, env)
    rows.append((f"[{extra}]", added - base, missing))
  print("| install | adds on disk | largest distributions |")
  print("|---|---|---|")
  for label, names, missing in rows:
    sizes = sorted(((installed_bytes(n), n) for n in names), reverse=True)
    total = sum(size for size, _ in sizes)
    largest = ", ".join(f"{n} {s / 2**20:,.0f} MiB" for s, n in sizes[:4])
    gone = f"; not installed here: {', '.join(sorted(missing))}" if missing else ""
    print(f"| {label} | {total / 2**30:.2f} GiB ({len(names)} distributions) | {largest}{gone} |")


if __name__ == "__main__":
  main()
