"""The suite's timing plugin (`tests.suite_timing`) on a small test file of its own, run by
an inner pytest session in this process."""

import json
import os

from tests import suite_timing

pytest_plugins = ["pytester"]

SAMPLE = """
import subprocess, sys
import jax, jax.numpy as jnp

def test_jits():
  assert float(jax.jit(lambda x: jnp.sin(x) * 2)(jnp.ones(3)).sum()) > 0

def test_waits_for_a_subprocess():
  subprocess.run([sys.executable, "-c", "sum(range(10**7))"], check=True)
"""


def test_rows_per_test_and_the_table_per_file(pytester, tmp_path, monkeypatch, capsys):
  pytester.makepyfile(test_sample=SAMPLE)
  folder = str(tmp_path / "timing")
  monkeypatch.setenv(suite_timing.DIR_VARIABLE, folder)
  result = pytester.runpytest_inprocess("-p", "tests.suite_timing", "-p", "no:cacheprovider")
  result.assert_outcomes(passed=2)
  (path,) = os.listdir(folder)
  with open(os.path.join(folder, path)) as f:
    rows = {r["id"].split("::")[1]: r for r in map(json.loads, f)}
  jits, waits = rows["test_jits"], rows["test_waits_for_a_subprocess"]
  assert jits["compile"] > 0 and jits["trace"] > 0 and jits["lower"] > 0
  assert waits["children"] > 0.05 and waits.get("compile", 0.0) == 0.0
  assert jits["wall"] >= jits["compile"]
  suite_timing.main([folder])
  out = capsys.readouterr().out
  assert "| test_sample.py |" in out and "| all 1 files |" in out
