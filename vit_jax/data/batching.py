"""Host-local numpy batches -> global jax.Arrays sharded over the mesh axis 'data'.

Each process holds global_batch / process_count examples of every batch, the block of
rows its devices hold (process_row_block); the global array's rows are split over the
devices of the 'data' axis (replicated over the other mesh axes). A background thread keeps a
few batches already on the devices.
"""

from __future__ import annotations

import math
import queue
import threading
from typing import Iterator

import jax
import numpy as np
from jax.sharding import Mesh

from vit_jax.infra import errors
from vit_jax.infra.sharding import DATA_AXIS, batch_sharding


def local_batch_size(
  global_batch: int, mesh: Mesh, key: str = "batch", processes: int | None = None
) -> int:
  """The rows of a global batch that each process supplies.

  The global batch must split evenly over the processes (``processes``, default this
  run's) and over the devices of the 'data' axis; otherwise a ValueError names the
  numbers and the nearest valid sizes.
  """
  if DATA_AXIS not in mesh.shape:
    raise errors.ConfigError(
      f"The mesh has axes {dict(mesh.shape)}; the input pipeline shards "
      f"batches over an axis named {DATA_AXIS!r}. Build the mesh with it."
    )
  processes, devices = processes or jax.process_count(), mesh.shape[DATA_AXIS]
  unit = math.lcm(processes, devices)
  if global_batch % unit:
    lower, upper = global_batch // unit * unit, (global_batch // unit + 1) * unit
    raise errors.ConfigError(
      f"config.{key}={global_batch} does not split over {processes} process(es) and "
      f"the {devices} devices of the {DATA_AXIS!r} mesh axis: it must be a multiple "
      f"of {unit}. Use {key}={upper}" + (f" or {lower}." if lower else ".")
    )
  return global_batch // processes


def process_row_block(global_batch: int, mesh: Mesh) -> tuple[int, int]:
  """(block, process_count): this process supplies rows [block * b, (block + 1) * b)
  of every global batch, b = global_batch // process_count.

  The block is read from the mesh (which rows this process's devices hold), so data
  lands where the devices are whatever the device order. Each process must hold a
  distinct contiguous block of the 'data' axis; otherwise a ValueError says so.
  Call local_batch_size first (it checks divisibility).
  """
  indices = batch_sharding(mesh).addressable_devices_indices_map((global_batch,)).values()
  rows = sorted(
    {(idx[0].start or 0, global_batch if idx[0].stop is None else idx[0].stop) for idx in indices}
  )
  count = jax.process_count()
  size = global_batch // count
  start, stop = rows[0][0], rows[-1][1]
  contiguous = all(a[1] == b[0] for a, b in zip(rows, rows[1:]))
  if not contiguous or stop - start != size or start % size:
    raise errors.ConfigError(
      f"The mesh {dict(mesh.shape)} gives process {jax.process_index()} the rows "
      f"{rows} of a global batch of {global_batch}, but each of the {count} "
      f"processes must hold one distinct contiguous block of {size} rows (a "
      f"contiguous 1/{count} of the {DATA_AXIS!r} mesh axis). Build the mesh with "
      f"vit_jax.infra.sharding.make_mesh and a {DATA_AXIS!r} axis whose size is a multiple "
      f"of the process count."
    )
  return start // size, count


def make_global_batch(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """{key: [b, ...] host-local rows} -> {key: [b * process_count, ...] global array}.

  Every array is sharded along its first axis over the 'data' mesh axis.
  """
  sharding = batch_sharding(mesh)
  return {
    k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
    for k, v in local_batch.items()
  }


class _Failure:
  """Carries an exception from the prefetch thread to the consumer."""

  def __init__(self, error: BaseException):
    self.error = error


_END = object()
_STOP_SECONDS = 10.0  # How long closing prefetch_to_device waits for its thread.


def prefetch_to_device(
  batches: Iterator[dict[str, np.ndarray]],
  mesh: Mesh,
  size: int,
  stop: threading.Event | None = None,
) -> Iterator[dict[str, jax.Array]]:
  """Yields make_global_batch(b) for each b, keeping `size` batches ready ahead.

  A daemon thread reads `batches` and starts the host-to-device copies, so input
  preparation overlaps the training step. size <= 0 disables the thread. Errors in
  the thread are raised to the consumer. Closing the generator sets `stop`, stops the
  thread and closes `batches` (waiting up to _STOP_SECONDS), so that no input thread is
  left running when the interpreter exits. The thread can only stop between batches, so
  a producer that may block (a reader waiting for a read) must watch `stop` too and end
  at once when it is set.
  """
  if size <= 0:
    for batch in batches:
      yield make_global_batch(batch, mesh)
    return

  ready: queue.Queue = queue.Queue(maxsize=size)
  stop = stop or threading.Event()

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
    finally:
      close = getattr(batches, "close", None)
      if close is not None:
        close()

  thread = threading.Thread(target=work, name="vit_jax-device-prefetch", daemon=True)
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
    thread.join(_STOP_SECONDS)
