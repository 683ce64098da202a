"""One decode worker process: ``python -m vit_jax.data.decode_worker <task fd> <result fd>``.

The main process (`decode_workers.Pool`) starts it and sends, over two pipes with
`multiprocessing.connection`'s framing, the `example_images.Preprocessing` args, then
tasks: groups of examples (a file path or the encoded bytes, and the uid that seeds the
crop) and the batch they belong to. The worker writes each example's image into its row of
the batch in shared memory (`_Mappings`: the slot's memfd opened by its /proc path) and
answers, per example, whether it was written. It imports the package as any process does
(`import vit_jax` imports nothing else: no JAX), never JAX itself. It ignores SIGINT and
SIGTERM (the run handles those) and exits when the main process closes its pipe or dies.

Files on a bucket (a 'path' source's URLs): a request takes tens of milliseconds, so the
worker reads the files of every task it holds at once (`example_images.ReadAhead`: all
requests in flight together, on fsspec's event loop here) while it decodes; the main
process sends such a worker more tasks ahead (`decode_workers._REMOTE_IN_FLIGHT`).
"""

from __future__ import annotations

import collections
import math
import mmap
import os
import queue
import signal
import sys
import threading
import traceback
from multiprocessing import connection
from typing import Any

import numpy as np

from vit_jax.infra import errors

# (file of the batch's images, row in it, value, uid): one example of a task.
Item = tuple[str, int, Any, int]
Task = tuple[tuple[int, ...], list[Item]]  # (shape of a batch's images, its examples)
# A task's result: per example whether its row was written (False: its image failed).
Written = list[bool]
# How every error of a worker that failed at its work ends.
AGAIN = "then run the same command again (a training run resumes from its last checkpoint)"


class _Mappings:
  """A worker's mappings of the batch slots it has written, by path (kept: slots are
  reused, so a mapping's pages stay in its page table)."""

  def __init__(self):
    self._arrays: dict[str, np.ndarray] = {}

  def rows(self, path: str, shape: tuple[int, ...]) -> np.ndarray:
    if path not in self._arrays:
      try:
        fd = os.open(path, os.O_RDWR)
        try:
          mapped = mmap.mmap(fd, 4 * math.prod(shape))
        finally:
          os.close(fd)
      except OSError as e:
        raise errors.UserError(
          f"Decode worker process {os.getpid()} cannot map the batch's shared memory {path} "
          f"({e.strerror}): set config.decode_processes=0 to decode in the main process."
        ) from None
      self._arrays[path] = np.frombuffer(mapped, np.float32).reshape(shape)
    return self._arrays[path]


def _write(
  preprocessing: Any, mappings: _Mappings, shape: tuple[int, ...], items: list[Item], ahead: Any
) -> Written:
  """Writes each example's row into its batch; False where its image fails. ``ahead``: the
  task's remote files being read (`example_images.ReadAhead`), or None."""
  written = []
  for k, (path, row, value, uid) in enumerate(items):
    out = mappings.rows(path, shape)[row]  # outside the try: not an image's failure
    try:
      data = ahead.data(k) if ahead is not None else None  # a StorageError passes
      preprocessing.image(value, uid, out, data)
      written.append(True)
    except (ValueError, OSError):
      written.append(False)
  return written


def _receive(tasks: connection.Connection, inbox: queue.SimpleQueue) -> None:
  """Moves tasks from the pipe to ``inbox`` (None at its end), so that the main process
  never waits on a full pipe while this worker decodes."""
  try:
    while True:
      inbox.put(tasks.recv())
  except (EOFError, OSError):
    inbox.put(None)
  except Exception as e:  # noqa: BLE001  # a message this interpreter cannot unpickle
    inbox.put(e)  # (an import its classes need fails): said by the main loop, never a hang


def serve(tasks: connection.Connection, results: connection.Connection) -> None:
  """A worker's loop: the `Preprocessing` args, then (shape, items) tasks until the end.
  A failure the main process should say in one line (this interpreter cannot start the
  stage, no memory, no shared memory) is sent as a `UserError`; a bug with its trace."""
  inbox: queue.SimpleQueue = queue.SimpleQueue()
  threading.Thread(target=_receive, args=(tasks, inbox), daemon=True).start()
  args = inbox.get()
  if args is None:
    return
  try:
    if isinstance(args, Exception):  # the arguments could not be unpickled
      raise args
    from vit_jax.data import example_images  # pylint: disable=g-import-not-at-top

    preprocessing, mappings = example_images.Preprocessing(*args), _Mappings()
  except (ImportError, MemoryError, OSError) as e:
    results.send(
      errors.UserError(
        f"Decode worker process {os.getpid()} cannot start ({type(e).__name__}: "
        f"{' '.join(str(e).split())[:200]}): set config.decode_processes=0 to decode in this "
        "process, or repair the installation."
      )
    )
    return
  # Tasks received, each with its remote files being read (`read_ahead`): every task at
  # hand is taken before one is decoded, so the files of all of them are read meanwhile.
  held: collections.deque[tuple[Task, Any]] = collections.deque()
  ended = False
  while True:
    while not ended and (not held or not inbox.empty()):
      task = inbox.get()
      if isinstance(task, Exception):  # a task that could not be unpickled: a bug
        results.send(RuntimeError(f"A decode worker could not read its task: {task!r}"))
        return
      if task is None:
        ended = True
      else:
        held.append((task, preprocessing.read_ahead([item[2] for item in task[1]])))
    if not held:
      return
    (shape, items), ahead = held.popleft()
    try:
      result: Any = _write(preprocessing, mappings, shape, items, ahead)
    except errors.UserError as e:
      result = e
    except MemoryError:
      result = errors.UserError(
        f"Decode worker process {os.getpid()} ran out of memory: lower "
        f"config.decode_processes or config.batch, or give the machine more memory; {AGAIN}."
      )
    except Exception:  # noqa: BLE001  # a bug: the main process raises it with the trace
      result = RuntimeError(f"A decode worker failed:\n{traceback.format_exc()}")
    try:
      results.send(result)
    except OSError:  # the main process is gone (its pipe closed): nobody waits for the rest
      return


def main() -> None:
  """A worker process: ``argv[1:]`` are its task and result pipes' ends."""
  if len(sys.argv) != 3 or not all(a.isdigit() for a in sys.argv[1:]):
    sys.exit(
      "Error: vit_jax.data.decode_worker is started by the input pipeline "
      "(decode_workers.Pool) with its two pipes' file descriptors, not by hand."
    )
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  serve(
    connection.Connection(int(sys.argv[1]), writable=False),
    connection.Connection(int(sys.argv[2]), readable=False),
  )


if __name__ == "__main__":
  main()
