"""Stored parameters fitted to a new image-text (two-tower) model: the image tower by the
fine-tuning policy of `fit.fit_params`, the rest as stored.

A LiT or SigLIP run started from a SigLIP, LiT or contrastive checkpoint: the image tower
is fitted as any image model (position embeddings resized, layout converted); the text
tower, temperature and bias must fit as they are, except a bias or an image projection
that one side lacks (SigLIP's ``b`` in a LiT model, LiT's projection in a SigLIP one): the
model's fresh one, or dropped, each noted.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import flax.linen as nn
from absl import logging
from flax import traverse_util

from vit_jax.infra import errors
from vit_jax.infra.aliases import Params
from vit_jax.models import image_text
from vit_jax.weights.npz import check_tree

_OPTIONAL = ("b", "img_head")  # what either side may lack


def fit_two_tower(
  loaded: Params,
  stored_config: Optional[Any],
  init_params: Params,
  model_config: Any,
  fit_image: Callable[..., Params],
  *,
  where: str,
  log_as: str,
  **options: Any,
) -> Params:
  """``loaded`` (a two-tower tree, its config or None) fitted to ``init_params`` of the
  two-tower ``model_config``; ``fit_image``: `fit.fit_params`, given ``options``."""
  image, text = image_text.IMAGE, image_text.TEXT
  if not {image, text} <= set(loaded):
    raise errors.CheckpointError(
      f"The {where} is an image model, not an image-text one (no {image}/ and {text}/): "
      "give it to the image tower alone (an image model's config.pretrained), or start "
      "from an image-text checkpoint."
    )
  init = nn.unbox(dict(init_params))
  stored_image = stored_config.image if stored_config is not None else None
  fitted_image = fit_image(
    loaded[image], stored_image, init[image], model_config.image,
    where=f"{where}'s image tower", log_as=log_as, **options,
  )  # fmt: skip
  got = traverse_util.flatten_dict({k: v for k, v in loaded.items() if k != image}, sep="/")
  want = traverse_util.flatten_dict({k: v for k, v in init.items() if k != image}, sep="/")
  notes = []
  for module in _OPTIONAL:
    stored = [k for k in got if k == module or k.startswith(module + "/")]
    wanted = [k for k in want if k == module or k.startswith(module + "/")]
    if stored and not wanted:
      for key in stored:
        del got[key]
      notes.append(f"dropped the stored {module}: the model has none")
    elif wanted and not stored:
      got.update({k: want[k] for k in wanted})
      notes.append(f"the checkpoint has no {module}: using the fresh one")
  try:
    check_tree(got, want, source="checkpoint")
  except ValueError as e:
    raise errors.CheckpointError(
      str(e).replace("The checkpoint", f"The {where}", 1)
      + "\n  Fix: build the text tower, text length and embedding width the checkpoint has."
    ) from None
  for note in notes:
    logging.info("%s: %s.", log_as, note)
  return {**traverse_util.unflatten_dict(got, sep="/"), image: fitted_image}
