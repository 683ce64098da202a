"""On 8 fake CPU devices (a subprocess: this process must keep its single device)."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
from PIL import Image

from tests import fresh_python, train_fixtures
from vit_jax import data

_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, ml_collections, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from vit_jax import data
    assert len(jax.devices()) == 8, jax.devices()
    config = ml_collections.ConfigDict(json.loads(sys.argv[1]))
    out = {}
    for rows, cols in ((8, 1), (4, 2)):
      mesh = Mesh(np.array(jax.devices()).reshape(rows, cols), ('data', 'model'))
      batch = next(data.train_iterator(data.Settings.from_config(config), mesh))
      for key, value in batch.items():
        assert isinstance(value, jax.Array)
        assert value.sharding == NamedSharding(mesh, PartitionSpec('data')), key
        assert len(value.addressable_shards) == 8
        assert {s.data.shape[0] for s in value.addressable_shards} == {16 // rows}
        assert len({s.index[0].start for s in value.addressable_shards}) == rows
      out[f'train_{rows}x{cols}'] = np.asarray(batch['image']).mean((1, 2, 3)).tolist()
      masks = []
      for b in data.eval_iterator(config, mesh):
        assert b['mask'].sharding == NamedSharding(mesh, PartitionSpec('data'))
        masks.append(np.asarray(b['mask']).tolist())
      out[f'eval_{rows}x{cols}'] = masks
    config.batch = 12
    try:
      data.train_iterator(data.Settings.from_config(config),
                          Mesh(np.array(jax.devices()).reshape(8, 1), ('data', 'model')))
    except ValueError as e:
      out['error'] = str(e)
    print('RESULT' + json.dumps(out))
""")


def test_global_batches_on_eight_devices(tmp_path):
  rng = np.random.default_rng(0)
  for split, n in (("train", 20), ("test", 21)):
    for k in range(n):
      folder = tmp_path / split / f"c{k % 3}"
      folder.mkdir(parents=True, exist_ok=True)
      Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).save(folder / f"{k}.png")
  config = train_fixtures.common_config(
    dataset=f"folder:{tmp_path}",
    train_split="train",
    test_split="test",
    pp=dict(crop=4),
    batch=16,
    batch_eval=16,
  )
  env = dict(
    os.environ,
    XLA_FLAGS=fresh_python.xla_flags(8),
    JAX_PLATFORMS="cpu",
    TF_CPP_MIN_LOG_LEVEL="3",
  )
  proc = subprocess.run(
    [sys.executable, "-c", _SCRIPT, config.to_json_best_effort()],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.split("RESULT")[-1])

  # Same content as on this process's single device: sharding only places rows.
  mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(-1, 1), ("data", "model"))
  single = np.asarray(
    next(data.train_iterator(data.Settings.from_config(config), mesh))["image"]
  ).mean((1, 2, 3))
  np.testing.assert_allclose(out["train_8x1"], single, rtol=1e-6)
  np.testing.assert_allclose(out["train_4x2"], single, rtol=1e-6)
  for key in ("eval_8x1", "eval_4x2"):
    assert [sum(m) for m in out[key]] == [16, 5]
  assert "config.batch=12" in out["error"] and "multiple of 8" in out["error"]
