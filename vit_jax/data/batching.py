"""Host-local numpy batches -> global jax.Arrays sharded over the mesh axis 'data'.

Each process holds global_batch / process_count examples of every batch; the global
array's rows are split over the devices of the 'data' axis (replicated over the other
mesh axes). A background thread keeps a few batches already on the devices.
"""
from __future__ import annotations

import math
import queue
import threading
from typing import Iterator

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = 'data'


def local_batch_size(global_batch: int, mesh: Mesh, key: str = 'batch') -> int:
  """The rows of a global batch that this process supplies.

  The global batch must split evenly over the processes and over the devices of the
  'data' axis; otherwise a ValueError names the numbers and the nearest valid sizes.
  """
  if DATA_AXIS not in mesh.shape:
    raise ValueError(f'The mesh has axes {dict(mesh.shape)}; the input pipeline shards '
                     f'batches over an axis named {DATA_AXIS!r}. Build the mesh with it.')
  processes, devices = jax.process_count(), mesh.shape[DATA_AXIS]
  unit = math.lcm(processes, devices)
  if global_batch % unit:
    lower, upper = global_batch // unit * unit, (global_batch // unit + 1) * unit
    raise ValueError(
        f'config.{key}={global_batch} does not split over {processes} process(es) and '
        f'the {devices} devices of the {DATA_AXIS!r} mesh axis: it must be a multiple '
        f'of {unit}. Use {key}={upper}' + (f' or {lower}.' if lower else '.'))
  return global_batch // processes


def make_global_batch(local_batch: dict[str, np.ndarray],
                      mesh: Mesh) -> dict[str, jax.Array]:
  """{key: [b, ...] host-local rows} -> {key: [b * process_count, ...] global array}.

  Every array is sharded along its first axis over the 'data' mesh axis.
  """
  sharding = NamedSharding(mesh, PartitionSpec(DATA_AXIS))
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}


class _Failure:
  """Carries an exception from the prefetch thread to the consumer."""

  def __init__(self, error: BaseException):
    self.error = error


_END = object()


def prefetch_to_device(batches: Iterator[dict[str, np.ndarray]], mesh: Mesh,
                       size: int) -> Iterator[dict[str, jax.Array]]:
  """Yields make_global_batch(b) for each b, keeping `size` batches ready ahead.

  A daemon thread reads `batches` and starts the host-to-device copies, so input
  preparation overlaps the training step. size <= 0 disables the thread. Errors in
  the thread are raised to the consumer; closing the generator stops the thread.
  """
  if size <= 0:
    for batch in batches:
      yield make_global_batch(batch, mesh)
    return

  ready: queue.Queue = queue.Queue(maxsize=size)
  stop = threading.Event()

  def put(item) -> bool:
    while not stop.is_set():
      try:
        ready.put(item, timeout=0.1)
        return True
      except queue.Full:
        pass
    return False

  def work() -> None:
    try:
      for batch in batches:
        if not put(make_global_batch(batch, mesh)):
          return
      put(_END)
    except BaseException as e:  # Handed to the consumer, which re-raises it.
      put(_Failure(e))

  thread = threading.Thread(target=work, name='vit_jax-device-prefetch', daemon=True)
  thread.start()
  try:
    while True:
      item = ready.get()
      if item is _END:
        return
      if isinstance(item, _Failure):
        raise item.error
      yield item
  finally:
    stop.set()
