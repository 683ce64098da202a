r"""What preprocessing from the checkpoint changes for a timm model: inputs and logits.

    PYTHONPATH=. python docs/timm_preprocessing_parity.py

Builds a tiny timm ViT (vit_tiny_patch16_224 with 2 blocks, random weights moved off
their init, 10 classes) whose ``pretrained_cfg`` says crop_pct=0.9, bicubic, ImageNet
mean/std, saves it in the hub's layout and loads it with `vit_jax.weights.load`. For
photo-like images of several sizes it compares timm's own input and logits
(`create_transform(**resolve_data_config({}, model=m))`) with (1) ours from the
checkpoint's data config (`host_images.prepare(images, loaded.data_config)`) and (2) the
whole image resized bilinearly (the official recipe with the checkpoint's mean/std, what
`predict`, the evaluator and `fewshot` did before the data config was read).
Prints one markdown table.
"""

from __future__ import annotations

import sys
import tempfile

import numpy as np
from PIL import Image

from vit_jax import weights
from vit_jax.data import data_config, host_images

sys.modules.setdefault("triton", None)  # CUDA torch beside TensorFlow: tests/test_export.py
SIZES = [(375, 500), (480, 640), (500, 333), (256, 256)]


def photo(height: int, width: int, seed: int) -> np.ndarray:
  """uint8 [H, W, 3]: gradients, soft-edged discs and grain."""
  rng = np.random.default_rng(seed)
  y, x = np.mgrid[0:height, 0:width] / max(height, width)
  image = np.stack([255 * x, 255 * y, 128 + 60 * np.sin(9 * x * y)], axis=-1)
  for _ in range(6):
    cy, cx, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.05, 0.3)
    inside = 1 / (1 + np.exp(200 * (np.hypot(y - cy, x - cx) - r)))
    image += inside[..., None] * rng.uniform(-90, 90, 3)
  return np.clip(image + rng.normal(0, 8, image.shape), 0, 255).astype(np.uint8)


def main() -> None:
  import timm  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  net = timm.create_model(
    "vit_tiny_patch16_224",
    num_classes=10,
    depth=2,
    pretrained_cfg_overlay=dict(crop_pct=0.9, interpolation="bicubic"),
  ).eval()
  gen = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for p in net.parameters():
      p.add_(0.05 * torch.randn(p.shape, generator=gen)) if p.ndim == 1 else p.mul_(3.0)
  directory = tempfile.mkdtemp()
  timm.models.save_for_hf(net, directory, safe_serialization=True)
  loaded = weights.load(directory)
  module = loaded.module()
  transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=net))
  whole = data_config.official(
    loaded.data_config.input_size, loaded.data_config.mean, loaded.data_config.std
  )
  print(f"data config read: {loaded.data_config}\n")
  print("| image | input diff: ours / whole image | logit rel. diff: ours / whole image |")
  print("|---|---|---|")
  for seed, (h, w) in enumerate(SIZES):
    image = photo(h, w, seed)
    theirs = transform(Image.fromarray(image)).unsqueeze(0)  # [1, 3, H, W]
    with torch.no_grad():
      want = net(theirs).numpy()
    theirs = theirs.permute(0, 2, 3, 1).numpy()
    row = []
    for config in (loaded.data_config, whole):
      x = host_images.prepare(image, config)
      got = np.asarray(module.apply({"params": loaded.params}, x))
      row.append((np.abs(x - theirs).max(), np.abs(got - want).max() / np.abs(want).max()))
    (ix, lx), (iw, lw) = row
    print(f"| {w}x{h} | {ix:.2g} / {iw:.2f} | {lx:.2g} / {lw:.1%} |")


if __name__ == "__main__":
  main()
