"""Where the suite's time goes: a pytest plugin that records, per test, its wall time, the
CPU time of its process and of the subprocesses it waited for, and JAX's own durations of
tracing, lowering and XLA compilation in its process; and a summary per file.

    python -m pytest -q -p tests.suite_timing     # rows in $SUITE_TIMING_DIR, /tmp/suite_timing
    python -m tests.suite_timing [DIR] [--top=N]  # the table, files by CPU time

A test's times include its fixtures' setup (a module fixture counts in the first test that
asks for it). The JAX durations are wall times inside the process: on a busy machine they
include time spent waiting for a core. Each pytest-xdist worker writes its own file.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import resource
import time
from typing import Any

import pytest

DIR_VARIABLE = "SUITE_TIMING_DIR"
DEFAULT_DIR = "/tmp/suite_timing"
# JAX's monitoring events (jax._src.dispatch and pxla) -> the column they fill.
JAX_EVENTS = {
  "/jax/core/compile/jaxpr_trace_duration": "trace",
  "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
  "/jax/core/compile/backend_compile_duration": "compile",
}
COLUMNS = ("wall", "cpu", "children", *JAX_EVENTS.values())

_jax_seconds: collections.Counter = collections.Counter()
_PATH = pytest.StashKey[str]()  # this process's rows
_sessions = 0  # pytest sessions in this process using the plugin (a pytester run nests one)


def _listen(event: str, duration: float, **_: Any) -> None:
  column = JAX_EVENTS.get(event)
  if column:
    _jax_seconds[column] += duration


def _cpu() -> tuple[float, float]:
  """(this process's CPU seconds, its waited-for children's)."""
  me = resource.getrusage(resource.RUSAGE_SELF)
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime


def pytest_configure(config: pytest.Config) -> None:
  import jax.monitoring  # pylint: disable=g-import-not-at-top

  global _sessions
  if not _sessions:  # one listener per process: a second would count each event twice
    jax.monitoring.register_event_duration_secs_listener(_listen)
  _sessions += 1
  folder = os.environ.get(DIR_VARIABLE, DEFAULT_DIR)
  os.makedirs(folder, exist_ok=True)
  config.stash[_PATH] = os.path.join(folder, f"{os.getpid()}.jsonl")


def pytest_unconfigure(config: pytest.Config) -> None:
  import jax.monitoring  # pylint: disable=g-import-not-at-top

  global _sessions
  _sessions -= 1
  if not _sessions:
    jax.monitoring.unregister_event_duration_listener(_listen)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any):
  start, (cpu, children), jax_before = time.perf_counter(), _cpu(), dict(_jax_seconds)
  yield
  cpu_after, children_after = _cpu()
  row = {
    "id": item.nodeid,
    "wall": time.perf_counter() - start,
    "cpu": cpu_after - cpu,
    "children": children_after - children,
    **{k: v - jax_before.get(k, 0.0) for k, v in _jax_seconds.items()},
  }
  with open(item.config.stash[_PATH], "a") as f:
    f.write(json.dumps(row) + "\n")


def per_file(folder: str) -> dict[str, dict[str, float]]:
  """{test file: {column: seconds summed over its tests}} of the rows in ``folder``."""
  files: dict[str, dict[str, float]] = collections.defaultdict(lambda: dict.fromkeys(COLUMNS, 0.0))
  for path in glob.glob(os.path.join(folder, "*.jsonl")):
    with open(path) as f:
      for line in f:
        row = json.loads(line)
        totals = files[row["id"].split("::")[0]]
        for column in COLUMNS:
          totals[column] += row.get(column, 0.0)
  return dict(files)


def table(files: dict[str, dict[str, float]], top: int) -> str:
  """The ``top`` files by CPU seconds (theirs and their subprocesses'), and the totals."""
  order = sorted(files, key=lambda f: -(files[f]["cpu"] + files[f]["children"]))
  lines = ["| file | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
  for name in order[:top]:
    lines.append(f"| {name} | " + " | ".join(f"{files[name][c]:.1f}" for c in COLUMNS) + " |")
  totals = {c: sum(t[c] for t in files.values()) for c in COLUMNS}
  lines.append(
    f"| all {len(files)} files | " + " | ".join(f"{totals[c]:.1f}" for c in COLUMNS) + " |"
  )
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("folder", nargs="?", default=os.environ.get(DIR_VARIABLE, DEFAULT_DIR))
  parser.add_argument("--top", type=int, default=30)
  args = parser.parse_args(argv)
  files = per_file(args.folder)
  if not files:
    raise SystemExit(
      f"No timing rows in {args.folder}: run pytest with -p tests.suite_timing first."
    )
  print(table(files, args.top))


if __name__ == "__main__":
  main()
