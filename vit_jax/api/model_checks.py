"""The checks of what a user hands `vit_jax.Model` and `vit_jax.load`: each mistake is one
line naming the fix, raised before anything traces or compiles (model inputs by their shape
and dtype alone, a tracer's too), and the facts `Model` asks of its inputs (traced or not)."""

from __future__ import annotations

import difflib
import os
import warnings
from typing import Any, Optional

import jax
import numpy as np

from vit_jax import models
from vit_jax.infra import errors
from vit_jax.weights import hub
from vit_jax.weights.timm import names as timm_names


def shapes(params: Any) -> dict[str, tuple[int, ...]]:
  """Each array's path and shape."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return {jax.tree_util.keystr(path): tuple(np.shape(v)) for path, v in flat}


def traced(tree: Any) -> bool:
  """Whether a JAX transformation traces ``tree`` (a tracer among its leaves)."""
  return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(tree))


def check_channels_last(images: Any, channels: tuple[int, ...] = (3,)) -> None:
  """An array whose channels come first ([B, 3, H, W] or [3, H, W]: torch's layout) is an
  error naming the transpose in its own library (numpy, torch, jax)."""
  shape = tuple(np.shape(images)) if hasattr(images, "shape") else ()
  if len(shape) not in (3, 4) or shape[-3] != 3 or shape[-1] in channels:
    return
  order, layout = ((0, 2, 3, 1), "NCHW") if len(shape) == 4 else ((1, 2, 0), "CHW")
  library = type(images).__module__.split(".")[0]
  library = library if library in ("torch", "numpy") else "jax" if "jax" in library else "numpy"
  fix = {"torch": f"x.permute{order}", "jax": f"jnp.transpose(x, {order})"}
  raise errors.ConfigError(
    f"Images and model inputs are channels-last ({'[B, ' if len(shape) == 4 else '['}H, W, "
    f"3]); got a channels-first ({layout}) {library} array {shape}: pass "
    f"{fix.get(library, f'x.transpose{order}')}."
  )


def check_inputs(images: Any, image_size: Optional[tuple[int, int]]) -> None:
  """Model inputs read by their shape and dtype alone (a tracer's too): float [B, H, W, 3];
  a uint8 batch or channels-first one is an error naming the fix, before any trace."""
  check_channels_last(images)
  shape, dtype = tuple(np.shape(images)), str(getattr(images, "dtype", ""))
  if "uint8" in dtype or len(shape) != 4 or shape[-1] != 3:
    size = f"{image_size[0]}x{image_size[1]} " if image_size else ""
    raise errors.ConfigError(
      f"Model inputs must be float32 [B, H, W, 3] as model.prepare(images) makes them, got "
      f"{dtype.removeprefix('torch.')} {shape}: call model.prepare(images) first (or "
      f"model.predict(images)) for {size}inputs."
    )


def host_inputs(images: Any, image_size: Optional[tuple[int, int]]) -> np.ndarray:
  """Checked model inputs (`check_inputs`) on the host as float32 [B, H, W, 3]."""
  check_inputs(images, image_size)
  return np.asarray(images).astype(np.float32)


def warn_truncated(tokenizer: Any, texts: list[str], length: int) -> None:
  """A warning when texts have more tokens than the text tower reads (they are cut)."""
  counts = [tokenizer.num_ids(t) for t in texts]
  if max(counts) > length:
    longer = sum(c > length for c in counts)
    warnings.warn(
      f"{longer} of {len(texts)} texts have more than text_len={length} tokens (the longest "
      f"{max(counts)}): each is cut to text_len={length}, as the model reads them; shorten "
      "them to keep what the cut drops.",
      stacklevel=3,
    )


def check_name(source: str) -> None:
  """A bare name (no folder, no scheme) that is neither a file nor an official name: one
  error with the closest names of ours, the hub table's and timm's."""
  if os.path.exists(source) or any(c in source for c in ("/", os.sep, ":")):
    return
  if source.endswith((".npz", ".safetensors")):  # a file: the formats' error names them
    return
  if hub.official_copy(source):
    return
  if timm_names.registered_args(source.split(".")[0]) is not None:
    raise errors.MissingError(
      f"{source!r} is a timm architecture, not a file: vit_jax.load('hf-hub:timm/{source}') "
      f"or vit_jax.create({source!r}, pretrained=True) fetch its weights."
    )
  official = {n.rsplit("/", 1)[-1] for n in hub.table()} | set(models.MODEL_NAMES)
  close = difflib.get_close_matches(source, [*official, *timm_names.names()], n=3)
  close = [n if n in official else f"hf-hub:timm/{n}" for n in close]
  raise errors.MissingError(
    f"No file or known name {source!r}"
    + (f"; did you mean {' or '.join(close)}?" if close else ".")
    + " Pass a path, hf-hub:<org>/<name> or an official name such as ViT-B_16."
  )
