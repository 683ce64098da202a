"""The README's installs on this machine: only what ``pip install -e .`` (or ``.[EXTRA]``)
brings is importable, every other installed package hidden as if it were not there.

`setup.py`'s ``INSTALL_REQUIRES`` (and the extras named) and their dependencies, followed
through the installed distributions' metadata, are the install; a top-level module that
only other distributions provide (TensorFlow, torch, tokenizers, flatbuffers through
TensorFlow, libtpu, ...) is hidden: Python's path finder does not find it, so importing it
raises ModuleNotFoundError as on a fresh virtualenv. Modules of no distribution (the
standard library, this checkout's `vit_jax`, `configs`, `tests`) stay.

    python -m tests.core_install [--extras=text,tf] MODULE ARGS...   # python -m MODULE
    python -m tests.core_install [--extras=...] -c CODE                # python -c CODE
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.metadata
import os
import re
import runpy
import sys
import types
from typing import Any, Optional, Sequence

from packaging.requirements import Requirement

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _name(dist: str) -> str:
  return re.sub(r"[-_.]+", "-", dist).lower()


@functools.cache
def setup_requirements() -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
  """(INSTALL_REQUIRES, EXTRAS_REQUIRE) as setup.py states them now (not as installed)."""
  captured: dict[str, Any] = {}
  fake = types.ModuleType("setuptools")
  fake.setup = lambda **kwargs: captured.update(kwargs)  # type: ignore[attr-defined]
  fake.find_packages = lambda **kwargs: []  # type: ignore[attr-defined]
  real = sys.modules.get("setuptools")
  sys.modules["setuptools"] = fake
  try:
    runpy.run_path(os.path.join(REPO, "setup.py"))
  finally:
    if real is None:
      del sys.modules["setuptools"]
    else:
      sys.modules["setuptools"] = real
  extras = {k: tuple(v) for k, v in captured["extras_require"].items()}
  return tuple(captured["install_requires"]), extras


def installed(extras: Sequence[str] = ()) -> set[str]:
  """The normalised names of the installed distributions ``pip install -e .[extras]``
  brings: the requirements and, recursively, theirs (with the extras they ask for)."""
  core, optional = setup_requirements()
  todo = [Requirement(r) for r in core] + [Requirement(r) for e in extras for r in optional[e]]
  seen: set[tuple[str, str]] = set()
  names: set[str] = set()
  while todo:
    req = todo.pop()
    name = _name(req.name)
    for extra in sorted(req.extras) or [""]:
      if (name, extra) in seen:
        continue
      seen.add((name, extra))
      try:
        requires = importlib.metadata.distribution(name).requires or []
      except importlib.metadata.PackageNotFoundError:
        continue  # not installed here (e.g. a platform's optional part)
      names.add(name)
      for line in requires:
        sub = Requirement(line)
        if sub.marker is None or sub.marker.evaluate({"extra": extra}):
          todo.append(sub)
  return names


def hidden_modules(extras: Sequence[str] = ()) -> set[str]:
  """Top-level modules that only distributions outside the install provide."""
  keep = installed(extras)
  return {
    module
    for module, dists in importlib.metadata.packages_distributions().items()
    if not any(_name(d) in keep or _name(d) == "vit-jax" for d in dists)
  }


class _HidingPathFinder:
  """Python's path finder, blind to ``hidden`` top-level modules and to the metadata of
  distributions not in ``kept`` (a plugin's entry point, as JAX's CUDA plugin's)."""

  hidden: frozenset[str] = frozenset()
  kept: frozenset[str] = frozenset()

  @classmethod
  def find_spec(cls, name: str, path: Any = None, target: Any = None) -> Optional[Any]:
    if name.partition(".")[0] in cls.hidden:
      return None
    return importlib.machinery.PathFinder.find_spec(name, path, target)

  invalidate_caches = importlib.machinery.PathFinder.invalidate_caches

  @classmethod
  def find_distributions(cls, *args: Any, **kwargs: Any) -> Any:
    """The installed distributions' metadata (what importlib.metadata reads), the
    install's only."""
    found = importlib.machinery.PathFinder.find_distributions(*args, **kwargs)
    return (d for d in found if _name(d.metadata["Name"] or "") in cls.kept)


def hide(extras: Sequence[str] = ()) -> set[str]:
  """Makes this process the install of ``extras`` (modules already imported stay); the
  hidden modules."""
  hidden = hidden_modules(extras)
  _HidingPathFinder.hidden = frozenset(hidden)
  _HidingPathFinder.kept = frozenset(installed(extras) | {"vit-jax"})
  finders = sys.meta_path
  finders[:] = [_HidingPathFinder if f is importlib.machinery.PathFinder else f for f in finders]
  return hidden


def command(args: Sequence[str], extras: Sequence[str] = ()) -> list[str]:
  """The argv of ``python ARGS`` (``-m MODULE ...`` or ``-c CODE``) on that install."""
  args = list(args)
  if args and args[0] == "-m":
    args = args[1:]
  option = [f"--extras={','.join(extras)}"] if extras else []
  return [sys.executable, "-m", "tests.core_install", *option, *args]


def _main(argv: list[str]) -> None:
  extras: list[str] = []
  if argv and argv[0].startswith("--extras="):
    extras = [e for e in argv.pop(0).split("=", 1)[1].split(",") if e]
  hide(extras)
  if argv[0] == "-c":
    sys.argv = ["-c", *argv[2:]]
    exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102
    return
  sys.argv = argv
  runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
  _main(sys.argv[1:])
