"""Start-up of the commands: no TensorFlow (and, where tfds builds with it, without Keras),
the persistent compilation cache, no backend noise on a host with libtpu but no TPU, log
lines without absl's prefix unless asked."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import textwrap

from absl import flags, logging

from tests import fresh_python
from tests import interop_fixtures as fx
from tests.markers import needs_libtpu
from vit_jax import cli


def test_command_start_up_skips_keras_and_caches_compilations(tmp_path):
  env = fresh_python.clean_env(XDG_CACHE_HOME=str(tmp_path))
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the tests' own cache (tests/conftest.py)
  out = fresh_python.run_json(
    """
    import json, os, sys
    import jax
    from vit_jax import main
    main._enable_compilation_cache()
    tf_at_start = "tensorflow" in sys.modules  # the pipeline needs none
    from vit_jax.infra import platforms
    platforms.import_tensorflow()  # as tfds' builds call it
    import tensorflow as tf
    print(json.dumps(dict(
      keras=sorted(m for m in sys.modules if m.split(".")[0] in ("keras", "tf_keras")),
      blocked_left=[m for m in platforms._KERAS_EAGER_IMPORTS if m in sys.modules],
      tf_works=float(tf.reduce_sum(tf.ones([3]))),
      tf_at_start=tf_at_start,
      cache=jax.config.jax_compilation_cache_dir,
    )))
    """,
    env,
  )
  assert out["keras"] == []  # TensorFlow's eager import of Keras was skipped
  assert out["blocked_left"] == []  # and Keras still imports if asked for
  assert out["tf_works"] == 3.0 and not out["tf_at_start"]
  assert out["cache"] == str(tmp_path / "vit_jax" / "xla")


@needs_libtpu  # the CPU is chosen only where libtpu is
def test_a_command_on_a_host_with_libtpu_and_no_accelerator_runs_on_the_cpu_quietly(tmp_path):
  """Without a platform chosen, JAX would start libtpu's TPU backend (and any GPU
  plugin's) and log its failure; `cli.run_command` chooses the CPU before anything starts
  a backend, for every command, and `import vit_jax` starts nothing."""
  fx.write_npz(tmp_path / "m.npz", "vit_ti16")
  env = fresh_python.clean_env()
  for name in ("JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES"):
    env.pop(name, None)  # as a user's shell: nothing chosen, nothing hidden
  code = f"""
    import json
    import vit_jax
    from jax._src import xla_bridge
    started_by_import = xla_bridge.backends_are_initialized()
    from vit_jax import convert
    status = convert.main(["convert", "{tmp_path}/m.npz", "--out={tmp_path}/o.npz"])
    import jax
    print(json.dumps(dict(status=status, started_by_import=started_by_import,
                          platforms=jax.config.jax_platforms, device=jax.devices()[0].platform)))
    """
  proc = subprocess.run(
    [sys.executable, "-c", textwrap.dedent(code)],
    cwd=fresh_python.REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert json.loads(proc.stdout) == dict(
    status=0, started_by_import=False, platforms="cpu", device="cpu"
  )
  # The command's own two lines (sources.py, convert.py), as a user reads them.
  lines = proc.stderr.splitlines()
  assert lines == [
    f"{tmp_path}/m.npz: inferred architecture custom.",
    lines[-1],
  ], proc.stderr[-3000:]
  assert re.fullmatch(rf"Wrote {tmp_path}/o\.npz \(custom, 5 classes\) from .*GELU\.", lines[-1])


def test_log_lines_are_plain_by_default_and_in_absl_format_with_verbosity(monkeypatch):
  """What a user reads has no absl prefix (level, time, thread, file:line); --verbosity
  brings it back. (A whole command's output: tests/test_main.py.)"""
  stream = io.StringIO()
  monkeypatch.setattr(logging.get_absl_handler().python_handler, "stream", stream)
  verbosity = flags.FLAGS["verbosity"]
  monkeypatch.setattr(verbosity, "present", verbosity.present)  # restored after the test
  monkeypatch.setattr(verbosity, "value", verbosity.value)

  def parse(argv):
    return cli.parse_command_flags(cli.new_flag_values(), argv, {}, ())

  def command(values):
    logging.warning("careful: %d", 1)

  assert cli.run_command(["command"], parse, command) == 0
  assert stream.getvalue() == "Warning: careful: 1\n"
  assert cli.run_command(["command", "--verbosity=1"], parse, command) == 0
  prefixed = stream.getvalue().splitlines()[1]
  assert re.fullmatch(r"W\d{4} [\d:.]+ +\d+ test_startup\.py:\d+\] careful: 1", prefixed)
