"""A `vit_jax.Model` as a Flax NNX module, for code written against NNX (Flax's current
API): the model's parameters as ``nnx.Param`` variables, trained by ``nnx.Optimizer``, and
the way back to a `Model` that saves and exports.

    view = model.to_nnx()                              # NNXModel; view.params: nnx.Param tree
    optimizer = nnx.Optimizer(view, optax.adamw(1e-4), wrt=nnx.Param)
    grads = nnx.grad(lambda v: loss(v(x), y))(view)
    optimizer.update(view, grads)
    view.to_model().save("tuned")                      # a Model again

The view wraps the linen module rather than re-implementing it (as `flax.nnx.bridge.ToNNX`
does), so its outputs are the `Model`'s own: the same function of the same arrays. Unlike
``ToNNX`` it needs no sample input to initialise (the arrays exist) and keeps the `Model`'s
facts (config, preprocessing, class names) for `to_model`. It runs the model as evaluation
does (no dropout, no stochastic depth).
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx


def _is_variable(value: Any) -> bool:
  return isinstance(value, nnx.Variable)


class NNXModel(nnx.Module):
  """The parameters of a `vit_jax.Model` as ``nnx.Param`` (``params``, the model's tree)
  and its forward functions; made by `vit_jax.Model.to_nnx`."""

  def __init__(self, model: Any):
    # Static: the `Model`'s treedef (its config, preprocessing and class names).
    self._treedef = jax.tree.structure(model)
    self.params = nnx.data(jax.tree.map(nnx.Param, model.params))

  def to_model(self) -> Any:
    """The `vit_jax.Model` of the current parameters (it saves, exports and predicts)."""
    values = jax.tree.map(lambda v: v[...], self.params, is_leaf=_is_variable)
    return jax.tree.unflatten(self._treedef, jax.tree.leaves(values))

  def __call__(self, x: jax.Array) -> jax.Array:
    """Logits [B, K] of model inputs [B, H, W, 3] (`vit_jax.Model.logits`)."""
    return self.to_model().logits(x)

  def features(self, x: jax.Array, pool: bool = True) -> jax.Array:
    """Pre-logits [B, D], or every token [B, N, D] (`vit_jax.Model.features`)."""
    return self.to_model().features(x, pool=pool)
