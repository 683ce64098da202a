"""Stopping a run cleanly on SIGTERM (preemption, `scancel`, `kill`) and SIGINT (Ctrl-C).

Preemptible Cloud TPU VMs, spot GPUs, Kubernetes and SLURM send SIGTERM some seconds before
they kill a job. While `StopSignals` is active, a signal only sets a flag: the loop finishes
the step in flight, saves it (synchronously), closes the data stream and raises `Stopped`,
so no step is lost; the command then exits with 128 + the signal's number (143 for
SIGTERM, 130 for SIGINT), the status a shell or scheduler expects from a job ended by that
signal. A second signal while the run is stopping ends the process at once.

In a multi-process run every process must save the same step: SIGTERM is left to JAX's
preemption service (`jax.distributed` starts it; it watches SIGTERM on every process), and
`multihost_utils.reached_preemption_sync_point` tells all processes the same step to stop
at. SIGINT there stops the process that received it only.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Optional

import jax
from absl import logging
from jax.experimental import multihost_utils


class Stopped(Exception):
  """A run stopped by a signal after saving; ``status`` is the process's exit status."""

  def __init__(self, signum: int, step: int, saved: bool):
    name = signal.Signals(signum).name
    what = "saved" if saved else "nothing new to save"
    super().__init__(f"Stopped by {name} at step {step}: {what}; rerun the same command to resume.")
    self.status = 128 + signum


class StopSignals:
  """A context in which SIGTERM and SIGINT ask the loop to stop (see the module docstring).

  Handlers can only be installed from the main thread; elsewhere (a run started from
  another thread) the signals keep their handlers and `requested` is never set by them.
  """

  def __init__(self):
    self.signum: Optional[int] = None
    self._previous: dict[int, Any] = {}
    self._multi_process = jax.process_count() > 1

  def _handle(self, signum: int, frame: Any) -> None:  # pylint: disable=unused-argument
    if self.signum is not None:
      os._exit(128 + signum)  # pylint: disable=protected-access  (a second signal: at once)
    self.signum = signum
    logging.warning(
      "Received %s: finishing the step in flight and saving it (a second signal stops "
      "at once, without saving).",
      signal.Signals(signum).name,
    )

  def __enter__(self) -> "StopSignals":
    if threading.current_thread() is threading.main_thread():
      # SIGTERM of a multi-process run is JAX's preemption service's (see the docstring).
      for signum in (signal.SIGINT,) if self._multi_process else (signal.SIGINT, signal.SIGTERM):
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc: Any) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous.clear()

  def should_stop(self, step: int) -> bool:
    """Whether the loop stops after ``step`` (every process must call it at every step)."""
    if self._multi_process and multihost_utils.reached_preemption_sync_point(step):
      self.signum = self.signum or signal.SIGTERM
      return True
    return self.signum is not None
