"""Runs README commands in this one process, in order, for `tests/test_readme.py`:
``python -m tests.core_install [--extras=...] tests.readme_commands SPEC OUT``.

SPEC is a JSON list of steps, each ``{"argv": ["vit_jax.main", "--config=...", ...]}`` (a
command's ``main``, called as ``python -m`` would), ``{"python": CODE, "scope": NAME}``
(executed in the namespace NAME, shared by the python steps of one page) or
``{"together": [ARGV, ...], "extras": [...]}`` (commands run at once, each a process on
this install: the processes of one multi-process run); a step may set ``"env"`` for its
duration. Each runs in SPEC's folder. OUT receives, per step, its exit status (Python: 0,
or 1 with the exception's last line) and its output. One process for all of them: the
install is what is tested, not the interpreter's start.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Iterator


def _command(argv: list[str]) -> int:
  module = importlib.import_module(argv[0] if argv[0] != "vit_jax.plan" else "vit_jax.plan.cli")
  return int(module.main([argv[0].rsplit(".", 1)[-1], *argv[1:]]))


def _together(argvs: list[list[str]], extras: list[str]) -> int:
  """The commands at once, each ``python -m`` in a process on this install (a free port
  for the coordinator the commands name); their output printed in order, the worst exit.
  Each writes to a file: a pipe read after another's end would fill and stop its writer."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  option = [f"--extras={','.join(extras)}"] if extras else []
  logs = [tempfile.TemporaryFile("w+") for _ in argvs]
  procs = [
    subprocess.Popen(
      [sys.executable, "-m", "tests.core_install", *option]
      + [a.replace(":12345", f":{port}") for a in argv],
      stdout=log,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for argv, log in zip(argvs, logs)
  ]
  for proc in procs:
    proc.wait(timeout=900)
  for log in logs:
    log.seek(0)
    print(log.read())
    log.close()
  return max(p.returncode for p in procs)


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
  before = {k: os.environ.get(k) for k in values}
  os.environ.update(values)
  try:
    yield
  finally:
    for k, v in before.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


def run(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
  scopes: dict[str, dict[str, Any]] = {}
  results = []
  for step in steps:
    start = time.perf_counter()
    what = step.get("argv") or step.get("together") or step["python"][:60]
    print(f"[readme] {what!r}", file=sys.__stderr__, flush=True)
    out = io.StringIO()
    with (
      contextlib.redirect_stdout(out),
      contextlib.redirect_stderr(out),
      _env(step.get("env", {})),
    ):
      try:
        if "argv" in step:
          status = _command(step["argv"])
        elif "together" in step:
          status = _together(step["together"], step.get("extras", []))
        else:
          name = step.get("scope", "README.md")
          scope = scopes.setdefault(name, {"__name__": "__readme__"})
          exec(compile(step["python"], name, "exec"), scope)  # noqa: S102
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
