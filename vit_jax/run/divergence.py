"""Stops a run whose loss, gradient norm or parameters stop being finite (divergence).

The loop checks what it already has: the metrics it reads at log steps, and, before each
save, the step's loss and gradient norm and whether every parameter is finite (one host
read per save, none on other steps). A non-finite value stops the run with one
`DivergenceError` before anything non-finite is saved, so the saved steps stay the last
good ones and retention keeps them.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp

from vit_jax.infra import errors

CHECKED = ("train/loss", "train/grad_norm")


@jax.jit
def _all_finite(params: Any) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(params)]))


class Guard:
  """Remembers the last good and the last saved step; raises on the first bad value."""

  def __init__(self, tunables: Mapping[str, Any], *, restored_step: Optional[int]):
    """``tunables``: {config key: value} of the settings the error advises to change."""
    self._tunables = dict(tunables)
    self.last_good = restored_step
    self.last_saved = restored_step

  def check(self, step: int, metrics: Mapping[str, float]) -> None:
    """Raises DivergenceError when a checked metric of ``step`` is not finite."""
    for key in CHECKED:
      if key in metrics and not math.isfinite(metrics[key]):
        raise self._error(step, f"{key}={metrics[key]}")
    self.last_good = step

  def check_before_save(
    self, step: int, step_metrics: Mapping[str, jax.Array], params: Any
  ) -> None:
    """``check`` of the step's device metrics, and every parameter finite; then it may save."""
    values, finite = jax.device_get(({k: step_metrics[k] for k in CHECKED}, _all_finite(params)))
    self.check(step, {k: float(v) for k, v in values.items()})
    if not finite:
      raise self._error(step, "a parameter is not finite (inf or nan)")
    self.last_saved = step

  def _error(self, step: int, what: str) -> errors.DivergenceError:
    t = self._tunables
    good = (
      f"the last step checked finite is {self.last_good}"
      if self.last_good is not None
      else "no step was checked finite"
    )
    saved = (
      f"the last saved step is {self.last_saved} (kept; the run resumes from it)"
      if self.last_saved is not None
      else "no step was saved"
    )
    return errors.DivergenceError(
      f"Training diverged at step {step}: {what}; {good}, {saved}. Nothing non-finite was "
      f"saved. Try a lower config.lr.base (now {t['lr.base']}) or more "
      f"config.lr.warmup_steps (now {t['lr.warmup_steps']}), a smaller "
      f"config.optim.grad_clip_norm (now {t['optim.grad_clip_norm']}), or float32 for "
      f"config.model.dtype (now {t['model.dtype']!r}) and config.optim.momentum_dtype "
      f"(now {t['optim.momentum_dtype']!r})."
    )
