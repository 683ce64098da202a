"""The training loop's outputs: a progress line and TensorBoard scalars in the run's folder,
and the same reports handed to an `Observer` (a caller's hook: `History`, a progress bar).

Only process 0 writes and calls the observer; every process may call these. Beside img/s the
line shows MFU, the model FLOPs achieved as a share of the devices' dense peak
(`vit_jax.run.step_cost`), once `start` has been given the FLOPs of one step.
"""

from __future__ import annotations

import dataclasses
import io
import os
import socket
import time
from typing import Any, Mapping, Optional, Protocol

import jax
from absl import logging

from vit_jax.infra import storage
from vit_jax.run import step_cost


def _format_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class Observer(Protocol):
  """What a caller of the run (`vit_jax.api.fine_tune`) is told, as the progress line is."""

  def on_start(self, start_step: int, total_steps: int) -> None:
    """The first step is about to run (after compilation), from ``start_step``."""

  def on_train(self, step: int, total_steps: int, scalars: Mapping[str, float]) -> None:
    """A progress report: ``train/loss``, ``train/lr``, ``img_per_sec``, ... at ``step``."""

  def on_eval(self, step: int, total_steps: int, metrics: Mapping[str, float]) -> None:
    """An evaluation's metrics (``eval/accuracy``, ...) at ``step``; the last one is the
    final evaluation."""


@dataclasses.dataclass
class History:
  """The reports of one run's training, in order (an `Observer`): ``train`` one row per
  progress line ({'step', 'train/loss', 'train/lr', 'img_per_sec', ...}), ``evaluations``
  one row per evaluation ({'step', 'eval/accuracy', ...}), the final one last."""

  train: list[dict[str, float]] = dataclasses.field(default_factory=list)
  evaluations: list[dict[str, float]] = dataclasses.field(default_factory=list)

  @property
  def final(self) -> dict[str, float]:
    """The last evaluation's metrics ({} before one)."""
    return self.evaluations[-1] if self.evaluations else {}

  def on_start(self, start_step: int, total_steps: int) -> None:
    del start_step, total_steps  # the rows carry their steps

  def on_train(self, step: int, total_steps: int, scalars: Mapping[str, float]) -> None:
    self.train.append({"step": step, **scalars})

  def on_eval(self, step: int, total_steps: int, metrics: Mapping[str, float]) -> None:
    self.evaluations.append({"step": step, **metrics})


class _EventFile:
  """A TensorBoard event file, written with TensorBoard's record framing (`RecordWriter`)
  into a file opened here: TensorBoard's `EventFileWriter` opens its file through
  `tensorboard.compat.tf`, which imports TensorFlow wherever it is installed (4 CPU seconds
  of every run's start) and writes gs:// through `tf.io.gfile`, though nothing else of a
  run needs it. A local file is appended to; a bucket's object cannot be, so there the
  events are kept in memory and the whole object is written again at each flush (as
  `tf.io.gfile` does): TensorBoard reads a run's scalars while it trains either way."""

  def __init__(self, events_dir: str):
    # pylint: disable-next=g-import-not-at-top
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter  # pylint: disable=g-import-not-at-top

    name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
    if storage.is_remote(events_dir):
      self._path: Optional[str] = f"{events_dir.rstrip('/')}/{name}"
      self._file: Any = io.BytesIO()
    else:
      events_dir = events_dir.removeprefix("file://")
      os.makedirs(events_dir, exist_ok=True)
      self._path = None
      self._file = open(os.path.join(events_dir, name), "wb")  # noqa: SIM115  (closed by close)
    self._records = RecordWriter(self._file)
    self.add_event(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
    self.flush()

  def add_event(self, event: Any) -> None:
    self._records.write(event.SerializeToString())

  def flush(self) -> None:
    if self._path is None:
      self._file.flush()
    else:
      storage.filesystem(self._path).pipe_file(self._path, self._file.getvalue())

  def close(self) -> None:
    self.flush()
    if self._path is None:
      self._file.close()


class Progress:
  """Measures throughput between reports, writes scalars to ``events_dir`` and tells
  ``observer`` what the progress line says."""

  def __init__(
    self,
    events_dir: str,
    *,
    total_steps: int,
    global_batch: int,
    start_step: int,
    observer: Optional[Observer] = None,
  ):
    self.total_steps = total_steps
    self.global_batch = global_batch
    self.num_devices = jax.device_count()
    self.is_writer = jax.process_index() == 0
    self._last_step = start_step
    self._observer = observer if self.is_writer else None
    self._last_time = time.perf_counter()
    self._step_flops: Optional[float] = None
    self._peak_flops: Optional[float] = None  # per device, set once by `start`
    self._writer = _EventFile(events_dir) if self.is_writer else None

  def start(self, step_flops: Optional[float], compute_dtype: Any) -> None:
    """Starts the clock (after compilation, before the first step) with the FLOPs of one
    step over all devices. The peak MFU divides by is taken here, once for the run (a
    CPU's measured now, while no step runs), and named in the log."""
    self._step_flops = step_flops
    if step_flops:
      device = jax.devices()[0]
      self._peak_flops = step_cost.peak_flops(device, compute_dtype)
      if self.is_writer:
        if self._peak_flops:
          logging.info(
            "MFU against %s per device (%s).",
            step_cost.format_flops_rate(self._peak_flops),
            step_cost.peak_source(device, compute_dtype),
          )
        else:
          kind = device.device_kind
          logging.info("No MFU: no peak is known for one %s (%s).", kind, compute_dtype)
    if self._observer is not None:
      self._observer.on_start(self._last_step, self.total_steps)
    self._last_time = time.perf_counter()

  def _mfu(self, steps_per_sec: float) -> Optional[float]:
    if not self._step_flops or not self._peak_flops:
      return None
    return steps_per_sec * self._step_flops / (self._peak_flops * self.num_devices)

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    if self._writer is None:
      return
    # pylint: disable-next=g-import-not-at-top
    from tensorboard.compat.proto import event_pb2, summary_pb2

    values = [summary_pb2.Summary.Value(tag=k, simple_value=float(v)) for k, v in scalars.items()]
    summary = summary_pb2.Summary(value=values)
    self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
    self._writer.flush()

  def report_train(self, step: int, metrics: Mapping[str, float]) -> dict[str, float]:
    """Logs `step, loss, lr, img/s, img/s per device, MFU, ETA`; returns what it logged."""
    now = time.perf_counter()
    steps = step - self._last_step
    seconds = now - self._last_time
    self._last_step, self._last_time = step, now
    scalars = dict(metrics)
    if steps > 0 and seconds > 0:
      img_s = steps * self.global_batch / seconds
      scalars["img_per_sec"] = img_s
      scalars["img_per_sec_per_device"] = img_s / self.num_devices
      mfu = self._mfu(steps / seconds)
      if mfu is not None:
        scalars["mfu"] = mfu
      eta = _format_duration((self.total_steps - step) * seconds / steps)
    else:
      eta = "?"
    if self.is_writer:
      logging.info(
        "step %d/%d | loss %.4f | lr %.3g | %.0f img/s (%.0f per device) | MFU %s | ETA %s",
        step,
        self.total_steps,
        scalars.get("train/loss", float("nan")),
        scalars.get("train/lr", float("nan")),
        scalars.get("img_per_sec", 0.0),
        scalars.get("img_per_sec_per_device", 0.0),
        f"{100 * scalars['mfu']:.1f}%" if "mfu" in scalars else "?",
        eta,
      )
    self.write_scalars(step, scalars)
    if self._observer is not None:
      self._observer.on_train(step, self.total_steps, scalars)
    return scalars

  def report_eval(self, step: int, metrics: Mapping[str, float]) -> None:
    if self.is_writer:
      logging.info(
        "step %d/%d | %s",
        step,
        self.total_steps,
        " | ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items())),
      )
    self.write_scalars(step, metrics)
    if self._observer is not None:
      self._observer.on_eval(step, self.total_steps, metrics)
    # The time spent evaluating does not count towards training throughput.
    self._last_time = time.perf_counter()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
