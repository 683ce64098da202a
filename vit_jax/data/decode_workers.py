"""Worker processes for the decoding stage: groups of examples -> image rows in shared memory.

Why processes: per image the stage runs C calls (file read, JPEG decode, resize,
normalise) with Python between them. In threads that Python holds the GIL, which capped the
threaded stage at about 1,300 images/s whatever the core count (16 cores of the GPU
machine, docs/performance.md). Each worker process has its own interpreter.

Why not Grain's process workers (`mp_prefetch`): they run slices of a random-access
dataset in each worker; our readers stream (TFRecord windows, a read-ahead thread) in the
main process, so the main process keeps them and sends each group of examples (a file
path or the encoded bytes, and the uid that seeds the crop) to a worker. Why not
`multiprocessing`'s processes: its spawn and forkserver starts import the parent's
``__main__`` in every child (`vit_jax.main` would bring Flax, Orbax and the models), and
fork is unsafe once JAX runs threads. A worker is a fresh interpreter running
``python -m vit_jax.data.decode_worker`` (`decode_worker`: its loop over two pipes), with
the package this process runs (`_worker_env`). A worker that cannot start, runs out of
memory or is killed (the kernel's out-of-memory killer: SIGKILL) is one `errors.UserError`
in the main process naming its pid, how it ended and the way out (`_ended`); so is one
that runs but answers nothing for `SILENCE_SECONDS` while it holds tasks (it is killed).

Files on a bucket (a 'path' source's URLs): a worker reads the files of every task it
holds at once while it decodes (`decode_worker`), and is sent more tasks ahead
(`_REMOTE_IN_FLIGHT`: 64 files).

Pixels never go through a pipe: each batch's images are a slot in shared memory (`_Slot`,
an anonymous memfd file, so nothing is left behind in /dev/shm by a killed run and its size
is not /dev/shm's), mapped by the main process as the batch's array and by the workers,
which write their rows. A slot is reserved when made (a lack of memory is an error, not a
SIGBUS in a worker) and lent again once the batch lent from it is gone, so after the first
batches no page is allocated or faulted in again (fresh pages cost a worker 0.25 ms per
224x224 image).
"""

from __future__ import annotations

import collections
import math
import mmap
import os
import queue
import signal
import site
import subprocess
import sys
import threading
import time
import weakref
from multiprocessing import connection
from typing import Any, Callable, Iterable, Iterator, TypeVar

import numpy as np

from vit_jax.data import decode_worker
from vit_jax.data.decode_worker import AGAIN, Task, Written
from vit_jax.infra import errors

_IN_FLIGHT = 3  # Tasks sent ahead to each worker: it always has the next one queued.
# Tasks sent ahead to each worker whose files are on a bucket: it reads the files of every
# task it holds at once (`serve`), 64 requests in flight, so that at a bucket's tens of
# milliseconds a request its decoding never waits (a worker decodes ~770 images a second).
_REMOTE_IN_FLIGHT = 8
_FEED_POLL_SECONDS = 0.005  # How often the main loop looks for new items while a worker idles.
# Seconds a worker with tasks in flight may stay silent before it counts as stuck (alive
# but not answering: a stalled file read, a decode that never returns): far longer than a
# task takes (well under a second to decode; a bucket read with its client's retries).
SILENCE_SECONDS = 300.0
_Item = TypeVar("_Item")
# A worker's program, after the interpreter: the worker module, run as a module.
_WORKER_ARGS = ("-m", decode_worker.__name__)
# The folder that holds this process's `vit_jax` package.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _worker_env() -> dict[str, str]:
  """A worker's environment: this one, with `_PACKAGE_ROOT` first on PYTHONPATH where it is
  not a site directory (a checkout on sys.path, not installed), so that the worker runs
  this process's vit_jax."""
  sites = {*site.getsitepackages(), site.getusersitepackages()}
  path = os.environ.get("PYTHONPATH", "")
  if _PACKAGE_ROOT in sites:
    return dict(os.environ)
  return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_PACKAGE_ROOT, path) if p)}


class _Slot:
  """One batch's images in shared memory: an anonymous file (memfd), mapped here and, by
  the path ``/proc/<pid>/fd/<fd>``, in the workers; lent again once the array last lent
  from it is gone."""

  def __init__(self, shape: tuple[int, ...]):
    self.shape = shape
    nbytes = 4 * math.prod(shape)
    try:
      self._fd = os.memfd_create("vit_jax-images", os.MFD_CLOEXEC)
    except OSError as e:  # EMFILE, ENFILE, ENOMEM
      raise _no_slot(nbytes, e) from None
    try:
      # Reserved now, so that a lack of memory is this error, not a SIGBUS in a worker.
      os.posix_fallocate(self._fd, 0, nbytes)
      self._mapped = mmap.mmap(self._fd, nbytes)
    except OSError as e:
      os.close(self._fd)
      raise _no_slot(nbytes, e) from None
    self.path = f"/proc/{os.getpid()}/fd/{self._fd}"
    self._lent: weakref.ref | None = None

  def free(self) -> bool:
    return self._lent is None or self._lent() is None

  def lend(self) -> np.ndarray:
    """A new array over the slot, float32 of its shape. Every view of it keeps its base,
    the flat array made here, alive; the slot is free again once that base is gone."""
    base = np.frombuffer(self._mapped, np.float32)
    self._lent = weakref.ref(base)
    return base.reshape(self.shape)

  def close(self) -> None:
    """Closes the file; arrays still lent keep the memory until they are gone."""
    os.close(self._fd)


def _no_slot(nbytes: int, e: OSError) -> errors.ConfigError:
  """The error for a batch slot the system cannot make (memory, or file descriptors)."""
  return errors.ConfigError(
    f"No memory for a batch of images in shared memory ({nbytes / 2**20:.0f} MiB; "
    f"{e.strerror}): lower config.batch, or set config.decode_processes=0 to decode in "
    "this process."
  )


class SharedImages:
  """Batch image arrays that worker processes write: slots in shared memory, reused once
  the batches lent from them are gone (so after the first few batches no page is
  allocated or faulted in again), more made while all are in use."""

  def __init__(self):
    self._slots: list[_Slot] = []

  def take(self, shape: tuple[int, ...]) -> tuple[np.ndarray, str]:
    """A float32 array of ``shape`` and the path the workers open it by."""
    slot = next((s for s in self._slots if s.shape == shape and s.free()), None)
    if slot is None:
      slot = _Slot(shape)
      self._slots.append(slot)
    return slot.lend(), slot.path

  def close(self) -> None:
    for slot in self._slots:
      slot.close()
    self._slots = []


class _Worker:
  """One worker process and its two pipes; `sent` holds its tasks' numbers in order.
  ``pool_size``: the workers of its pool (what the advice of its errors names)."""

  def __init__(self, preprocessing_args: tuple[Any, ...], pool_size: int):
    self.pool_size = pool_size
    task_read, task_write = os.pipe()
    result_read, result_write = os.pipe()
    try:
      self.process = subprocess.Popen(
        [sys.executable, *_WORKER_ARGS, str(task_read), str(result_write)],
        pass_fds=(task_read, result_write),
        stdin=subprocess.DEVNULL,
        env=_worker_env(),
      )
    except OSError as e:  # no memory or process slot to fork, the interpreter gone
      os.close(task_write)
      os.close(result_read)
      raise errors.UserError(
        f"Cannot start a decode worker process ({e.strerror or e}): lower "
        f"config.decode_processes (now {pool_size}; 0 decodes in this process), then run the "
        "same command again."
      ) from None
    finally:
      os.close(task_read)
      os.close(result_write)
    self.tasks = connection.Connection(task_write, readable=False)
    self.results = connection.Connection(result_read, writable=False)
    self.sent: collections.deque[int] = collections.deque()
    self.since = time.monotonic()  # its last answer, or the task sent to it idle
    self.send(preprocessing_args)

  def send(self, task: Any) -> None:
    if not self.sent:
      self.since = time.monotonic()
    try:
      self.tasks.send(task)
    except OSError:
      raise self._died() from None

  def receive(self) -> Written:
    try:
      result = self.results.recv()
    except (EOFError, OSError):
      raise self._died() from None
    self.since = time.monotonic()
    if isinstance(result, BaseException):
      raise result
    return result

  def deadline(self) -> float:
    """When a worker with tasks in flight has been silent for `SILENCE_SECONDS`."""
    return self.since + SILENCE_SECONDS

  def stop_silent(self) -> errors.UserError:
    """Kills a worker that stayed silent past its deadline; the error that names it."""
    self.process.kill()
    self.process.wait()
    self.sent.clear()
    return errors.UserError(
      f"Decode worker process {self.process.pid} answered nothing for {SILENCE_SECONDS:.0f} s "
      "while it had images to decode (it ran, but a file read or a decode was stuck), so it "
      "was stopped: check that the data's files can be read (a bucket's connection), or set "
      f"config.decode_processes=0 to decode in this process; {AGAIN}."
    )

  def _died(self) -> Exception:
    """The error of a worker that is gone: the one it sent on its way out (it could not
    start), else how it ended, with the way out."""
    try:
      if self.results.poll():
        said = self.results.recv()
        if isinstance(said, Exception):
          return said
    except (EOFError, OSError):
      pass
    return _ended(self.process.pid, self.process.wait(), self.pool_size)

  def end(self) -> None:
    """Closes the task pipe: the worker's loop ends at its end."""
    self.tasks.close()

  def wait(self) -> None:
    """Waits for the worker to exit (after `end`)."""
    try:
      self.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      self.process.kill()
      self.process.wait()
    self.results.close()


def _ended(pid: int, code: int, pool_size: int) -> errors.UserError:
  """The error for worker ``pid`` that ended with return code ``code`` (negative: the
  signal that killed it) while it had work: what ended it, and what to change before
  running the command again."""
  if code == -signal.SIGKILL:
    return errors.UserError(
      f"Decode worker process {pid} was killed by SIGKILL, likely the kernel's out-of-memory "
      f"killer (`dmesg` shows it): lower config.decode_processes (now {pool_size}; 0 decodes in "
      f"this process) or config.batch, or give the machine more memory; {AGAIN}."
    )
  if code < 0:
    try:
      what = f"was killed by {signal.Signals(-code).name}"
    except ValueError:
      what = f"was killed by signal {-code}"
  else:
    what = f"exited with status {code}" + (" (its error, if any, is above)" if code else "")
  return errors.UserError(
    f"Decode worker process {pid} {what}: set config.decode_processes=0 to decode in this "
    f"process; {AGAIN}."
  )


_NOTHING, _END = object(), object()  # `_Feed.get`: no item at hand; no more items


class _Feed:
  """Items drawn from an iterator by a thread into a bounded queue; an exception the
  iterator raises is raised by `get`."""

  def __init__(self, items: Iterable[Any], size: int):
    self._queue: queue.Queue = queue.Queue(size)
    self._closed = threading.Event()
    threading.Thread(
      target=self._run, args=(iter(items),), daemon=True, name="vit_jax-decode-feed"
    ).start()

  def _run(self, items: Iterator[Any]) -> None:
    try:
      for item in items:
        if not self._put(item):
          return
      self._put(_END)
    except BaseException as e:  # noqa: BLE001  # raised where the items are used
      self._put(e)
    finally:
      close = getattr(items, "close", None)
      if close is not None:
        close()  # ends the reader's read-ahead now, in this thread

  def _put(self, item: Any) -> bool:
    """Puts ``item``, waiting for room; False once closed."""
    while not self._closed.is_set():
      try:
        self._queue.put(item, timeout=_FEED_POLL_SECONDS)
        return True
      except queue.Full:
        pass
    return False

  def get(self, wait: bool) -> Any:
    """The next item, `_END` after the last, or `_NOTHING` (none at hand, not ``wait``)."""
    try:
      item = self._queue.get(block=wait)
    except queue.Empty:
      return _NOTHING
    if isinstance(item, BaseException):
      raise item
    return item

  def close(self) -> None:
    self._closed.set()


class Pool:
  """Worker processes that run one `example_images.Preprocessing` on groups of examples,
  and the shared memory they write the images into.

  ``preprocessing_args``: its (settings, kind, train). `map` serves one stream at a time;
  a stream closed early waits for its tasks in flight, so the next starts clean.
  """

  def __init__(self, preprocessing_args: tuple[Any, ...], count: int):
    self.images = SharedImages()
    self._workers: list[_Worker] = []
    try:
      for _ in range(count):
        self._workers.append(_Worker(preprocessing_args, count))
    except BaseException:
      self.close()
      raise

  def map(
    self, items: Iterable[_Item], task: Callable[[_Item], Task], remote: bool = False
  ) -> Iterator[tuple[_Item, Written]]:
    """(item, its task's `Written`) for each item, in order. The items are drawn in a
    thread (`_Feed`: a slow read never holds back results already decoded); each task goes
    to the worker with the fewest in flight. ``remote``: the tasks' files are on a bucket
    (more tasks held by each worker: `_REMOTE_IN_FLIGHT`)."""
    in_flight = _REMOTE_IN_FLIGHT if remote else _IN_FLIGHT
    feed = _Feed(items, in_flight * len(self._workers))
    window = 2 * in_flight * len(self._workers)  # tasks sent ahead of the next one yielded
    pending: collections.deque[_Item] = collections.deque()  # sent, not yet yielded
    done: dict[int, Written] = {}
    sent = received = 0
    ended = False

    def free_worker() -> _Worker | None:
      """The worker with the fewest tasks in flight, if it and the window have room."""
      worker = min(self._workers, key=lambda w: len(w.sent))
      room = not ended and len(worker.sent) < in_flight and sent - received < window
      return worker if room else None

    try:
      while True:
        while (worker := free_worker()) is not None:
          item = feed.get(wait=received == sent)
          if item is _NOTHING or item is _END:
            ended = item is _END
            break
          worker.send(task(item))
          worker.sent.append(sent)
          pending.append(item)
          sent += 1
        if received == sent:
          if ended:
            return
          continue
        if received in done:
          yield pending.popleft(), done.pop(received)
          received += 1
          continue
        busy = {w.results: w for w in self._workers if w.sent}
        silent = min(busy.values(), key=_Worker.deadline)  # the first to pass its deadline
        wait = silent.deadline() - time.monotonic()
        poll = min(wait, _FEED_POLL_SECONDS) if free_worker() else wait
        ready = connection.wait(list(busy), timeout=max(poll, 0.0))
        if not ready and time.monotonic() >= silent.deadline():
          raise silent.stop_silent()
        for ready_results in ready:
          worker = busy[ready_results]
          number = worker.sent.popleft()  # first: a result that raises is received too
          done[number] = worker.receive()
    finally:
      feed.close()
      self._drain()

  def _drain(self) -> None:
    """Waits for (and drops) the results of tasks still in flight; a worker silent past its
    deadline is stopped (the pool is then not `alive`, so it is closed, not reused)."""
    for worker in self._workers:
      while worker.sent:
        if not worker.results.poll(max(worker.deadline() - time.monotonic(), 0)):
          worker.stop_silent()
          break
        worker.sent.popleft()
        try:
          worker.receive()
        except Exception:  # noqa: BLE001  # the stream is over; a broken worker shows next time
          worker.sent.clear()

  def alive(self) -> bool:
    """Whether every worker still runs (a pool with a dead one is closed, not reused)."""
    return all(w.process.poll() is None for w in self._workers)

  def close(self) -> None:
    for worker in self._workers:
      worker.end()
    for worker in self._workers:
      worker.wait()
    self._workers = []
    self.images.close()
