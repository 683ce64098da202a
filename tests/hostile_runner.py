"""Runs many command lines in one bounded process, for tests/test_hostile_input.py.

    python -m tests.hostile_runner CASES.json RESULTS.json WATCHED_FOLDER

CASES.json: a list of ``[id, module, argv]`` (``module``: e.g. ``vit_jax.predict``;
``argv`` starts with the program name). Each case runs ``module.main(argv)`` in turn, with
its stdout and stderr captured at the file descriptors (so the C++ libraries' lines are
seen too) and an alarm as its time limit; RESULTS.json gets, per id, the exit status (or
the exception that escaped, or "timeout"), stdout, stderr and the paths under
WATCHED_FOLDER that the case added, removed or changed. The caller sets the process's
address-space limit (`resource.RLIMIT_AS`) and its overall timeout.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import stat
import sys
import tempfile
from typing import Any, Iterator

CASE_SECONDS = 240  # one command: seconds on an idle machine, minutes on a loaded one


class _Timeout(Exception):
  pass


def tree(folder: str) -> dict[str, list[int]]:
  """{path: [kind, size, mtime_ns]} of everything under ``folder``, links not followed and
  nothing opened (a FIFO there must not block the snapshot)."""
  found = {}
  for root, dirs, files in os.walk(folder):
    for name in dirs + files:
      path = os.path.join(root, name)
      info = os.lstat(path)
      kind = stat.S_IFMT(info.st_mode)
      size = info.st_size if stat.S_ISREG(kind) else 0
      found[path] = [kind, size, info.st_mtime_ns if stat.S_ISREG(kind) else 0]
  return found


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
  return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))


@contextlib.contextmanager
def _captured() -> Iterator[dict[str, str]]:
  """Captures file descriptors 1 and 2 into the yielded dict's "out" and "err"."""
  result: dict[str, str] = {}
  sys.stdout.flush()
  sys.stderr.flush()
  saved = {fd: os.dup(fd) for fd in (1, 2)}
  files = {fd: tempfile.TemporaryFile() for fd in (1, 2)}
  for fd, f in files.items():
    os.dup2(f.fileno(), fd)
  try:
    yield result
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, f in files.items():
      os.dup2(saved[fd], fd)
      os.close(saved[fd])
      f.seek(0)
      result["out" if fd == 1 else "err"] = f.read().decode("utf-8", "backslashreplace")
      f.close()


def _raise_timeout(signum, frame):  # pylint: disable=unused-argument
  raise _Timeout()


def run_case(module: str, argv: list[str], watched: str) -> dict[str, Any]:
  """One command line: its status, output and the paths under ``watched`` it changed."""
  command = importlib.import_module(module)
  before = tree(watched)
  with _captured() as output:
    signal.signal(signal.SIGALRM, _raise_timeout)
    signal.alarm(CASE_SECONDS)
    try:
      status: Any = command.main(argv)
    except _Timeout:
      status = "timeout"
    except BaseException as e:  # pylint: disable=broad-except  (reported, not raised)
      status = f"{type(e).__name__}: {e}"[:500]
    finally:
      signal.alarm(0)
  return dict(status=status, changed=changes(before, tree(watched)), **output)


def main(cases_path: str, results_path: str, watched: str) -> None:
  with open(cases_path) as f:
    cases = json.load(f)
  results = {case_id: run_case(module, argv, watched) for case_id, module, argv in cases}
  with open(results_path, "w") as f:
    json.dump(results, f)


if __name__ == "__main__":
  main(*sys.argv[1:4])
