"""Inspecting ViT (paper Sec. 4.5, Appendix D.7-D.8, Fig. 6-7): the analyses.

* `attention_weights`: every layer's and head's attention for a batch, [L, B, H, N, N].
* `attention_rollout` / `rollout_matrix` / `resize_map`: Attention Rollout (Abnar &
  Zuidema, 2020), the maps of Fig. 6 / 14.
* `mean_attention_distance`: attention-weighted pixel distance per layer and head (Fig. 7
  right).
* `posemb_similarity`: cosine similarity between position embeddings (Fig. 7 centre).
* `embedding_filter_components`: principal components of the RGB patch-embedding
  filters (Fig. 7 left).

Inputs and outputs are numpy arrays: these are analysis tools, not jitted training code.
`vit_jax.api.plots` draws them; this module needs no matplotlib.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util

from vit_jax.models.posemb import sincos_2d, square_grid
from vit_jax.models.vit import VisionTransformer

_ATTENTION = "MultiHeadDotProductAttention_1/attention_weights"
_LAYER_KEY = re.compile(r"^Transformer/encoderblock(?:_(\d+))?/" + re.escape(_ATTENTION) + "$")


# ----------------------------------------------------------------------------- checks


def check_ndim(name: str, x: np.ndarray, ndim: int, layout: str) -> np.ndarray:
  """``x`` as an array with ``ndim`` axes (``layout`` names them in the error); also for plots."""
  x = np.asarray(x)
  if x.ndim != ndim:
    raise ValueError(f"{name} must be {layout} ({ndim} axes), got shape {x.shape}.")
  return x


def _check_hw(name: str, hw: Sequence[int]) -> tuple[int, int]:
  hw = tuple(int(v) for v in hw)
  if len(hw) != 2 or min(hw) <= 0:
    raise ValueError(f"{name} must be two positive ints (height, width), got {hw}.")
  return hw  # type: ignore[return-value]


def _check_weights(weights: np.ndarray) -> np.ndarray:
  weights = check_ndim("weights", weights, 5, "[L, B, H, N, N]")
  if weights.shape[-1] != weights.shape[-2]:
    raise ValueError(f"weights must be square over tokens [L, B, H, N, N], got {weights.shape}.")
  return weights.astype(np.float64)


def _check_grid(n: int, grid_hw: tuple[int, int], num_prefix: int) -> None:
  gh, gw = grid_hw
  if n != gh * gw + num_prefix:
    raise ValueError(
      f"{n} tokens do not match grid_hw={grid_hw} plus num_prefix={num_prefix} "
      f"({gh * gw + num_prefix} tokens): pass model.grid_hw(image_hw) and num_prefix=1 "
      "for a class-token model, 0 otherwise."
    )


def _params_tree(params: Mapping[str, Any]) -> Mapping[str, Any]:
  """Accepts ``{'params': tree}`` or the tree itself, boxed (nn.Partitioned) or not."""
  params = nn.unbox(params)
  if "params" in params and "Transformer" not in params:
    params = params["params"]
  return params


# ------------------------------------------------------------------- attention weights


def attention_weights(
  model: VisionTransformer, params: Mapping[str, Any], images: np.ndarray
) -> np.ndarray:
  """Attention probabilities of every layer and head for a batch, [L, B, H, N, N].

  N counts the class token (first) when ``model.config.classifier == 'token'``. Works with the
  per-layer and the scanned (``scan=True``) encoder; ``params`` must match the model's
  layout (`vit_jax.weights.npz.to_layout` converts).
  """
  images = check_ndim("images", images, 4, "[B, H, W, C] in [-1, 1]")
  model.grid_hw(images.shape[1:3])  # a clear error if the size does not fit the patches
  _, state = model.apply(
    {"params": _params_tree(params)}, images, train=False, mutable=["intermediates"]
  )
  flat = traverse_util.flatten_dict(state["intermediates"], sep="/")
  layers: list[tuple[int, np.ndarray]] = []
  for key, value in flat.items():
    match = _LAYER_KEY.match(key)
    if match is None:
      continue
    (array,) = value  # `sow` stores a 1-tuple
    array = np.asarray(jax.device_get(array), np.float32)
    if match.group(1) is None:  # scanned: already [L, B, H, N, N]
      layers.extend(enumerate(array))
    else:
      layers.append((int(match.group(1)), array))  # [B, H, N, N]
  if not layers:
    raise ValueError(
      "The model sowed no attention weights: is it a vit_jax "
      "VisionTransformer with an encoder of at least one block?"
    )
  layers.sort(key=lambda item: item[0])
  return np.stack([a for _, a in layers])  # [L, B, H, N, N]


# --------------------------------------------------------------------- attention rollout


def rollout_matrix(weights: np.ndarray) -> np.ndarray:
  """Attention Rollout over all layers, [B, N, N] (Abnar & Zuidema, 2020).

  Per layer: mean over heads, plus the identity for the residual path, rows renormalised
  to sum to 1. The layers compose as R = A_L ... A_1 (the first layer acts first), so
  R[b, i, j] is how much output token i draws on input token j.
  """
  weights = _check_weights(weights)  # [L, B, H, N, N]
  n = weights.shape[-1]
  eye = np.eye(n)
  rollout = np.broadcast_to(eye, (weights.shape[1], n, n)).copy()  # [B, N, N]
  for layer in weights:  # [B, H, N, N]
    a = layer.mean(axis=1) + eye  # [B, N, N]
    a = a / a.sum(axis=-1, keepdims=True)
    rollout = a @ rollout
  return rollout


def attention_rollout(
  weights: np.ndarray, *, num_prefix: int = 1, grid_hw: tuple[int, int]
) -> np.ndarray:
  """The rollout map from the output token to the input patches, [B, gh, gw].

  With a class token (``num_prefix >= 1``, class token first) the map is the class
  token's rollout row. Models without one (``classifier='gap'``, ``num_prefix=0``) pool
  every output token, so the map is the mean over all output rows. Prefix columns are
  dropped; values are not renormalised (`resize_map` rescales for display).
  """
  weights = _check_weights(weights)
  grid_hw = _check_hw("grid_hw", grid_hw)
  _check_grid(weights.shape[-1], grid_hw, num_prefix)
  rollout = rollout_matrix(weights)  # [B, N, N]
  rows = rollout[:, 0] if num_prefix > 0 else rollout.mean(axis=1)  # [B, N]
  return rows[:, num_prefix:].reshape(-1, *grid_hw)  # [B, gh, gw]


def resize_map(attention_map: np.ndarray, image_hw: tuple[int, int]) -> np.ndarray:
  """Bilinearly resizes a [gh, gw] map to [H, W] and min-max rescales it to [0, 1].

  A constant map (no preference) becomes all ones, so an overlay shows the whole image.
  """
  attention_map = check_ndim("attention_map", attention_map, 2, "[gh, gw]")
  image_hw = _check_hw("image_hw", image_hw)
  resized = np.asarray(
    jax.image.resize(attention_map.astype(np.float32), image_hw, method="bilinear"), np.float64
  )  # [H, W]
  low, high = resized.min(), resized.max()
  if high - low <= 1e-12 * max(abs(high), 1.0):
    return np.ones(image_hw, np.float32)
  return ((resized - low) / (high - low)).astype(np.float32)


# -------------------------------------------------------------- mean attention distance


def patch_centre_distances(grid_hw: tuple[int, int], patch_px: tuple[int, int]) -> np.ndarray:
  """Euclidean pixel distance between the centres of every pair of patches, [N, N]."""
  (gh, gw), (ph, pw) = _check_hw("grid_hw", grid_hw), _check_hw("patch_px", patch_px)
  rows, cols = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
  y = (rows.reshape(-1) + 0.5) * ph  # [N]
  x = (cols.reshape(-1) + 0.5) * pw  # [N]
  return np.hypot(y[:, None] - y[None, :], x[:, None] - x[None, :])  # [N, N]


def mean_attention_distance(
  weights: np.ndarray, *, grid_hw: tuple[int, int], patch_px: tuple[int, int], num_prefix: int
) -> np.ndarray:
  """Mean attention distance in pixels per layer and head, [L, H] (paper Fig. 7 right).

  For each query patch: the sum over key patches of attention weight times the pixel
  distance between the patch centres; then the mean over query patches and images.
  Only patch -> patch attention counts: prefix tokens (the class token) have no
  position, so their rows and columns are dropped and each query's remaining weights are
  renormalised to sum to 1. ``patch_px`` is the pixels per token, `model.input_stride`
  (which includes a hybrid's ResNet stride).
  """
  weights = _check_weights(weights)  # [L, B, H, N, N]
  grid_hw = _check_hw("grid_hw", grid_hw)
  _check_grid(weights.shape[-1], grid_hw, num_prefix)
  w = weights[..., num_prefix:, num_prefix:]  # [L, B, H, P, P]
  mass = w.sum(axis=-1)  # [L, B, H, P]
  if np.any(mass <= 0):
    raise ValueError(
      "Some query patch puts no attention on any patch; the mean distance "
      "is undefined for it. Pass softmax attention (e.g. from "
      "attention_weights)."
    )
  dist = patch_centre_distances(grid_hw, patch_px)  # [P, P]
  per_query = np.einsum("lbhqk,qk->lbhq", w, dist) / mass  # [L, B, H, P]
  return per_query.mean(axis=(1, 3))  # [L, H]


# ------------------------------------------------------------ position-embedding similarity


def _cosine_similarity(vectors: np.ndarray) -> np.ndarray:
  """[N, D] -> [N, N] cosine similarity."""
  vectors = np.asarray(vectors, np.float64)
  norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
  unit = vectors / np.maximum(norms, 1e-12)
  return unit @ unit.T


def posemb_similarity(
  params: Mapping[str, Any], model: VisionTransformer, image_hw: Optional[tuple[int, int]] = None
) -> np.ndarray:
  """Cosine similarity of each patch's position embedding with every other, [gh, gw, gh, gw].

  ``sim[r, c]`` is the map of Fig. 7 (centre) for the patch in row r, column c. The grid
  comes from the parameters for learned kinds (a 1-D table must then be square unless
  ``image_hw`` is given); ``sincos2d`` has no parameters and needs ``image_hw``. The
  class-token row of a learned 1-D table is dropped.
  """
  kind = model.config.posemb
  grid_hw = None if image_hw is None else model.grid_hw(_check_hw("image_hw", image_hw))
  tree = _params_tree(params)
  if kind == "none":
    raise ValueError(
      "posemb='none' has no position embeddings to compare: use a model "
      "with posemb 'learn', 'learn_2d' or 'sincos2d'."
    )
  if kind == "sincos2d":
    if grid_hw is None:
      raise ValueError(
        "posemb='sincos2d' has no parameters to read the grid from: pass "
        "image_hw=(H, W), the image size the model sees."
      )
    table = sincos_2d(grid_hw, model.config.hidden_size)  # [N, D]
  else:
    try:
      pe = {k: np.asarray(v) for k, v in tree["Transformer"]["posembed_input"].items()}
    except KeyError as e:
      raise ValueError(
        f"params have no Transformer/posembed_input for posemb={kind!r}: "
        "pass the parameters of this model."
      ) from e
    if kind == "learn":
      num_prefix = 1 if model.config.classifier == "token" else 0
      table = pe["pos_embedding"][0, num_prefix:]  # [N, D]
      if grid_hw is None:
        grid_hw = square_grid(table.shape[0], "pass image_hw=(H, W)")
    elif kind == "learn_2d":
      pe_x = pe["pos_embedding_x"][0, 0]  # [gw, D/2]
      pe_y = pe["pos_embedding_y"][0, :, 0]  # [gh, D/2]
      found = (pe_y.shape[0], pe_x.shape[0])
      if grid_hw is not None and grid_hw != found:
        raise ValueError(
          f"image_hw={image_hw} gives grid {grid_hw}, but the parameters "
          f"hold a {found} grid: pass the image size they were trained at."
        )
      grid_hw = found
      gh, gw = grid_hw
      table = np.concatenate(
        [
          np.broadcast_to(pe_x[None], (gh, gw, pe_x.shape[-1])),
          np.broadcast_to(pe_y[:, None], (gh, gw, pe_y.shape[-1])),
        ],
        axis=-1,
      ).reshape(gh * gw, -1)  # [N, D]
    else:
      raise ValueError(f"Unknown posemb kind {kind!r}.")
  gh, gw = grid_hw
  if table.shape[0] != gh * gw:
    raise ValueError(
      f"{table.shape[0]} position embeddings do not match the {gh}x{gw} grid "
      f"of image_hw={image_hw}: pass the image size the parameters fit."
    )
  return _cosine_similarity(table).reshape(gh, gw, gh, gw).astype(np.float32)


# ------------------------------------------------------------- embedding filter components


def principal_components(vectors: np.ndarray, num_components: int) -> np.ndarray:
  """The top principal directions of M vectors [M, F], as orthonormal rows [K, F].

  The vectors are centred (PCA of their spread, not of their mean); signs are fixed so
  that each component's largest-magnitude entry is positive (SVD signs are arbitrary).
  """
  vectors = check_ndim("vectors", vectors, 2, "[M, F]").astype(np.float64)
  limit = min(vectors.shape)
  if not 1 <= num_components <= limit:
    raise ValueError(
      f"num_components={num_components} must be in 1..{limit} "
      f"for {vectors.shape[0]} vectors of size {vectors.shape[1]}."
    )
  centred = vectors - vectors.mean(axis=0, keepdims=True)
  _, _, vt = np.linalg.svd(centred, full_matrices=False)  # rows: orthonormal directions
  comps = vt[:num_components]  # [K, F]
  signs = np.sign(comps[np.arange(num_components), np.abs(comps).argmax(axis=1)])
  return comps * signs[:, None]


def embedding_filter_components(params: Mapping[str, Any], num_components: int = 28) -> np.ndarray:
  """Principal components of the RGB patch-embedding filters, [K, P, P, C] in [0, 1].

  The D filters of ``embedding/kernel`` [P, P, C, D] are vectors of P*P*C; each principal
  component is reshaped to a patch and min-max rescaled to [0, 1] for display as RGB.
  """
  tree = _params_tree(params)
  if "conv_root" in tree or "embedding" not in tree:
    raise ValueError(
      "Embedding filters are RGB patches only in a plain ViT; this is a "
      "hybrid (or not a ViT), whose embedding runs on ResNet features. "
      "Use the parameters of a plain ViT."
    )
  kernel = np.asarray(tree["embedding"]["kernel"])  # [P, P, C, D]
  if kernel.ndim != 4 or kernel.shape[2] != 3:
    raise ValueError(
      f"embedding/kernel {kernel.shape} is not [P, P, 3, D]: RGB filters "
      "exist only for a plain ViT on RGB images."
    )
  ph, pw, c, d = kernel.shape
  filters = kernel.reshape(ph * pw * c, d).T  # [D, P*P*C]
  comps = principal_components(filters, num_components)  # [K, P*P*C]
  low, high = comps.min(axis=1, keepdims=True), comps.max(axis=1, keepdims=True)
  comps = (comps - low) / np.maximum(high - low, 1e-12)
  return comps.reshape(num_components, ph, pw, c).astype(np.float32)
