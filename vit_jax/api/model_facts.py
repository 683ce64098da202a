"""What a `vit_jax.Model` is besides its parameters: the static half of its pytree.

JAX compares the static half of two pytrees to decide whether they are one type: whether
`jax.tree.map` may combine them and whether `jax.jit` reuses a compiled function. So the
facts compare and hash by value (the model config, head, image size, class names,
preprocessing, tokenizer and batch size): two loads of one architecture are one type,
and checkpoint averaging, model soups and an EMA copy combine them. Where a model was read
from (``source``) and the run config it was trained with are not what it is: a soup of
two runs' models keeps the first's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Hashable, Optional

import jax

from vit_jax.weights import sources


class Facts:
  """One model's static facts (module docstring), with the jitted functions of its
  eager path (``compiled``: kind -> jitted apply; not compared)."""

  def __init__(self, loaded: sources.LoadedModel, batch_size: int):
    self.loaded = dataclasses.replace(loaded, params=None)  # the facts, not the arrays
    self.batch_size = batch_size
    self.compiled: dict[str, Callable[..., jax.Array]] = {}
    self._key: Optional[tuple[Hashable, ...]] = None

  def key(self) -> tuple[Hashable, ...]:
    """The facts by value, computed once (a model's facts do not change)."""
    if self._key is None:
      loaded = self.loaded
      names = None if loaded.class_names is None else tuple(loaded.class_names)
      size = None if loaded.image_size is None else tuple(loaded.image_size)
      self._key = (
        loaded.config,  # frozen settings: equal and hashed by value
        loaded.num_classes,
        size,
        names,
        loaded.data_config,
        _tokenizer_key(loaded.tokenizer),
        self.batch_size,
      )
    return self._key

  def __eq__(self, other: object) -> bool:
    return isinstance(other, Facts) and (self is other or self.key() == other.key())

  def __hash__(self) -> int:
    return hash(self.key())


def _tokenizer_key(tokenizer: Any) -> Optional[Hashable]:
  """An image-text model's tokenizer by value (`Tokenizer.fingerprint`); None for none."""
  return None if tokenizer is None else tokenizer.fingerprint()
