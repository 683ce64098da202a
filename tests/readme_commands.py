"""Runs README commands in this one process, in order, for `tests/test_readme.py`:
``python -m tests.core_install [--extras=...] tests.readme_commands SPEC OUT``.

SPEC is a JSON list of steps, each ``{"argv": ["vit_jax.main", "--config=...", ...]}`` (a
command's ``main``, called as ``python -m`` would) or ``{"python": CODE}`` (executed in one
namespace shared by every python step); each runs in SPEC's folder. OUT receives, per
step, its exit status (Python: 0, or 1 with the exception's last line) and its output.
One process for all of them: the install is what is tested, not the interpreter's start.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import sys
import time
import traceback
from typing import Any


def _command(argv: list[str]) -> int:
  module = importlib.import_module(argv[0] if argv[0] != "vit_jax.plan" else "vit_jax.plan.cli")
  return int(module.main([argv[0].rsplit(".", 1)[-1], *argv[1:]]))


def run(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
  scope: dict[str, Any] = {"__name__": "__readme__"}
  results = []
  for step in steps:
    start = time.perf_counter()
    print(f"[readme] {step.get('argv') or step['python'][:60]!r}", file=sys.__stderr__, flush=True)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
      try:
        if "argv" in step:
          status = _command(step["argv"])
        else:
          exec(compile(step["python"], "README.md", "exec"), scope)  # noqa: S102
          status = 0
      except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 1
      except Exception:  # pylint: disable=broad-except
        traceback.print_exc(file=out)
        status = 1
    seconds = time.perf_counter() - start
    print(f"[readme] exit {status} in {seconds:.1f} s", file=sys.__stderr__, flush=True)
    results.append({"status": status, "output": out.getvalue()[-20_000:], "seconds": seconds})
  return results


if __name__ == "__main__":
  spec, result = sys.argv[1:3]
  with open(spec) as f:
    steps = json.load(f)
  os.chdir(os.path.dirname(os.path.abspath(spec)))
  with open(result, "w") as f:
    json.dump(run(steps), f)
