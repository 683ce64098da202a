"""Orbax's save event loops closed only after every write they started has ended.

An asynchronous Orbax save runs its writes as tasks of a fresh asyncio event loop
(`asyncio_utils._run_sync_via_new_loop`: run the save coroutine, then close the loop).
When one write fails (a full disk), the coroutine ends at the first error while the
other tasks still wait on tensorstore writes; the loop is closed under them, and each
write that ends afterwards reports into the closed loop from a tensorstore thread: one
`RuntimeError: Event loop is closed` traceback each, hundreds of lines printed before
the run's own one-line error. `drain_before_close` replaces that runner with one that
waits for the loop's remaining tasks (their errors are the save's error, already
raised) before it closes the loop, so a failed save ends quietly in that one error. The
runner is private to Orbax (`compat.HOOKS["orbax_loop_runner"]`, orbax-checkpoint 0.12.5
on): an older Orbax is one warning line, and its failed saves may print its tracebacks.
"""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine, TypeVar

from vit_jax.infra import compat

_T = TypeVar("_T")


def run_then_drain(coro: Coroutine[Any, Any, _T]) -> _T:
  """Runs ``coro`` in a fresh event loop; whatever it ends with, the loop's other tasks
  run to their end before the loop is closed (their own errors are dropped)."""
  loop = asyncio.new_event_loop()
  try:
    asyncio.set_event_loop(loop)
    return loop.run_until_complete(coro)
  finally:
    pending = asyncio.all_tasks(loop)
    if pending:
      loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    asyncio.set_event_loop(None)
    loop.close()


def drain_before_close() -> bool:
  """Makes Orbax close its save loops with `run_then_drain`; idempotent. Whether this
  Orbax has the runner (`compat.replace_orbax_loop_runner`)."""
  return compat.replace_orbax_loop_runner(run_then_drain)
