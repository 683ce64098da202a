r"""How close the Hugging Face export's preprocessing comes to ours, on photo-sized JPEGs.

    PYTHONPATH=. python docs/hf_preprocessing_parity.py --checkpoint=/tmp/vit_quickstart \
        --out=/tmp/hf_parity

Writes 500x375 JPEGs (smooth shapes, gradients and grain, like a photo), exports the
checkpoint to a Hugging Face folder, and compares for each file (1) the model input that
`vit_jax.predict` builds (`host_images.eval_image`: TensorFlow's bilinear resize without
antialiasing) with the one `AutoImageProcessor` builds from the export (torchvision), for
each resample filter it offers and for PyTorch's own non-antialiased bilinear resize, at the
model's resolution and at 224; and (2) the top-class probability through `predict` and
through the export with `AutoImageProcessor`. Prints one table (markdown).
"""

from __future__ import annotations

import os
import sys

import numpy as np
from absl import app, flags

import vit_jax  # noqa: F401  isort: skip  (first: TensorFlow's log level)
from PIL import Image

from vit_jax import export, predict
from vit_jax.data import data_config, host_images
from vit_jax.weights import sources

sys.modules.setdefault("triton", None)  # CUDA torch vs TensorFlow: docs/inference_export.md

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "A checkpoint with a head.", required=True)
_OUT = flags.DEFINE_string(
  "out", None, "A new folder for the images and the export.", required=True
)
_IMAGES = flags.DEFINE_integer("images", 8, "Photo-like JPEGs to write.")


def photo(rng: np.random.Generator, size=(375, 500)) -> np.ndarray:
  """uint8 [H, W, 3]: gradients, a few soft-edged ellipses and grain."""
  h, w = size
  y, x = np.mgrid[0:h, 0:w] / max(h, w)
  image = np.zeros((h, w, 3))
  for c in range(3):
    image[..., c] = 128 + 60 * np.sin(
      rng.uniform(1, 6) * x + rng.uniform(1, 6) * y + rng.uniform(0, 6)
    )
  for _ in range(6):
    (cy, cx), r = rng.uniform(0, 1, 2) * (h, w), rng.uniform(30, 120)
    inside = 1 / (1 + np.exp(((y * max(h, w) - cy) ** 2 + (x * max(h, w) - cx) ** 2) ** 0.5 - r))
    image += inside[..., None] * rng.uniform(-80, 80, 3)
  image += rng.normal(0, 8, image.shape)
  return np.clip(image, 0, 255).astype(np.uint8)


def ours(path: str, crop: int) -> np.ndarray:
  with open(path, "rb") as f:
    return host_images.eval_image(f.read(), data_config.official((crop, crop)))  # [H, W, 3]


def torch_bilinear(path: str, crop: int) -> np.ndarray:
  """PyTorch's bilinear resize without antialiasing, then (x - 127.5) / 127.5."""
  import torch  # pylint: disable=g-import-not-at-top

  x = torch.from_numpy(np.asarray(Image.open(path).convert("RGB"))).permute(2, 0, 1)[None].float()
  x = torch.nn.functional.interpolate(x, (crop, crop), mode="bilinear", antialias=False)
  return ((x[0].permute(1, 2, 0).numpy() - 127.5) / 127.5).clip(-1, 1)


def main(argv) -> None:
  del argv
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  os.makedirs(_OUT.value, exist_ok=True)
  rng = np.random.default_rng(0)
  paths = []
  for i in range(_IMAGES.value):
    paths.append(os.path.join(_OUT.value, f"photo{i}.jpg"))
    Image.fromarray(photo(rng)).save(paths[-1], quality=90)
  hf_dir = os.path.join(_OUT.value, "hf")
  if not os.path.isdir(hf_dir):
    export.export(_CHECKPOINT.value, "hf", hf_dir)
  model = sources.load(_CHECKPOINT.value)
  crop = model.image_size_for()[0]
  hf_model = transformers.ViTForImageClassification.from_pretrained(hf_dir).eval()
  filters = {"bilinear (antialiased)": 2, "bicubic (antialiased)": 3, "nearest": 0}

  print(
    "| preprocessing | size | input: max abs difference | mean | top-class probability: max abs |"
  )
  print("|---|---|---|---|---|")
  classifier = predict.Classifier(model, (crop, crop))
  for size in (crop, 224):
    want = np.stack([ours(p, size) for p in paths])
    probs = (
      classifier.probabilities(np.stack([ours(p, crop) for p in paths])) if size == crop else None
    )
    for name, resample in filters.items():
      processor = transformers.AutoImageProcessor.from_pretrained(
        hf_dir, resample=resample, size={"height": size, "width": size}
      )
      pixels = processor([Image.open(p).convert("RGB") for p in paths], return_tensors="pt")
      got = pixels["pixel_values"].permute(0, 2, 3, 1).numpy()
      diff = np.abs(got - want)
      row = f"| AutoImageProcessor, {name} | {size} | {diff.max():.3f} | {diff.mean():.4f} |"
      if probs is not None:
        with torch.no_grad():
          theirs = torch.softmax(hf_model(pixel_values=pixels["pixel_values"]).logits, -1).numpy()
        rows, top = np.arange(len(paths)), probs.argmax(-1)
        row += f" {np.abs(theirs[rows, top] - probs[rows, top]).max():.4f} |"
      else:
        row += " |"
      print(row)
    got = np.stack([torch_bilinear(p, size) for p in paths])
    diff = np.abs(got - want)
    name = "torch interpolate, bilinear, antialias=False"
    print(f"| {name} | {size} | {diff.max():.3f} | {diff.mean():.4f} | |")


if __name__ == "__main__":
  app.run(main)
