"""FlexiViT patch resizing (`vit_jax.models.patchemb`): the defining property on the
model's own patch embedding, timm's resampling on the same kernel, and a timm FlexiViT
(written by timm in the test) imported with its logits and fine-tuned at another patch
size on the built-in digits."""

from __future__ import annotations

import logging
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from tests import interop_fixtures as fx
from tests import train_fixtures
from vit_jax import models, weights
from vit_jax.models import embeddings
from vit_jax.models.patchemb import resample_patch_kernel, resize_matrix
from vit_jax.weights import sources

sys.modules.setdefault("triton", None)  # see tests/test_export.py: triton beside TensorFlow

TOLERANCE = 1e-5  # relative, float32


def _tokens(kernel: np.ndarray, images: np.ndarray) -> np.ndarray:
  """The model's patch embedding (`embeddings.patch_embedding`, bias 0) of ``images``."""
  ph, pw, _, d = kernel.shape

  class Embed(nn.Module):
    @nn.compact
    def __call__(self, x):
      return embeddings.patch_embedding(x, d, (ph, pw), jnp.float32, jnp.float32)

  params = {"embedding": {"kernel": kernel, "bias": np.zeros(d, np.float32)}}
  return np.asarray(Embed().apply({"params": params}, images))  # [B, gh, gw, D]


@pytest.mark.parametrize("old, new", [((8, 8), (16, 16)), ((4, 6), (7, 9)), ((16, 16), (16, 32))])
def test_a_resized_patch_gives_the_token_of_the_resampled_kernel(old, new):
  rng = np.random.default_rng(0)
  kernel = rng.normal(size=(*old, 3, 5)).astype(np.float32)
  patches = rng.uniform(-1, 1, (4, *old, 3)).astype(np.float32)  # one patch per image
  resampled = resample_patch_kernel(kernel, new)
  assert resampled.shape == (*new, 3, 5) and resampled.dtype == np.float32
  # The same bilinear map B, applied to the patches: jax.image.resize (antialiased).
  resized = jax.image.resize(patches, (4, *new, 3), method="bilinear", antialias=True)
  want = _tokens(kernel, patches)
  assert fx.relative_error(_tokens(resampled, np.asarray(resized)), want) <= TOLERANCE
  # Not a plain interpolation of the kernel: that one gives other tokens.
  naive = jax.image.resize(kernel, resampled.shape, method="bilinear")
  assert fx.relative_error(_tokens(np.asarray(naive), np.asarray(resized)), want) > 0.1
  np.testing.assert_allclose(resize_matrix(old, new).sum(axis=1), 1.0, atol=1e-6)


@pytest.mark.parametrize("old, new", [((8, 8), (16, 16)), ((16, 16), (8, 8)), ((8, 8), (12, 12))])
def test_the_resampling_equals_timms(old, new):
  torch = pytest.importorskip("torch")
  pytest.importorskip("timm")
  from timm.layers import resample_patch_embed  # pylint: disable=g-import-not-at-top

  kernel = np.random.default_rng(1).normal(size=(*old, 3, 4)).astype(np.float32)
  theirs = resample_patch_embed(
    torch.from_numpy(kernel.transpose(3, 2, 0, 1).copy()),
    list(new),
    interpolation="bilinear",
    antialias=True,
  ).numpy()
  ours = resample_patch_kernel(kernel, new).transpose(3, 2, 0, 1)
  assert fx.relative_error(ours, theirs) <= 1e-4


def test_kernels_of_the_same_size_are_left_alone_and_bad_shapes_named():
  kernel = np.ones((4, 4, 3, 2), np.float32)
  assert resample_patch_kernel(kernel, (4, 4)) is kernel
  with pytest.raises(ValueError, match=r"\[ph, pw, C, D\], got shape \(4, 4\)"):
    resample_patch_kernel(np.ones((4, 4)), (8, 8))


def _flexivit(directory: str):
  """A tiny timm FlexiViT (1 block, width 64, 8x8 patches at 32x32), perturbed, saved in
  the hub's layout; its class token has no position embedding (timm's no_embed_class)."""
  timm = pytest.importorskip("timm")
  torch = pytest.importorskip("torch")
  torch.manual_seed(0)
  net = timm.create_model(
    "flexivit_small",
    pretrained=False,
    depth=1,
    embed_dim=64,
    num_heads=2,
    patch_size=8,
    img_size=32,
    num_classes=5,
  ).eval()
  gen = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for p in net.parameters():
      noise = torch.randn(p.shape, generator=gen)
      p.add_(0.1 * noise) if p.ndim == 1 else p.mul_(5.0).add_(0.02 * noise)
  timm.models.save_for_hf(net, directory, safe_serialization=True)
  return net


def test_a_timm_flexivit_imports_with_its_logits_and_fine_tunes_at_another_patch_size(
  tmp_path, digits_dir, monkeypatch, caplog
):
  import torch  # pylint: disable=g-import-not-at-top

  from configs import vit  # pylint: disable=g-import-not-at-top

  net = _flexivit(str(tmp_path / "flexivit"))
  loaded = sources.load(str(tmp_path / "flexivit"))
  assert loaded.image_size == (32, 32) and tuple(loaded.config.patches.size) == (8, 8)
  posemb = loaded.params["Transformer"]["posembed_input"]["pos_embedding"]
  # FlexiViT's table has no class-token row (timm's no_embed_class): patches only.
  assert posemb.shape == (1, 16, 64) and loaded.config.posemb_patches_only
  images = fx.images(2, 32)
  with torch.no_grad():
    want = net(torch.from_numpy(images.transpose(0, 3, 1, 2).copy())).numpy()
  module = loaded.module()
  ours = np.asarray(jax.jit(lambda p, x: module.apply({"params": p}, x))(loaded.params, images))
  assert fx.relative_error(ours, want) <= TOLERANCE

  # Fine-tuned at 16x16 patches (digits at 32x32: a 2x2 grid): the kernel resampled.
  config = vit.get_config("ti16,digits")
  config.model = models.to_config(loaded.config)
  config.model.patches.size = (16, 16)
  config.data_dir, config.pp.crop, config.pretrained = digits_dir, 32, str(tmp_path / "flexivit")
  config.batch, config.batch_eval, config.shuffle_buffer = 8, 32, 64
  config.test_split = "test[:32]"
  config.total_steps, config.lr.warmup_steps = 2, 1
  config.log_every, config.eval_every, config.checkpoint_every = 1, 100, 100
  adapted = {}
  real_load = weights.load_pretrained

  def spy(*args, **kwargs):
    adapted.update(traverse_util.flatten_dict(real_load(*args, **kwargs), sep="/"))
    return traverse_util.unflatten_dict(dict(adapted), sep="/")

  monkeypatch.setattr(weights, "load_pretrained", spy)
  with caplog.at_level(logging.INFO, logger="absl"):
    _, losses = train_fixtures.fit_and_learn(config)
  assert train_fixtures.fit_notes(caplog.records) == [
    "head: using the fresh one from init_params (5 classes stored, 10 in the model)",
    "position embeddings: bilinear interpolation of the 4x4 grid to 2x2",
    "patch embedding: 8x8 kernel resampled to 16x16 patches (FlexiViT)",
  ]
  stored = loaded.params["embedding"]["kernel"]
  np.testing.assert_allclose(
    adapted["embedding/kernel"], resample_patch_kernel(stored, (16, 16)), rtol=1e-6
  )
  assert adapted["Transformer/posembed_input/pos_embedding"].shape == (1, 4, 64)
  assert losses[-1] < losses[0], losses
