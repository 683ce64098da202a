"""A disk that fills during an asynchronous checkpoint save: the run's output ends in the
one `Error:` line (no traceback from Orbax's writer threads), the step being written is
left as an Orbax temporary, the step before it intact, and the same command on a larger
disk resumes from that step and removes the temporary.

The disk is a size-limited tmpfs (mounting one needs root; elsewhere the test is skipped,
saying so). The model is one layer of width 256: arrays large enough that tensorstore
has many writes in flight when the first one fails, which is what printed a
`RuntimeError: Event loop is closed` traceback per write before.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess

import pytest

from tests import fresh_python
from vit_jax.infra import compat
from vit_jax.run import save_loop

DISK = "14m"  # holds step 3 (9.7 MB with its optimizer state), not step 6 as well
FLAGS = [
  "--config=configs/quickstart.py",
  "--config.pp.crop=8",
  "--config.batch=16",
  "--config.batch_eval=64",
  "--config.total_steps=9",
  "--config.lr.warmup_steps=2",
  "--config.log_every=3",
  "--config.eval_every=100",
  "--config.checkpoint_every=3",
  "--config.model.transformer.num_layers=1",
  "--config.model.hidden_size=256",
  "--config.model.transformer.mlp_dim=1024",
]


@pytest.fixture
def small_disk(tmp_path):
  """A folder on a tmpfs of `DISK` bytes, unmounted afterwards."""
  mount = tmp_path / "disk"
  mount.mkdir()
  done = subprocess.run(
    ["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(mount)],
    capture_output=True,
    text=True,
  )
  if done.returncode:
    pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
  try:
    yield str(mount)
  finally:
    subprocess.run(["umount", str(mount)], check=True)


def test_full_disk_mid_save_is_the_one_error_line_and_resumes(small_disk, tmp_path, digits_dir):
  workdir = os.path.join(small_disk, "run")
  args = ["-m", "vit_jax.main", *FLAGS, f"--config.data_dir={digits_dir}"]
  full = fresh_python.run([*args, f"--workdir={workdir}"], fresh_python.clean_env())
  assert full.returncode == 2, full.stderr[-3000:]
  lines = (full.stdout + full.stderr).splitlines()
  assert lines[-1].startswith(f"Error: Out of disk space writing to {workdir}/checkpoints (")
  assert "it resumes from the last complete step." in lines[-1]
  progress = ("Execution on ", "Building digits", "Training ", "Compiled ", "MFU ", "step ")
  others = [line for line in lines[:-1] if not line.startswith(progress)]
  assert others == [], "\n".join(others[:20])
  checkpoints = os.path.join(workdir, "checkpoints")
  assert sorted(os.listdir(checkpoints)) == ["3", "6.orbax-checkpoint-tmp"]

  moved = shutil.copytree(workdir, tmp_path / "run")  # the same run on a larger disk
  resumed = fresh_python.run([*args, f"--workdir={moved}"], fresh_python.clean_env())
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert sorted(os.listdir(moved / "checkpoints")) == ["3", "6", "9"]


def test_orbax_still_runs_its_saves_through_the_replaced_runner():
  """Where no tmpfs can be mounted, this is what notices an Orbax that renamed it (an
  Orbax without it: tests/test_compat.py)."""
  assert save_loop.drain_before_close()
  assert compat.resolve("orbax_loop_runner") is save_loop.run_then_drain


def test_a_failed_coroutine_leaves_no_task_running_when_the_loop_closes():
  ended = []

  async def write(seconds: float) -> None:
    await asyncio.sleep(seconds)
    ended.append(seconds)

  async def save() -> None:
    asyncio.get_running_loop().create_task(write(0.05))  # a write still running at the error
    await asyncio.sleep(0)
    raise OSError(28, "No space left on device")

  with pytest.raises(OSError, match="No space left"):
    save_loop.run_then_drain(save())
  assert ended == [0.05]
