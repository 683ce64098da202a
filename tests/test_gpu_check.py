"""benchmarks/gpu_check.py: every row on the CPU with tiny models (``--smoke``), and its
report's table from results as a GPU run writes them."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

from tests import fresh_python

SCRIPT = os.path.join(fresh_python.REPO, "benchmarks", "gpu_check.py")


@pytest.fixture(scope="module")
def gpu_check():
  spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  sys.modules["gpu_check"] = module  # its dataclasses look their module up
  spec.loader.exec_module(module)
  return module


def test_smoke_runs_every_row_on_the_cpu(tmp_path, gpu_check):
  proc = fresh_python.run([SCRIPT, "--smoke", f"--out={tmp_path}"], fresh_python.clean_env())
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  report = json.loads((tmp_path / "gpu_check.json").read_text())
  results = report["results"]
  assert list(results) == list(gpu_check.ROWS)
  assert all(r["ok"] for r in results.values())
  steps = results["correctness"]["train_step_vs_cpu"]
  assert len(steps["losses_cpu"]) == gpu_check.CORRECTNESS_STEPS
  assert steps["f32"]["params_rel"] <= gpu_check.F32_RTOL
  attention = results["correctness"]["attention"]
  assert (attention["test"], attention["reference"]) == ("xla", "einsum")
  # bf16 differs between the two attentions, but not by more than bf16's rounding.
  assert 0 < attention["logits_rel"] <= gpu_check.BF16_RTOL
  for speed in gpu_check.SPEEDS:
    row = results[speed.name]
    assert row["img_s"] > 0 and row["step_ms_min"] <= row["step_ms_median"]
    assert row["device"]["platform"] == "cpu"
  assert results["timm"]["train"]["img_s"] > 0 and results["timm"]["infer"]["img_s"] > 0
  profile = results["profile"]["profile"]
  assert 0 < profile["busy_ms"] <= profile["span_ms"] and profile["kinds_ms"]["XLA fusion"] > 0
  table = (tmp_path / "gpu_check.md").read_text()
  assert "Failed rows: none" in table
  assert all(f"| {s.name} |" in table for s in gpu_check.SPEEDS)
  assert (tmp_path / "gpu_check.log").read_text().count("=====") == len(gpu_check.ROWS)


def test_the_table_gives_timm_ratios_the_plan_and_failures(gpu_check):
  speed = dict(
    img_s=3000.0, step_ms_median=85.0, mfu=0.32, gflop_per_img_analytic=105.4,
    peak_bytes_in_use=2 * 2**30, compile_s=20.0, ok=True,
    device=dict(platform="gpu", device_kind="NVIDIA H100 80GB HBM3", count=1),
  )  # fmt: skip
  report = dict(
    smoke=False,
    versions=dict(python="3.12", jax="0.11.2", nvidia_smi="NVIDIA H100"),
    plan={"h100x1": {"train/ViT-B_16/256/einsum": {"needed_bytes": 3 * 2**30}}},
    results={
      "train/ViT-B_16/256/einsum": speed,
      "train/ViT-L_16/128/cudnn": dict(ok=False, error="exit 1: RESOURCE_EXHAUSTED"),
      "timm": dict(
        ok=True,
        timm="1.0",
        torch="2.11",
        compile_backend="inductor",
        train=dict(batch=256, img_s=2000.0, peak_bytes=None),
        infer=dict(batch=512, img_s=1.0),
      ),  # fmt: skip
    },
  )
  table = gpu_check.table(report)
  assert (
    "| train/ViT-B_16/256/einsum | 3000 | 85.0 | 32.0% | 105.4 | 2.00 | 3.00 | 20 | 2000 | 1.50 |"
    in table
  )
  assert "| train/ViT-L_16/128/cudnn | exit 1: RESOURCE_EXHAUSTED |" in table
  assert "Failed rows: train/ViT-L_16/128/cudnn" in table


def test_a_row_that_does_not_exist_is_refused(tmp_path):
  proc = fresh_python.run(
    [SCRIPT, f"--out={tmp_path}", "--only=train/ViT-X"], fresh_python.clean_env()
  )
  assert proc.returncode == 2
  assert "--only: train/ViT-X not among the rows" in proc.stderr


def test_the_trace_summary_counts_overlapping_kernels_once(gpu_check):
  meta = lambda name, pid, tid=None: dict(  # noqa: E731
    ph="M", name="thread_name" if tid else "process_name", pid=pid, tid=tid, args=dict(name=name)
  )
  kernel = lambda name, ts, dur, pid=1: dict(ph="X", name=name, pid=pid, tid=7, ts=ts, dur=dur)  # noqa: E731
  events = [
    meta("/device:GPU:0", 1),
    meta("/host:CPU", 2),
    kernel("sm90_xmma_gemm_bf16bf16", 0, 400),
    kernel("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", 300, 200),  # overlaps 100
    kernel("loop_multiply_fusion", 1000, 100),
    kernel("PjitFunction(step)", 0, 5000, pid=2),  # the host's: not counted
  ]
  summary = gpu_check.summarise_trace(events, steps=2)
  assert summary["span_ms"] == pytest.approx(1100 / 1e3 / 2)
  assert summary["busy_ms"] == pytest.approx(600 / 1e3 / 2)  # the overlap counted once
  assert summary["kinds_ms"] == pytest.approx(
    {"matmul": 0.2, "attention (cuDNN)": 0.1, "XLA fusion": 0.05}
  )
  assert summary["kernels_per_step"] == 1.5
  assert [t["kind"] for t in summary["top"]] == ["matmul", "attention (cuDNN)", "XLA fusion"]
