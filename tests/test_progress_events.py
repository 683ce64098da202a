"""The run's TensorBoard scalars: written without importing TensorFlow (even where it is
installed), and read back by TensorBoard's own loader."""

from __future__ import annotations

from tensorboard.backend.event_processing import event_accumulator

from tests import fresh_python


def test_scalars_are_written_without_tensorflow_and_read_by_tensorboard(tmp_path):
  out = fresh_python.run_json(
    f"""
    import json, sys
    from vit_jax.run import progress
    writer = progress.Progress({str(tmp_path)!r}, total_steps=3, global_batch=4, start_step=0)
    writer.write_scalars(1, {{"train/loss": 0.5, "lr": 0.25}})
    writer.write_scalars(2, {{"train/loss": 0.375}})
    writer.close()
    print(json.dumps({{"tensorflow": "tensorflow" in sys.modules}}))
    """,
    fresh_python.clean_env(),
  )
  assert out == {"tensorflow": False}
  events = event_accumulator.EventAccumulator(str(tmp_path))
  events.Reload()
  loss = [(e.step, e.value) for e in events.Scalars("train/loss")]
  assert loss == [(1, 0.5), (2, 0.375)]
  assert [(e.step, e.value) for e in events.Scalars("lr")] == [(1, 0.25)]
