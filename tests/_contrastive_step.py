"""Run by test_image_text_run.py in a subprocess with 8 fake CPU devices.

Two SigLIP train steps of a tiny two-tower run on a mesh of 8 'data' devices (the chunked
ring loss), of 1 device (the whole batch at once) and of 8 devices in 2 accumulated
micro-batches (the ring loss over the whole batch's embeddings); writes the losses, the parameters
and whether the 8-device step passes texts around the ring to the .npz given as argv[1].
"""

import os
import sys

from tests import fresh_python

os.environ["XLA_FLAGS"] = fresh_python.xla_flags(8)

import jax  # pylint: disable=g-import-not-at-top
import numpy as np

from configs import siglip
from tests import train_fixtures
from vit_jax import models, run
from vit_jax.infra import sharding

TEXT = dict(width=16, depth=1, mlp_dim=32, num_heads=2, vocab_size=64, pool="gap")


def main(out_path: str) -> None:
  assert jax.device_count() == 8, jax.devices()
  config = siglip.get_config("digits")
  config.model = models.two_tower_config(
    models.get_model_config("testing"), text=TEXT, text_len=8, embed_dim=16
  )
  config.pp.crop, config.batch, config.num_classes = 8, 16, 10
  config.optim.name, config.optim.weight_decay, config.lr.warmup_steps = "sgd", 0.0, 0
  config.lr.decay, config.lr.base = "constant", 0.5
  batch = train_fixtures.fixed_batch()
  batch["text"] = np.random.default_rng(0).integers(0, 64, (16, 8)).astype(np.int32)
  results = {}
  cases = (("ring", jax.devices(), 1), ("one", jax.devices()[:1], 1), ("accum", jax.devices(), 2))
  for name, devices, accum_steps in cases:
    config.accum_steps = accum_steps  # accum: two micro-batches of 8, one pair a device
    mesh = sharding.make_mesh((("data", -1), ("model", 1)), devices)
    trainer = run.build(config, mesh=mesh, open_data=False)
    state = trainer.init_state()
    placed = jax.device_put(batch, sharding.batch_sharding(mesh))
    hlo = trainer.train_step.lower(state, placed).compile().as_text()
    results[f"{name}/permutes"] = np.array("collective-permute" in hlo)
    state = train_fixtures.record_steps(trainer, state, placed, name, results)
  np.savez(out_path, **results)


if __name__ == "__main__":
  main(sys.argv[1])
