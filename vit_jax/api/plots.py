"""Matplotlib figures of the `vit_jax.api.analysis` results (paper Fig. 6-7).

The figures draw on the Agg canvas through the object-oriented API (no pyplot state, no
``plt.show``); a notebook displays the returned `Figure`, a script calls ``fig.savefig``.
matplotlib is an optional extra, imported only when a figure is drawn, so importing
`vit_jax` never needs it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from vit_jax.api.analysis import check_ndim, resize_map

if TYPE_CHECKING:
  from matplotlib.figure import Figure


def _figure(width: float, height: float) -> Figure:
  """A figure on its own Agg canvas: savefig works, no pyplot/global backend involved."""
  try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
  except ImportError as e:
    raise ImportError(
      "vit_jax.api.plots draws with matplotlib, which is not installed: "
      'pip install "vit_jax[notebooks]" (or pip install matplotlib).'
    ) from e
  fig = Figure(figsize=(width, height))
  FigureCanvasAgg(fig)
  return fig


def _display_image(image: np.ndarray) -> np.ndarray:
  """[H, W, 3] in [-1, 1] (the model's input) or uint8 -> float in [0, 1]."""
  image = check_ndim("image", image, 3, "[H, W, 3]")
  if image.dtype == np.uint8:
    return image.astype(np.float32) / 255.0
  if image.min() < -1.001 or image.max() > 1.001:
    raise ValueError(
      f"image values span [{image.min():.3g}, {image.max():.3g}]: pass the "
      "model input in [-1, 1] ((x - 127.5) / 127.5) or uint8 pixels."
    )
  return np.clip((image.astype(np.float32) + 1.0) / 2.0, 0.0, 1.0)


def plot_attention_overlay(image: np.ndarray, attention_map: np.ndarray) -> Figure:
  """Image, its attention map, and the image weighted by the map (paper Fig. 6).

  ``image`` is [H, W, 3] in [-1, 1] or uint8; ``attention_map`` is [gh, gw] (e.g. one
  entry of `attention_rollout`) or already [H, W].
  """
  shown = _display_image(image)  # [H, W, 3]
  mask = resize_map(attention_map, shown.shape[:2])  # [H, W]
  fig = _figure(9, 3.2)
  axes = fig.subplots(1, 3)
  for ax, picture, title in zip(
    axes, (shown, mask, shown * mask[..., None]), ("image", "attention", "overlay")
  ):
    ax.imshow(picture, cmap="inferno" if picture.ndim == 2 else None, vmin=0, vmax=1)
    ax.set_title(title)
    ax.axis("off")
  return fig


def plot_mean_attention_distance(distances: np.ndarray) -> Figure:
  """Mean attention distance [L, H] as one point per head against depth (Fig. 7 right)."""
  distances = check_ndim("distances", distances, 2, "[L, H]")
  num_layers, num_heads = distances.shape
  fig = _figure(4.5, 4)
  ax = fig.subplots()
  depth = np.arange(1, num_layers + 1)
  for h in range(num_heads):
    ax.scatter(depth, distances[:, h], s=14, label=f"head {h + 1}")
  ax.set_xlabel("network depth (layer)")
  ax.set_ylabel("mean attention distance (pixels)")
  ax.set_xlim(0.5, num_layers + 0.5)
  ax.set_ylim(bottom=0)
  if num_heads <= 16:
    ax.legend(fontsize="x-small", ncol=2)
  return fig


def plot_posemb_similarity(similarity: np.ndarray) -> Figure:
  """One small cosine-similarity map per patch, laid out on the patch grid (Fig. 7 centre)."""
  similarity = check_ndim("similarity", similarity, 4, "[gh, gw, gh, gw]")
  gh, gw = similarity.shape[:2]
  if similarity.shape[2:] != (gh, gw):
    raise ValueError(f"similarity must be [gh, gw, gh, gw], got {similarity.shape}.")
  fig = _figure(0.6 * gw + 1.2, 0.6 * gh + 0.4)
  axes = fig.subplots(gh, gw, squeeze=False)
  image = None
  for r in range(gh):
    for c in range(gw):
      image = axes[r, c].imshow(similarity[r, c], cmap="viridis", vmin=-1, vmax=1)
      axes[r, c].set_xticks([])
      axes[r, c].set_yticks([])
  for c in range(gw):
    axes[-1, c].set_xlabel(str(c + 1), fontsize="x-small")
  for r in range(gh):
    axes[r, 0].set_ylabel(str(r + 1), fontsize="x-small")
  fig.colorbar(image, ax=axes, shrink=0.8, label="cosine similarity")
  return fig


def plot_embedding_filters(components: np.ndarray, columns: int = 7) -> Figure:
  """The RGB embedding-filter components [K, P, P, 3] in [0, 1] as a grid (Fig. 7 left)."""
  components = check_ndim("components", components, 4, "[K, P, P, C]")
  k = components.shape[0]
  columns = max(1, min(columns, k))
  rows = math.ceil(k / columns)
  fig = _figure(1.0 * columns, 1.0 * rows + 0.3)
  axes = fig.subplots(rows, columns, squeeze=False)
  for i, ax in enumerate(axes.reshape(-1)):
    ax.axis("off")
    if i < k:
      ax.imshow(np.clip(components[i], 0, 1))
  fig.suptitle("principal components of the embedding filters", fontsize="small")
  return fig


def plot_inference_cost(
  curves: dict[str, tuple[Sequence[int], Sequence[float], Sequence[int]]],
) -> Figure:
  """Inference speed and the largest batch per core against the input size (Fig. 12).

  ``curves``: model name -> (input sizes, images per second per core, largest batch per
  core), one point per size. Left: speed; right: batch; both on log axes, a line and
  markers per model (the BiT ResNets dashed).
  """
  fig = _figure(9, 3.6)
  speed_ax, batch_ax = fig.subplots(1, 2)
  for name, (sizes, speeds, batches) in curves.items():
    if not len(sizes) == len(speeds) == len(batches):
      raise ValueError(f"{name}: {len(sizes)} sizes, {len(speeds)} speeds, {len(batches)} batches")
    style = "--" if name.startswith("BiT") else "-"
    speed_ax.plot(sizes, speeds, style, marker="o", markersize=4, label=name)
    batch_ax.plot(sizes, batches, style, marker="o", markersize=4, label=name)
  sizes_drawn = sorted({int(size) for sizes, _, _ in curves.values() for size in sizes})
  for ax, label in (
    (speed_ax, "peak inference speed [img/sec/core]"),
    (batch_ax, "largest per-core batch size"),
  ):
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(sizes_drawn, [str(size) for size in sizes_drawn], minor=False)
    ax.set_xticks([], minor=True)
    ax.set_xlabel("input size [px]")
    ax.set_ylabel(label)
    ax.grid(True, which="both", alpha=0.3)
  batch_ax.legend(fontsize="x-small")
  fig.tight_layout()
  return fig
