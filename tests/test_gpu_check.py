"""benchmarks/gpu_check: every row on the CPU with tiny models in one process (``--smoke``),
the files it writes as rows complete, its report's table from results as a GPU run writes
them, the trace summary and the compiled step's kernel counts."""

from __future__ import annotations

import json

import pytest

from benchmarks.gpu_check import __main__ as gpu_check_main
from benchmarks.gpu_check import correctness, hlo_evidence, kernel_profile, report, rows
from tests import fresh_python

COMMAND = ["-m", "benchmarks.gpu_check"]
HANG_S = 1200  # A guard against a hang, not a speed: the smoke takes about a minute idle.


# Minutes (every benchmark row compiled): the slow tier. By default the report, the
# budget and the row-order tests below check the check itself.
@pytest.mark.slow
def test_smoke_runs_every_row_on_the_cpu(tmp_path):
  proc = fresh_python.run(
    [*COMMAND, "--smoke", f"--out={tmp_path}", "--budget-s=3600"],
    fresh_python.clean_env(),
    timeout=HANG_S,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  results = json.loads((tmp_path / "gpu_check.json").read_text())["results"]
  assert list(results) == list(rows.ROWS)
  assert all(r["ok"] for r in results.values()), {k: r.get("error") for k, r in results.items()}
  # One line per row, appended in order as each completed.
  lines = (tmp_path / "gpu_check.jsonl").read_text().splitlines()
  assert [json.loads(line)["row"] for line in lines] == list(rows.ROWS)
  steps = results["correctness"]["train_step_vs_cpu"]
  assert len(steps["losses_cpu"]) == correctness.CORRECTNESS_STEPS
  assert steps["f32"]["params_rel"] <= correctness.F32_RTOL
  attention = results["correctness"]["attention"]
  assert (attention["test"], attention["reference"]) == ("xla", "einsum")
  assert 0 < attention["logits_rel"] <= correctness.BF16_RTOL
  for speed in rows.SPEEDS:
    row = results[speed.name]
    assert row["img_s"] > 0 and row["step_ms_min"] <= row["step_ms_median"]
    assert row["device"]["platform"] == "cpu"
  # Unset on a CPU: the CPU's choice, the einsum attention in float32.
  default = results[rows.TRAIN_DEFAULT.name]
  assert (default["attention"], default["dtype"]) == ("einsum", "float32")
  assert results[rows.KNOWN[1].name]["attention"] == "einsum"  # asked for
  assert results[rows.RANDAUG]["final_loss"] > 0
  pipeline = results[rows.PIPELINE]
  assert (
    pipeline.get("skipped")
    or min(pipeline["img_s"], pipeline["pipeline_img_s"], pipeline["pipeline_threads_img_s"]) > 0
  )
  assert results["timm_loader"]["img_s"] > 0
  for name in (rows.RECIPE, rows.RECIPE_ARRAY_RECORD):  # JPEGs, worker processes, the recipe
    recipe = results[name]
    assert recipe.get("skipped") or recipe["img_s"] > 0 and recipe["final_loss"] > 0
    assert recipe.get("skipped") or (recipe["randaug"], recipe["mixup"]) == ([2, 10], 0.8)
  assert results[rows.RECIPE_ARRAY_RECORD]["dataset"] == "gpu_check_photos"
  assert results["timm_recipe"]["img_s"] > 0
  assert results["timm_recipe"]["auto_augment"] == "rand-m10-n2"
  # Every train row has the plan's estimate beside its step (none for a CPU).
  planned = [r for name, r in results.items() if name in rows.PLANNED and "img_s" in r]
  assert len(planned) >= 8 and all(r["plan_step_ms"] is None for r in planned)
  assert results[rows.SIGLIP]["mfu"] > 0  # both towers' analytic FLOPs
  assert results["timm"]["train"]["img_s"] > 0 and results["timm"]["infer"]["img_s"] > 0
  profile = results["profile"]["profile"]
  assert 0 < profile["busy_ms"] <= profile["span_ms"] and profile["kinds_ms"]["XLA fusion"] > 0
  masked = results[rows.NAFLEX_ATTENTION]  # the fused path ('xla' here) against einsum
  assert masked["fused"] == "xla" and masked["features_rel_diff"] < 1e-5
  mixed = results[rows.NAFLEX_MIXED]
  assert set(mixed["budgets"]) == {"4", "8", "16"} and mixed["mixed_over_fixed"] > 0
  table = (tmp_path / "gpu_check.md").read_text()
  assert "Failed rows: none" in table and "mixed / fixed" in table
  assert all(f"| {s.name} |" in table for s in rows.SPEEDS)
  assert (tmp_path / "gpu_check.log").read_text().count("=====") == len(rows.ROWS)


def test_a_spent_budget_still_writes_every_file(tmp_path):
  proc = fresh_python.run(
    [*COMMAND, "--smoke", f"--out={tmp_path}", "--budget-s=0", "--only=timm,correctness"],
    fresh_python.clean_env(),
  )
  assert proc.returncode == 1, proc.stderr[-3000:]
  results = json.loads((tmp_path / "gpu_check.json").read_text())["results"]
  assert [r["error"] for r in results.values()] == ["not run: the budget of 0 s was spent"] * 2
  assert len((tmp_path / "gpu_check.jsonl").read_text().splitlines()) == 2
  assert "Failed rows: timm, correctness" in (tmp_path / "gpu_check.md").read_text()


def _speed(img_s: float, **extra) -> dict:
  return {
    **dict(
      img_s=img_s, step_ms_median=85.0, plan_step_ms=80.0, mfu=0.32, gflop_per_img_analytic=105.4,
      peak_bytes_in_use=2 * 2**30, compile_s=20.0, ok=True, attention="cudnn", dtype="bfloat16",
      device=dict(platform="gpu", device_kind="NVIDIA H100 80GB HBM3", count=1),
    ),
    **extra,
  }  # fmt: skip


def test_the_table_gives_timm_ratios_the_plan_the_input_rows_and_failures():
  report_ = dict(
    smoke=False,
    versions=dict(python="3.12", jax="0.11.2", nvidia_smi="NVIDIA H100"),
    plan={"h100x1": {rows.TRAIN_DEFAULT.name: {"needed_bytes": 3 * 2**30}}},
    results={
      rows.TRAIN_DEFAULT.name: _speed(3000.0),
      rows.RANDAUG: _speed(2400.0),
      rows.RECIPE: _speed(
        2000.0,
        plan_step_ms=None,
        hlo_step_ms=90.0,
        dataset="folder:/f",
        randaug=[2, 10],
        mixup=0.8,
        cores=16,
      ),
      "timm_recipe": dict(ok=True, img_s=1000.0, workers=16, auto_augment="rand-m10-n2"),
      rows.PIPELINE: _speed(1500.0, pipeline_img_s=2000.0, pipeline_threads_img_s=900.0),
      "timm_loader": dict(ok=True, img_s=2500.0, workers=16),
      rows.SIGLIP: dict(ok=True, skipped="the input pipeline does not import here"),
      "train/ViT-L_16/128/default": dict(ok=False, error="exit 1: RESOURCE_EXHAUSTED"),
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
  table = report.table(report_)
  assert (
    f"| {rows.TRAIN_DEFAULT.name} | cudnn, bfloat16 | 3000 | 85.0 | 80.0 | 32.0% | 105.4 | 2.00 | "
    "3.00 | 20 | 2000 | 1.50 |" in table
  )
  assert "RandAugment and Mixup in the step: 0.80x the plain step." in table
  assert f"| {rows.RECIPE} | cudnn, bfloat16 | 2000 | 85.0 | 90.0* |" in table
  assert "* The estimate of the program this GPU compiled: the plan file has none." in table
  assert (
    "The recipe from JPEGs (folder:/f, RandAugment [2, 10], Mixup 0.8, decoding in worker "
    "processes on 16 cores): 2000 img/s, 0.67x the synthetic plain step, 2.00x timm's "
    "loader-fed step on the same recipe." in table
  )
  assert "timm's DataLoader (16 workers, rand-m10-n2 and Mixup in the workers) feeding" in table
  assert "1500 img/s end to end (0.50x the synthetic-batch row); the pipeline alone 2000" in table
  assert "900 img/s in the main process's threads" in table
  assert "timm's DataLoader (16 workers) on the same files: 2500 img/s." in table
  assert "| train/ViT-L_16/128/default | exit 1: RESOURCE_EXHAUSTED |" in table
  assert f"Skipped rows: {rows.SIGLIP} (the input pipeline does not import here)" in table
  assert "Failed rows: train/ViT-L_16/128/default" in table


def test_a_row_records_the_plans_estimate_for_the_gpu_it_ran_on():
  plan = {"h200x1": {rows.RECIPE: {"estimate_s": 0.1}}, "h100x1": {rows.RECIPE: {}}}
  h200 = dict(device=dict(device_kind="NVIDIA H200"))
  assert gpu_check_main.planned_ms(plan, rows.RECIPE, h200) == pytest.approx(100.0)
  assert gpu_check_main.planned_ms(plan, rows.RECIPE, _speed(1.0)) is None  # H100: none
  assert gpu_check_main.planned_ms(plan, rows.RECIPE, dict(device=dict(device_kind="cpu"))) is None


def test_the_recipe_rows_are_right_after_naflex_the_default_row_and_timm():
  assert list(rows.ROWS)[:8] == [
    rows.NAFLEX_ATTENTION, rows.NAFLEX_MIXED, rows.TRAIN_DEFAULT.name, "timm", rows.RECIPE,
    rows.RECIPE_ARRAY_RECORD, "timm_recipe", "profile",
  ]  # fmt: skip
  assert list(rows.ROWS)[8] == rows.INFER_DEFAULT.name


def test_a_row_that_does_not_exist_is_refused(tmp_path):
  proc = fresh_python.run(
    [*COMMAND, f"--out={tmp_path}", "--only=train/ViT-X"], fresh_python.clean_env()
  )
  assert proc.returncode == 2
  assert "--only: train/ViT-X not among the rows" in proc.stderr


def test_the_trace_summary_counts_overlapping_kernels_once():
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
  summary = kernel_profile.summarise_trace(events, steps=2)
  assert summary["span_ms"] == pytest.approx(1100 / 1e3 / 2)
  assert summary["busy_ms"] == pytest.approx(600 / 1e3 / 2)  # the overlap counted once
  assert summary["kinds_ms"] == pytest.approx(
    {"matmul": 0.2, "attention (cuDNN)": 0.1, "XLA fusion": 0.05}
  )
  assert summary["kernels_per_step"] == 1.5
  assert [t["kind"] for t in summary["top"]] == ["matmul", "attention (cuDNN)", "XLA fusion"]


# Optimized HLO as XLA:GPU prints it, cut down: a fusion's own computation is not launched,
# a loop's body is, once per instruction.
HLO = """HloModule step, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

%fused_add (p0: f32[4]) -> f32[4] {
  %p0 = f32[4]{0} parameter(0)
  ROOT %add.1 = f32[4]{0} add(f32[4]{0} %p0, f32[4]{0} %p0)
}

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]{0}) parameter(0)
  %x = f32[4]{0} get-tuple-element((s32[], f32[4]{0}) %p), index=1
  %mm = (f32[4]{0}, s8[16]{0}) custom-call(f32[4]{0} %x), custom_call_target="__cublas$lt$matmul"
  ROOT %t = (s32[], f32[4]{0}) tuple(s32[] %i, f32[4]{0} %x)
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %f = f32[4]{0} fusion(f32[4]{0} %a), kind=kLoop, calls=%fused_add
  %att = (bf16[4]{0}) custom-call(f32[4]{0} %f), custom_call_target="__cudnn$fmhaSoftmax"
  %w = (s32[], f32[4]{0}) while((s32[], f32[4]{0}) %init), condition=%cond, body=%body
  ROOT %c = f32[4]{0} copy(f32[4]{0} %f)
}
"""


def test_kernel_counts_of_a_compiled_step():
  counts = hlo_evidence.kernel_counts(HLO)
  assert counts["by_kind"] == {
    "fusion: kLoop": 1,
    "library: __cudnn$fmhaSoftmax": 1,
    "library: __cublas$lt$matmul": 1,
    "op: copy": 1,
  }
  assert (counts["kernels"], counts["library_calls"], counts["fusions"]) == (4, 2, 1)
