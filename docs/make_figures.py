r"""Draws the "Inspecting ViT" figures (those in docs/figures/) for a trained run.

    python docs/make_figures.py --workdir=/tmp/vit_quickstart      # into a new temp folder
    python docs/make_figures.py --workdir=... --out=/tmp/figures --data_dir=...
    python docs/make_figures.py --workdir=... --out=docs/figures   # replace the repository's

The figures go where ``--out`` says, by default a new folder under the system's temp
folder (printed); the repository's PNGs change only when ``--out`` names docs/figures.

Reads ``<workdir>/config.json`` (written by `run.train_and_evaluate`) and the newest
step of ``<workdir>/checkpoints``, runs the model on the first test batch and writes
(paper Fig. 6 and Fig. 7, left to right):

* ``rollout_digits.png``: Attention Rollout of the class token on a few test images,
  one row per image (image, map, image weighted by the map).
* ``embedding_filters.png``: principal components of the patch-embedding filters.
* ``embedding_filters_grey.png`` (grey datasets such as ``digits`` only): the same for
  the filters averaged over the colour channels, the only part a grey input (R = G = B)
  reaches; the colour differences keep their random initialisation.
* ``posemb_similarity.png``: cosine similarity of each patch's position embedding with
  every other.
* ``mean_attention_distance.png``: attention-weighted pixel distance per head and layer,
  averaged over the test batch; the dashed line is the distance of uniform attention.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import ml_collections
import numpy as np
from PIL import Image

from vit_jax import data
from vit_jax.api import analysis, plots
from vit_jax.infra import sharding
from vit_jax.models import create_model
from vit_jax.weights import orbax_steps

DPI = 80  # small PNGs for the repository
GREY_DATASETS = ("digits",)  # grey images decoded to RGB with R = G = B
PAPER_COMPONENTS = 28  # principal components of the embedding filters in Fig. 7 (left)


def _save(fig, path: str) -> None:
  fig.savefig(path, dpi=DPI, bbox_inches="tight")
  print("wrote", path)


def _pixels(fig) -> np.ndarray:
  """The figure rendered on its Agg canvas, uint8 [H, W, 3]."""
  fig.canvas.draw()
  return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def _distinct_labels(labels: np.ndarray, count: int) -> list[int]:
  """Indices of the first ``count`` images with pairwise different labels."""
  chosen, seen = [], set()
  for i, label in enumerate(labels):
    if int(label) not in seen:
      chosen.append(i)
      seen.add(int(label))
    if len(chosen) == count:
      break
  return chosen


def make_figures(
  workdir: str, out: str, *, data_dir: str | None = None, num_overlays: int = 4
) -> dict[str, float]:
  """Writes the four PNGs into ``out``; returns a few numbers the figures show."""
  with open(os.path.join(workdir, "config.json")) as f:
    config = ml_collections.ConfigDict(json.load(f))
  if data_dir is not None:
    config.data_dir = data_dir
  params = orbax_steps.read_params(os.path.join(workdir, "checkpoints"))
  num_classes = int(np.shape(params["head"]["bias"])[0])
  model = create_model(config.model, num_classes=num_classes)

  mesh = sharding.make_mesh(tuple(tuple(axis) for axis in config.mesh))
  batch = next(iter(data.eval_iterator(config, mesh)))
  real = np.asarray(batch["mask"]) > 0
  images = np.asarray(batch["image"])[real]  # [B, H, W, 3] in [-1, 1]
  labels = np.asarray(batch["label"])[real].argmax(-1)  # [B]
  image_hw = images.shape[1:3]
  grid_hw = model.grid_hw(image_hw)

  logits = np.asarray(model.apply({"params": params}, images, train=False))
  predicted = logits.argmax(-1)
  weights = analysis.attention_weights(model, params, images)  # [L, B, H, N, N]
  rollout = analysis.attention_rollout(weights, num_prefix=1, grid_hw=grid_hw)
  distance = analysis.mean_attention_distance(
    weights, grid_hw=grid_hw, patch_px=model.input_stride, num_prefix=1
  )  # [L, H]

  os.makedirs(out, exist_ok=True)
  rows = []
  for i in _distinct_labels(labels, num_overlays):
    fig = plots.plot_attention_overlay(images[i], rollout[i])
    fig.suptitle(f"test image {i}: label {labels[i]}, predicted {predicted[i]}", fontsize="medium")
    fig.set_dpi(DPI)
    rows.append(_pixels(fig))
  width = max(r.shape[1] for r in rows)
  rows = [np.pad(r, ((0, 0), (0, width - r.shape[1]), (0, 0)), constant_values=255) for r in rows]
  path = os.path.join(out, "rollout_digits.png")
  Image.fromarray(np.concatenate(rows, axis=0)).save(path, optimize=True)
  print("wrote", path)

  kernel = np.asarray(params["embedding"]["kernel"])  # [P, P, 3, D]
  ph, pw, channels, width = kernel.shape  # D filters of P*P*3 values: at most that many
  components = min(PAPER_COMPONENTS, width, ph * pw * channels)  # components (a tiny model)
  _save(
    plots.plot_embedding_filters(analysis.embedding_filter_components(params, components)),
    os.path.join(out, "embedding_filters.png"),
  )
  if config.dataset in GREY_DATASETS:
    grey_kernel = np.repeat(kernel.mean(axis=2, keepdims=True), channels, axis=2)
    grey = {**params, "embedding": {**params["embedding"], "kernel": grey_kernel}}
    # A grey filter has only ph * pw independent entries.
    grey_components = min(PAPER_COMPONENTS, width, ph * pw)
    fig = plots.plot_embedding_filters(
      analysis.embedding_filter_components(grey, num_components=grey_components), columns=8
    )
    fig.suptitle("principal components of the channel-averaged embedding filters", fontsize="small")
    _save(fig, os.path.join(out, "embedding_filters_grey.png"))
  _save(
    plots.plot_posemb_similarity(analysis.posemb_similarity(params, model)),
    os.path.join(out, "posemb_similarity.png"),
  )
  fig = plots.plot_mean_attention_distance(distance)
  uniform = analysis.patch_centre_distances(grid_hw, model.input_stride).mean()
  ax = fig.axes[0]
  ax.set_ylim(0, 1.15 * max(uniform, float(distance.max())))
  ax.axhline(uniform, color="grey", linestyle="--", linewidth=1)
  ax.annotate(
    "uniform attention",
    (0.6, uniform),
    xytext=(0, 3),
    textcoords="offset points",
    color="grey",
    fontsize="x-small",
  )
  if ax.get_legend() is not None:
    ax.legend(loc="lower right", fontsize="x-small", ncol=2)  # clear of the points
  ax.set_title(
    f"{len(images)} test images, {image_hw[0]}x{image_hw[1]} px, "
    f"{model.input_stride[0]} px patches",
    fontsize="small",
  )
  _save(fig, os.path.join(out, "mean_attention_distance.png"))

  accuracy = float((predicted == labels).mean())
  print(f"accuracy on the {len(images)} images: {accuracy:.1%}")
  print("mean attention distance [layer x head] (pixels):")
  print(np.array2string(distance, precision=2))
  return {"accuracy": accuracy, "num_images": float(len(images))}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument(
    "--workdir", required=True, help="a train_and_evaluate workdir (config.json + checkpoints/)"
  )
  parser.add_argument(
    "--out", default=None, help="folder for the PNGs (default: a new temp folder)"
  )
  parser.add_argument("--data_dir", default=None, help="tfds data_dir override")
  parser.add_argument("--num_overlays", type=int, default=4)
  args = parser.parse_args()
  out = args.out or tempfile.mkdtemp(prefix="vit_figures_")
  make_figures(args.workdir, out, data_dir=args.data_dir, num_overlays=args.num_overlays)


if __name__ == "__main__":
  main()
