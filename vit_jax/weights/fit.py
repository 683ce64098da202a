"""Pre-trained weights adapted to a new model for fine-tuning (paper Sec. 3.2).

`load_pretrained` reads a stored checkpoint (any source `vit_jax.weights.sources` reads: an
official `.npz`, a training run's Orbax checkpoints, a Hugging Face or timm checkpoint,
``hf-hub:<org>/<name>`` or an official name such as ``ViT-B_16``) and applies the
fine-tuning policy: head and representation-layer rules, class token, position embeddings
interpolated to the new grid, the encoder layout of the new model, and one error naming
what does not fit.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from flax import traverse_util

from vit_jax import models
from vit_jax.infra import errors
from vit_jax.models import image_text
from vit_jax.models.embeddings import REGISTERS
from vit_jax.models.mpp import MPP_PARAMS
from vit_jax.models.posemb import check_resize_method
from vit_jax.weights import architecture, fit_grid, sources
from vit_jax.weights.fit_towers import fit_two_tower
from vit_jax.weights.npz import Params, check_tree, is_scanned, to_layout

_MAX_DETAIL_LINES = 40  # of check_tree's list, in load_pretrained's error


def _gelu_note(stored: Any, model_config: Any) -> Optional[str]:
  """A note when the source's library computes the other GELU than the model will."""
  kind = {True: "tanh", False: "exact (erf)"}
  theirs, ours = stored.get("gelu_approximate", True), model_config.get("gelu_approximate", True)
  if theirs == ours:
    return None
  return (
    f"the checkpoint's library computes the {kind[theirs]} GELU, the model the {kind[ours]} "
    f"one (config.model.gelu_approximate={ours}; weights converted from the official "
    "ones were trained with tanh)"
  )


def _use_fresh(got: dict[str, Any], want: Mapping[str, Any], module: str) -> None:
  """Replaces the top-level ``module``'s arrays in ``got`` by the fresh ones in ``want``."""
  for key in [k for k in got if k.startswith(module + "/")]:
    del got[key]
  got.update({k: v for k, v in want.items() if k.startswith(module + "/")})


def _drop(got: dict[str, Any], module: str) -> None:
  for key in [k for k in got if k == module or k.startswith(module + "/")]:
    del got[key]


def _adapt_objective_params(got: dict[str, Any], want: Mapping[str, Any], notes: list[str]) -> None:
  """Masked patch prediction's own parameters: dropped, or fresh when the source lacks them."""
  for module in MPP_PARAMS:
    stored, wanted = (
      [k for k in tree if k == module or k.startswith(module + "/")] for tree in (got, want)
    )
    if stored and not wanted:
      _drop(got, module)
      notes.append(f"dropped {module} (masked patch prediction): the model has none")
    elif wanted and not stored:
      got.update({k: want[k] for k in wanted})
      notes.append(f"the checkpoint has no {module}: using the fresh one")


def _adapt_representation_and_head(
  got: dict[str, Any],
  want: Mapping[str, Any],
  representation_size: Optional[int],
  reset_head: bool,
  notes: list[str],
) -> None:
  """The representation-layer and head rules of `load_pretrained`, applied to ``got``."""
  # Representation layer (before the head: a changed one makes the stored head meaningless).
  stored_rep = got["pre_logits/kernel"].shape[-1] if "pre_logits/kernel" in got else None
  pre_logits_changed = stored_rep != representation_size
  if pre_logits_changed:
    if representation_size is None:
      _drop(got, "pre_logits")
      notes.append(
        f"dropped the representation layer pre_logits (size {stored_rep}): the model has none"
      )
    else:
      _use_fresh(got, want, "pre_logits")
      notes.append(
        f"representation layer pre_logits: size {stored_rep} stored, "
        f"{representation_size} in the model; using the fresh one"
      )

  # Head.
  if "head/kernel" not in want:
    if "head/kernel" in got:
      notes.append(
        f"dropped the stored head ({got['head/kernel'].shape[-1]} classes): the model has none"
      )
    _drop(got, "head")
  else:
    num_classes = want["head/kernel"].shape[-1]
    stored_head = got.get("head/kernel")
    reason = None
    if reset_head:
      reason = "reset_head=True"
    elif stored_head is None:
      reason = "the checkpoint has no head"
    elif stored_head.shape[-1] != num_classes:
      reason = f"{stored_head.shape[-1]} classes stored, {num_classes} in the model"
    elif pre_logits_changed:
      reason = "its input (the representation layer) changed"
    elif np.shape(stored_head) != np.shape(want["head/kernel"]):
      reason = (
        f"input size {stored_head.shape[0]} stored, {want['head/kernel'].shape[0]} in the model"
      )
    if reason:
      _use_fresh(got, want, "head")
      notes.append(f"head: using the fresh one from init_params ({reason})")


def _adapt_prefix_tokens(
  got: dict[str, Any], want: Mapping[str, Any], classifier: str, notes: list[str]
) -> None:
  """Drops a surplus stored class token or registers, takes missing ones fresh (and
  registers of another count)."""
  if "cls" in got and "cls" not in want:
    del got["cls"]
    notes.append(f"dropped the stored class token: the model's classifier is {classifier!r}")
  elif "cls" in want and "cls" not in got:
    got["cls"] = want["cls"]
    notes.append("the checkpoint has no class token: using the fresh one")
  stored, wanted = (np.shape(t[REGISTERS])[1] if REGISTERS in t else 0 for t in (got, want))
  if stored != wanted:
    got.pop(REGISTERS, None)
    if wanted:
      got[REGISTERS] = want[REGISTERS]
    notes.append(f"registers: {stored} stored, {wanted} in the model; using the fresh ones")


def _fit_error(
  error: ValueError, got: Mapping[str, Any], want: Mapping[str, Any], where: str
) -> str:
  """`check_tree`'s message with the architecture differences first and a fix last."""
  stored_arch, new_arch = architecture.describe(got), architecture.describe(want)
  diffs = [
    f"    {name}: checkpoint {stored_arch.get(name)} vs model {value}"
    for name, value in new_arch.items()
    if stored_arch.get(name) != value
  ]
  details = str(error).split("\n")[1:]
  if len(details) > _MAX_DETAIL_LINES:
    details = details[:_MAX_DETAIL_LINES] + [
      f"    ... and {len(details) - _MAX_DETAIL_LINES} more lines"
    ]
  lines = [f"The {where} does not fit the model:"]
  if diffs:
    lines += ["  architecture differences:", *diffs]
  lines += details
  lines.append(architecture.family(want).fit_advice)
  return "\n".join(lines)


def load_pretrained(
  source: str | os.PathLike, init_params: Params, model_config: Any, **options: Any
) -> Params:
  """Stored parameters adapted to a new model, with exactly ``init_params``' tree and shapes.

  ``source``: an official-layout `.npz` (per-layer or scanned), an Orbax checkpoint
  folder of this project (a `<workdir>/checkpoints` root, whose newest step is read, or one
  step folder), or a Hugging Face / timm checkpoint, ``hf-hub:`` repository or official name
  (`vit_jax.weights.sources.read_params`). ``init_params``: the new model's fresh
  parameters (their layout, scanned or per-layer, is the result's). ``model_config``: the
  new model's config (`vit_jax.models.get_model_config`). ``options``: `fit_params`'
  ``reset_head``, ``posemb_resize_method``, ``stored_grid_hw``, ``new_grid_hw``:

  * head: kept when the class count and input are unchanged; otherwise, or with
    ``reset_head``, the fresh (zero) head of ``init_params``; dropped when the model has none.
  * ``pre_logits``: dropped when the config has no ``representation_size``, kept at the same
    size, fresh at another size (the head is then fresh too).
  * position embeddings: interpolated to the new grid (``posemb_resize_method``) with the
    prefix-token rows (class token, registers) kept apart; missing prefix tokens or rows are
    taken fresh, surplus ones dropped. The stored grid is square unless ``stored_grid_hw``
    is given; the new grid is read from ``init_params`` (pass ``new_grid_hw`` when it is
    not square).
    ``posemb_resize_method='reinit'`` takes them all fresh from ``init_params`` instead.
  * masked patch prediction's ``mask_embedding`` and ``mpp_head``: dropped when the model
    has none (fine-tuning an MPP run), fresh when the checkpoint has none.
  * patch size: a stored patch-embedding kernel of another patch size is resampled to the
    model's (FlexiViT, `vit_jax.models.patchemb`).
  * an MLP-Mixer checkpoint fits a Mixer of the same shape and number of patches (its
    token-mixing MLP fixes them); only the head is adapted.
  Anything else that does not fit (width, depth, heads, MLP) raises one ValueError.
  """
  source = os.fspath(source)
  check_resize_method(options.get("posemb_resize_method", "bilinear"))  # before any reading
  loaded, stored_config = _image_tower(*sources.read_params(source), model_config)
  where = f"checkpoint {source!r}"
  fitted = fit_params(
    loaded,
    stored_config,
    init_params,
    model_config,
    where=where,
    log_as=f"load_pretrained({source})",
    **options,
  )
  logging.info("load_pretrained: %d arrays from %s.", len(jax.tree.leaves(fitted)), source)
  return fitted


def _image_tower(
  loaded: Params, stored_config: Optional[Any], model_config: Any
) -> tuple[Params, Optional[Any]]:
  """A two-tower tree (``img``, ``txt``: SigLIP, CLIP, LiT, a contrastive run) read for an
  image model: its image tower and that tower's config; any other tree as it is."""
  two_tower_tree = {image_text.IMAGE, image_text.TEXT} <= set(loaded)
  if models.family_of(model_config).image_tree or not two_tower_tree:
    return loaded, stored_config
  image = None if stored_config is None else stored_config.image
  return loaded[image_text.IMAGE], image


def fit_params(
  loaded: Params,
  stored_config: Optional[Any],
  init_params: Params,
  model_config: Any,
  *,
  reset_head: bool = False,
  posemb_resize_method: str = "bilinear",
  stored_grid_hw: Optional[tuple[int, int]] = None,
  new_grid_hw: Optional[tuple[int, int]] = None,
  where: str = "parameters",
  log_as: str = "fit_params",
) -> Params:
  """`load_pretrained`'s policy on a tree in memory (``loaded``, its model config
  ``stored_config`` or None): the parameters of a new head, resolution or layout. Each
  adaptation is logged as '<log_as>: <note>.' (``where`` names the tree in errors). For an
  image-text ``model_config`` the image tower is fitted so and the rest kept
  (`fit_towers.fit_two_tower`)."""
  check_resize_method(posemb_resize_method)
  if models.family_of(model_config).image_tree:  # an image tower beside the rest
    return fit_two_tower(
      loaded, stored_config, init_params, model_config, fit_params, where=where, log_as=log_as,
      reset_head=reset_head, posemb_resize_method=posemb_resize_method,
      stored_grid_hw=stored_grid_hw, new_grid_hw=new_grid_hw,
    )  # fmt: skip
  init_tree = nn.unbox(dict(init_params))
  want = traverse_util.flatten_dict(init_tree, sep="/")

  # The config must describe the model that init_params came from (a Mixer's has no class
  # token, representation layer or position embeddings).
  classifier = model_config.get("classifier", "gap")
  representation_size = model_config.get("representation_size")
  posemb_kind = model_config.get("posemb", "none")
  rep_in_init = want["pre_logits/kernel"].shape[-1] if "pre_logits/kernel" in want else None
  has_cls = models.create_model(model_config, num_classes=None).has_class_token
  if has_cls != ("cls" in want) or representation_size != rep_in_init:
    raise errors.CheckpointError(
      f"model_config (classifier={classifier!r}, representation_size={representation_size}) "
      f"does not describe init_params (class token: {'cls' in want}, representation size: "
      f"{rep_in_init}): pass the config the model was built from."
    )

  if "Transformer" in loaded and any(k.startswith("encoderblock") for k in loaded["Transformer"]):
    try:
      loaded = to_layout(loaded, is_scanned(init_tree))
    except ValueError as e:
      raise errors.CheckpointError(f"The {where} has a malformed encoder: {e}") from e
  got = traverse_util.flatten_dict(loaded, sep="/")
  notes: list[str] = []
  if stored_config is not None and (note := _gelu_note(stored_config, model_config)):
    notes.append(note)

  _adapt_objective_params(got, want, notes)
  _adapt_representation_and_head(got, want, representation_size, reset_head, notes)
  stored_prefix = fit_grid.posemb_prefix_rows(got, stored_config, model_config)
  new_prefix = architecture.num_prefix_rows(model_config)
  _adapt_prefix_tokens(got, want, classifier, notes)
  grids = fit_grid.Grids(stored_prefix, new_prefix, stored_grid_hw, new_grid_hw)
  notes += fit_grid.adapt_posemb(got, want, posemb_kind, posemb_resize_method, grids, where)
  notes += fit_grid.adapt_relative_tables(got, want, grids, posemb_resize_method)
  notes += fit_grid.adapt_patch_size(got, want)

  # What remains must fit exactly.
  try:
    check_tree(got, want, source="checkpoint")
  except ValueError as e:
    raise errors.CheckpointError(_fit_error(e, got, want, where)) from None

  for note in notes:
    logging.info("%s: %s.", log_as, note)
  return traverse_util.unflatten_dict(
    {k: np.asarray(got[k], dtype=_dtype(v)) for k, v in want.items()}, sep="/"
  )


def _dtype(x: Any) -> np.dtype:
  return np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype
