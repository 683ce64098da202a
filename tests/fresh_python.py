"""Runs test code in a fresh Python, for what needs several devices or a JAX not yet started.

The pytest process keeps its default single CPU device, which other tests rely on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The environment variables from which `vit_jax.infra.distributed` finds a multi-process run.
CLUSTER_ENV = (
  "VIT_COORDINATOR_ADDRESS",
  "VIT_NUM_PROCESSES",
  "VIT_PROCESS_ID",
  "TPU_WORKER_HOSTNAMES",
  "CLOUD_TPU_TASK_ID",
  "MEGASCALE_COORDINATOR_ADDRESS",
  "SLURM_JOB_ID",
  "SLURM_STEP_NODELIST",
  "SLURM_NTASKS",
  "OMPI_COMM_WORLD_SIZE",
  "OMPI_MCA_orte_hnp_uri",
)
# XLA's compile options in every process of the suite (conftest sets them for pytest's,
# `clean_env` and `xla_flags` for the subprocesses): the CPU's code generated without
# LLVM's optimisation passes. The tests' tiny programs spend far more time compiling than
# running, and unoptimised code computes the same (the train step of the `testing` ViT
# compiles in 1.7 CPU-seconds instead of 3.1; plans for a TPU or a GPU are unchanged). Its
# fusions are emitted by XLA's elemental LLVM emitters, not its MLIR fusion emitters: that
# step then compiles in 1.0 CPU-second instead of 1.9 (its XLA compile 0.6 s instead of
# 1.5), the same values up to float32 rounding (but two programs computing the same values
# may differ in their last bits: tests/test_feature_cache.py, which needs them equal, runs
# its two runs in a fresh Python without `ELEMENTAL_FUSIONS`).
ELEMENTAL_FUSIONS = "--xla_cpu_use_fusion_emitters=false"
SUITE_XLA_FLAGS = f"--xla_backend_optimization_level=0 {ELEMENTAL_FUSIONS}"


def xla_flags(devices: int | None = None, flags: str = "") -> str:
  """XLA_FLAGS for a test process: the suite's compile options, ``devices`` fake CPU
  devices when given, and ``flags`` (which may hold the suite's already: pytest-xdist's
  workers inherit them)."""
  parts = [flags] if SUITE_XLA_FLAGS in flags else [SUITE_XLA_FLAGS, flags]
  if devices is not None:
    parts.append(f"--xla_force_host_platform_device_count={devices}")
  return " ".join(p for p in parts if p)


def clean_env(**extra: str) -> dict[str, str]:
  """This environment on the CPU without cluster settings, plus ``extra``; XLA_FLAGS is the
  suite's (`xla_flags`) followed by any given in ``extra``."""
  env = {k: v for k, v in os.environ.items() if k not in CLUSTER_ENV}
  env.update(PYTHONPATH=REPO, JAX_PLATFORMS="cpu", **extra)
  env["XLA_FLAGS"] = xla_flags(flags=extra.get("XLA_FLAGS", ""))
  return env


def run(args: list[str], env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
  """``python <args>`` in a fresh Python from the repository root, its output captured."""
  return subprocess.run(
    [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
  )


def run_json(code: str, env: dict[str, str], timeout: int = 120) -> dict:
  """Runs ``code`` in a fresh Python; its last stdout line is JSON."""
  proc = subprocess.run(
    [sys.executable, "-c", textwrap.dedent(code)],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])
