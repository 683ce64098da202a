"""vit_jax.infra.distributed: start-up of a multi-process run and cluster detection.

`jax.distributed` starts in fresh Pythons (it can start once per process and must come
before any backend); detection and the settings handed to JAX use a fake initializer here.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap

import jax
import pytest

from tests import fresh_python
from vit_jax.infra import distributed


def test_initialize_distributed_without_settings_is_a_noop():
  result = fresh_python.run_json(
    """
      import json
      from vit_jax.infra import distributed
      distributed.initialize_distributed()
      distributed.initialize_distributed()  # idempotent
      import jax
      print(json.dumps({"processes": jax.process_count(),
                        "distributed": jax.distributed.is_initialized()}))
      """,
    fresh_python.clean_env(),
  )
  assert result == {"processes": 1, "distributed": False}


def test_initialize_distributed_two_processes_from_env():
  """Two local processes joined through VIT_* env vars build one 2-device global mesh."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  code = textwrap.dedent("""
      import json
      from vit_jax.infra import distributed, sharding  # sharding imported first starts no backend
      distributed.initialize_distributed(initialization_timeout=60)
      distributed.initialize_distributed()  # a second call is a no-op
      import jax, jax.numpy as jnp, numpy as np
      mesh = sharding.make_mesh({"data": -1})
      local = np.full((2,), jax.process_index() + 1.0, np.float32)
      x = jax.make_array_from_process_local_data(sharding.batch_sharding(mesh), local)
      total = jax.jit(jnp.sum, out_shardings=sharding.replicated(mesh))(x)
      print(json.dumps({"index": jax.process_index(), "processes": jax.process_count(),
                        "devices": jax.device_count(), "mesh": dict(mesh.shape),
                        "sum": float(total)}))
      """)
  procs = [
    subprocess.Popen(
      [sys.executable, "-c", code],
      cwd=fresh_python.REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      env=fresh_python.clean_env(
        VIT_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", VIT_NUM_PROCESSES="2", VIT_PROCESS_ID=str(i)
      ),
    )
    for i in range(2)
  ]
  results = []
  for proc in procs:
    try:
      stdout, stderr = proc.communicate(timeout=120)
    finally:
      proc.kill()
    assert proc.returncode == 0, stderr[-4000:]
    results.append(json.loads(stdout.strip().splitlines()[-1]))
  for i, r in enumerate(results):
    assert r == {
      "index": i,
      "processes": 2,
      "devices": 2,
      "mesh": {"data": 2},
      "sum": 6.0,
    }  # 2 x 1.0 from process 0 + 2 x 2.0 from process 1


@pytest.fixture
def no_cluster(monkeypatch):
  """A clean environment and a fake `jax.distributed.initialize` that records its call."""
  for name in fresh_python.CLUSTER_ENV:
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setattr(distributed, "_initialized", False)
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  return calls


@pytest.mark.parametrize(
  "env,expected",
  [
    ({}, None),
    ({"TPU_WORKER_HOSTNAMES": "localhost"}, None),
    ({"TPU_WORKER_HOSTNAMES": "10.0.0.2,10.0.0.3"}, {}),
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1", "SLURM_STEP_NODELIST": "n1"}, None),
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}, None),  # sbatch script, outside srun
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_STEP_NODELIST": "n[1-2]"}, {}),
    ({"OMPI_COMM_WORLD_SIZE": "1"}, None),
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_MCA_orte_hnp_uri": "x"}, {}),
  ],
)
def test_initialize_distributed_cluster_detection(no_cluster, monkeypatch, env, expected):
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  distributed.initialize_distributed()
  assert no_cluster == ([] if expected is None else [expected])
  distributed.initialize_distributed()  # idempotent
  assert len(no_cluster) <= 1


def test_initialize_distributed_explicit_settings(no_cluster, monkeypatch):
  monkeypatch.setenv("VIT_NUM_PROCESSES", "4")  # arguments win over the environment
  monkeypatch.setenv("VIT_PROCESS_ID", "3")
  distributed.initialize_distributed("10.0.0.1:1234", 2, 1, initialization_timeout=30)
  assert no_cluster == [
    dict(
      coordinator_address="10.0.0.1:1234", num_processes=2, process_id=1, initialization_timeout=30
    )
  ]


def test_initialize_distributed_errors(no_cluster, monkeypatch):
  with pytest.raises(ValueError, match=r"missing: VIT_NUM_PROCESSES, VIT_PROCESS_ID"):
    distributed.initialize_distributed("10.0.0.1:1234")
  monkeypatch.setenv("VIT_NUM_PROCESSES", "two")
  with pytest.raises(ValueError, match=r"VIT_NUM_PROCESSES='two' is not an integer"):
    distributed.initialize_distributed()
  monkeypatch.delenv("VIT_NUM_PROCESSES")
  monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
  with pytest.raises(ValueError, match=r"Open MPI 5.*VIT_COORDINATOR_ADDRESS"):
    distributed.initialize_distributed()
  assert no_cluster == []
