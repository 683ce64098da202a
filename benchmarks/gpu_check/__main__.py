r"""One prepared check on a GPU, ordered by what is still unknown: NaFlex (cuDNN's padded
attention, one budget against a mix of budgets), the default-config ViT-B/16 train step
beside timm, the recipe (RandAugment and Mixup) end to end from JPEG
files beside timm's loader on the same recipe, the kernel profile, inference,
RandAugment on synthetic batches, the input pipeline, SigLIP B/16, the correctness
check, then the rows measured before. Each train row records the plan's estimate of its
step (``plan_step_ms``, from `PLAN_FILE`) beside its measured ``step_ms_median``.

    python -m benchmarks.gpu_check --out=DIR [--smoke] [--budget-s=360] [--only=ROW,...]
    python -m benchmarks.gpu_check --make-plan      # the plan of each train row (CPU)
    python -m benchmarks.gpu_check --hlo-evidence   # kernels and library calls, compiled

Writes, as each row completes (so a check cut short keeps what it finished):
``DIR/gpu_check.jsonl`` (one line per row), ``DIR/gpu_check.json`` (every figure),
``DIR/gpu_check.md`` (the table, `report.table`) and ``DIR/gpu_check.log`` (each row's
output). On a GPU each row runs in a process of its own, so that peak device memory is
the row's and an out-of-memory ends only it; rows start while ``--budget-s`` lasts and a
row that does not start, fails or times out is recorded as such. ``--smoke`` runs every
row on the CPU with tiny models, in this one process (CI: tests/test_gpu_check.py).

On a lent GPU machine (jax with the CUDA plugin, torch and timm installed; no TensorFlow
and no ml_collections, so ml_collections travels as a wheel), from a checkout:

    pip download --no-deps -d .whl ml_collections==1.1.0     # once, here
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
      && PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 \
         python3 -m benchmarks.gpu_check --out=$OUT --budget-s=360

with a time limit of about 7 minutes for the command: with the machine's start-up inside
8 minutes of a 15-minute lease, which leaves room for one re-run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import time
import traceback
from typing import Any, Optional, TextIO

from benchmarks.gpu_check import report, rows
from benchmarks.gpu_check.config import REPO

PLAN_FILE = os.path.join(REPO, "benchmarks", "gpu_check_plan.json")
RESULT_PREFIX = "GPU_CHECK_RESULT "
MIN_ROW_S = 20  # a row is not started with less of the budget left


def versions() -> dict[str, Any]:
  found: dict[str, Any] = {"python": sys.version.split()[0]}
  for name in report.VERSIONS:
    try:
      found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      found[name] = None
  try:
    smi = subprocess.run(
      ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
      capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    found["nvidia_smi"] = smi.stdout.strip() or None
  except (OSError, subprocess.TimeoutExpired):
    found["nvidia_smi"] = None
  return found


def import_problem() -> Optional[str]:
  """The last line of the error when the package does not import here (another jax, a
  missing package), else None: one clear line before any row is tried."""
  proc = subprocess.run(
    [sys.executable, "-c", "import vit_jax.run, vit_jax.models, configs.common"],
    capture_output=True, text=True, cwd=REPO, check=False,
  )  # fmt: skip
  if proc.returncode == 0:
    return None
  lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
  return lines[-1] if lines else f"exit {proc.returncode}"


def load_plan() -> dict[str, Any]:
  """The plan's predictions by topology and row (`make_plan`); {} when absent."""
  if not os.path.exists(PLAN_FILE):
    return {}
  with open(PLAN_FILE) as f:
    return json.load(f)


TOPOLOGIES = {"h200": "h200x1", "h100": "h100x1"}  # device kind's word -> planned topology


def make_plan(
  topologies: tuple[str, ...] = tuple(TOPOLOGIES.values()), names: tuple[str, ...] = ()
) -> None:
  """Compiles each train row (`rows.PLANNED`; ``names``: those alone) for one GPU of each
  of ``topologies`` (JAX's CUDA plugin, no GPU needed) and stores the plan's per-device
  memory, step bound and step estimate with its counts in `PLAN_FILE`, row by row (a plan
  cut short keeps what it compiled, the other rows as they were)."""
  found = {
    t: {k: v for k, v in rows_.items() if k in rows.PLANNED} for t, rows_ in load_plan().items()
  }
  config_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config.py")
  for topology in topologies:
    planned: dict[str, dict[str, Any]] = {}  # by config: rows of one step compile once
    for name, arg in rows.PLANNED.items():
      if names and name not in names:
        continue
      if arg in planned:
        found[topology][name] = planned[arg]
        continue
      proc = subprocess.run(
        [sys.executable, "-m", "vit_jax.plan", f"--config={config_file}:{arg}",
         f"--topology={topology}", "--json"],
        capture_output=True, text=True, cwd=REPO, check=False,
      )  # fmt: skip
      if proc.returncode not in (0, 2):
        raise SystemExit(f"vit_jax.plan failed for {arg} on {topology}:\n{proc.stderr[-2000:]}")
      plan = json.loads(proc.stdout)
      found.setdefault(topology, {})[name] = planned[arg] = dict(
        needed_bytes=plan["train"]["needed_bytes"],
        memory=plan["train"]["memory"],
        bound_s=plan["time"]["bound_s"],
        estimate_s=plan["estimate"] and plan["estimate"]["step_s"],
        counts=plan["estimate"] and plan["estimate"]["counts"],
        fits=plan["fits"],
        execution=plan["execution"],
      )
      with open(PLAN_FILE, "w") as f:
        json.dump(found, f, indent=1, sort_keys=True)
      print(topology, name, "ok", flush=True)
  print(f"wrote {PLAN_FILE}")


def _in_process(row: str, smoke: bool) -> tuple[str, dict[str, Any]]:
  """(output, result) of ``row`` run here (``--smoke``: one process for every row)."""
  try:
    return "", rows.ROWS[row](smoke)
  except Exception as e:  # pylint: disable=broad-except
    return traceback.format_exc(), dict(ok=False, error=f"{type(e).__name__}: {e}"[-600:])


def _in_child(row: str, left: float) -> tuple[str, dict[str, Any]]:
  """(output, result) of ``row`` in a child process given ``left`` seconds."""
  cmd = [sys.executable, "-m", "benchmarks.gpu_check", f"--child={row}"]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=left, cwd=REPO)
    output, code = proc.stdout + proc.stderr, proc.returncode
  except subprocess.TimeoutExpired as e:
    output = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    code = "timeout"
  lines = [line for line in output.splitlines() if line.startswith(RESULT_PREFIX)]
  if lines:
    return output, json.loads(lines[-1][len(RESULT_PREFIX) :])
  tail = [line for line in output.strip().splitlines() if line.strip()][-3:]
  return output, dict(ok=False, error=f"exit {code}: " + " | ".join(tail)[-600:])


def planned_ms(plan: dict[str, Any], row: str, result: dict[str, Any]) -> Optional[float]:
  """The plan's estimate of ``row``'s step for the GPU it ran on (ms; None without one)."""
  kind = (result.get("device") or {}).get("device_kind", "").lower()
  topology = next((t for word, t in TOPOLOGIES.items() if word in kind), None)
  estimate = plan.get(topology, {}).get(row, {}).get("estimate_s")
  return 1e3 * estimate if estimate else None


def _write(out: str, found: dict[str, Any]) -> None:
  with open(os.path.join(out, "gpu_check.json"), "w") as f:
    json.dump(found, f, indent=1)
  with open(os.path.join(out, "gpu_check.md"), "w") as f:
    f.write(report.table(found))


def run_rows(
  names: list[str], smoke: bool, budget_s: float, out: str, found: dict[str, Any], log: TextIO
) -> None:
  """Each row in order while the budget lasts, its result appended to ``gpu_check.jsonl``
  and the report files rewritten as it completes."""
  start = time.perf_counter()
  results = found["results"]
  for row in names:
    left = budget_s - (time.perf_counter() - start)
    began = time.perf_counter()
    if left < MIN_ROW_S:
      output, result = (
        "",
        dict(ok=False, error=f"not run: the budget of {budget_s:.0f} s was spent"),
      )
    else:
      output, result = _in_process(row, smoke) if smoke else _in_child(row, left)
    result["wall_s"] = time.perf_counter() - began
    if "step_ms_median" in result:
      result["plan_step_ms"] = planned_ms(found["plan"], row, result)
    results[row] = result
    log.write(f"===== {row} ({result['wall_s']:.1f} s)\n{output}\n")
    log.flush()
    with open(os.path.join(out, "gpu_check.jsonl"), "a") as f:
      f.write(json.dumps(dict(row=row, **result)) + "\n")
    _write(out, found)
    state = "skipped" if result.get("skipped") else "ok" if result.get("ok") else "FAILED"
    print(f"{row}: {state} ({result['wall_s']:.0f} s)", flush=True)


def main(argv: Optional[list[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", help="folder for gpu_check.json, .jsonl, .md and .log")
  parser.add_argument("--smoke", action="store_true", help="every row on the CPU, tiny models")
  parser.add_argument("--budget-s", type=float, default=360.0, help="start no row after")
  parser.add_argument("--only", default="", help="comma-separated rows (default: all)")
  parser.add_argument("--child", help=argparse.SUPPRESS)
  parser.add_argument("--make-plan", action="store_true", help=f"write {PLAN_FILE} (CPU)")
  parser.add_argument(
    "--topologies", default=",".join(TOPOLOGIES.values()), help="--make-plan's GPUs"
  )
  parser.add_argument(
    "--hlo-evidence",
    nargs="?",
    const="all",
    choices=("all", "after"),
    help="the compiled H100 step's kernels and bytes (CPU); 'after': the default step alone",
  )
  args = parser.parse_args(argv)
  if args.smoke:
    os.environ["JAX_PLATFORMS"] = "cpu"
  if args.child:
    if args.child not in rows.ROWS:
      parser.error(f"--child={args.child!r} is not a row")
    print(RESULT_PREFIX + json.dumps(rows.ROWS[args.child](False)), flush=True)
    return 0
  if args.make_plan:
    only = tuple(r for r in args.only.split(",") if r)
    unknown = [r for r in only if r not in rows.PLANNED]
    if unknown:
      parser.error(f"--only: {', '.join(unknown)} not among the planned rows")
    make_plan(tuple(t for t in args.topologies.split(",") if t), only)
    return 0
  if args.hlo_evidence:
    from benchmarks.gpu_check import hlo_evidence  # pylint: disable=g-import-not-at-top

    print(hlo_evidence.markdown(hlo_evidence.evidence(args.hlo_evidence)))
    return 0
  if not args.out:
    parser.error("--out=DIR is required")
  names = [r for r in args.only.split(",") if r] or list(rows.ROWS)
  unknown = [r for r in names if r not in rows.ROWS]
  if unknown:
    parser.error(f"--only: {', '.join(unknown)} not among the rows: {', '.join(rows.ROWS)}")
  os.makedirs(args.out, exist_ok=True)
  found: dict[str, Any] = dict(smoke=args.smoke, versions=versions(), plan=load_plan(), results={})
  print(json.dumps(found["versions"]), flush=True)
  problem = import_problem()
  if problem:
    v = found["versions"]
    print(f"Error: vit_jax does not import with jax {v['jax']}, flax {v['flax']}: {problem}")
    return 2
  with open(os.path.join(args.out, "gpu_check.log"), "w") as log:
    run_rows(names, args.smoke, args.budget_s, args.out, found, log)
  print(report.table(found))
  return 0 if all(r.get("ok") for r in found["results"].values()) else 1


if __name__ == "__main__":
  sys.exit(main())
