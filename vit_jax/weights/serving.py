"""Serving artifacts of the inference function images [B, H, W, 3] in [-1, 1] -> logits [B, K],
with a symbolic batch dimension:

  * a TensorFlow SavedModel through `jax2tf` (signature 'serving_default', input
    'images'; the parameters are tf.Variables), for TF Serving and TFLite conversion;
  * a `jax.export` artifact (`model.jax_exported`, parameters inside) that any JAX of a
    compatible version runs without this package:
        exported = jax.export.deserialize(open(path, "rb").read())
        logits = exported.call(images)
"""

from __future__ import annotations

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.infra import errors
from vit_jax.infra.aliases import Params

JAX_EXPORTED = "model.jax_exported"


def _apply(module: nn.Module):
  return lambda params, images: module.apply({"params": params}, images)


def write_saved_model(
  directory: str, module: nn.Module, params: Params, image_size: tuple[int, int]
) -> None:
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise errors.ConfigError(
      'The SavedModel export needs TensorFlow: pip install -e ".[tf]", or export another '
      "format (StableHLO, npz, hf, timm)."
    ) from None
  from jax.experimental import jax2tf  # pylint: disable=g-import-not-at-top

  h, w = image_size
  tf_apply = jax2tf.convert(
    _apply(module), polymorphic_shapes=[None, f"(b, {h}, {w}, 3)"], with_gradient=False
  )
  holder = tf.Module()
  holder.params = tf.nest.map_structure(
    lambda v: tf.Variable(np.asarray(v), trainable=False), params
  )
  holder.serve = tf.function(
    lambda images: tf_apply(holder.params, images),
    autograph=False,
    input_signature=[tf.TensorSpec([None, h, w, 3], tf.float32, name="images")],
  )
  tf.saved_model.save(holder, directory, signatures={"serving_default": holder.serve})


def jax_exported(module: nn.Module, params: Params, image_size: tuple[int, int]) -> bytes:
  """The serialised `jax.export.Exported` of the logits for a symbolic batch."""
  (batch,) = jax.export.symbolic_shape("b")
  images = jax.ShapeDtypeStruct((batch, *image_size, 3), jnp.float32)
  params = jax.tree.map(jnp.asarray, params)
  exported = jax.export.export(jax.jit(lambda x: _apply(module)(params, x)))(images)
  return exported.serialize()


def write_jax_exported(
  directory: str, module: nn.Module, params: Params, image_size: tuple[int, int]
) -> None:
  with open(os.path.join(directory, JAX_EXPORTED), "wb") as f:
    f.write(jax_exported(module, params, image_size))
