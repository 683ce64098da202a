"""The patch-embedding kernel resampled to another patch size (FlexiViT, Beyer et al. 2023).

The sibling of position-embedding interpolation (`posemb.py`): a kernel w [ph, pw, C, D]
learned on ph x pw patches becomes w' [nh, nw, C, D] for nh x nw patches such that a
patch x resized by bilinear interpolation B gives the token it gave before,
<B x, w'> = <x, w>, i.e. B^T w' = w. The minimum-norm solution is w' = pinv(B^T) w
(big_vision's ``resample_patchemb``, which FlexiViT's checkpoints were trained with;
timm's ``resample_patch_embed`` is the same). For upsampling (nh >= ph, nw >= pw) B has
full column rank and the equation holds exactly; for downsampling it holds in the
least-squares sense. B is `jax.image.resize`'s bilinear map with antialiasing, as
big_vision's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.infra import errors


@functools.cache
def resize_matrix(old_hw: tuple[int, int], new_hw: tuple[int, int]) -> np.ndarray:
  """B [nh * nw, ph * pw]: the bilinear resize of a flattened ph x pw patch (float64)."""
  old_n = old_hw[0] * old_hw[1]
  basis = jnp.eye(old_n, dtype=jnp.float32).reshape(old_n, *old_hw)  # one pixel each
  resized = jax.image.resize(basis, (old_n, *new_hw), method="bilinear", antialias=True)
  return np.asarray(resized, np.float64).reshape(old_n, -1).T


def resample_patch_kernel(kernel: np.ndarray, new_hw: tuple[int, int]) -> np.ndarray:
  """A [ph, pw, C, D] patch-embedding kernel resampled to [nh, nw, C, D] (module docstring)."""
  kernel = np.asarray(kernel)
  if kernel.ndim != 4:
    raise errors.ConfigError(
      f"Expected a patch-embedding kernel [ph, pw, C, D], got shape {kernel.shape}."
    )
  old_hw, new_hw = tuple(kernel.shape[:2]), tuple(int(s) for s in new_hw)
  if old_hw == new_hw:
    return kernel
  if min(new_hw) < 1:
    raise errors.ConfigError(f"Cannot resample a patch kernel to {new_hw}: sizes must be >= 1.")
  pinv = np.linalg.pinv(resize_matrix(old_hw, new_hw).T)  # [nh * nw, ph * pw]
  flat = kernel.reshape(old_hw[0] * old_hw[1], -1).astype(np.float64)  # [ph * pw, C * D]
  return (pinv @ flat).reshape(*new_hw, *kernel.shape[2:]).astype(kernel.dtype)
