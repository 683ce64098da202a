"""A model without a head (timm's ``num_classes=0``) exports to timm as timm builds one."""

import sys

import pytest

import vit_jax
from tests import interop_fixtures as fx

sys.modules.setdefault("triton", None)  # see tests/test_export.py: triton beside TensorFlow
timm = pytest.importorskip("timm")
torch = pytest.importorskip("torch")


def test_headless_timm_vit_exports_and_timm_loads_it_headless(tmp_path):
  net = timm.create_model(
    "vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=32, depth=2
  ).eval()
  fx.perturb_torch(net)
  timm.models.save_for_hf(net, str(tmp_path / "in"), safe_serialization=True)
  model = vit_jax.load(str(tmp_path / "in"))
  assert model.num_classes is None
  out = model.save(tmp_path / "out", format="timm")
  back = timm.create_model(f"local-dir:{out}", pretrained=True, num_classes=0).eval()
  assert back.num_classes == 0 and isinstance(back.head, torch.nn.Identity)
  x = fx.images(2, 32)
  ours = model(x)  # [2, 192] pre-logits
  assert ours.shape == (2, 192)
  assert fx.relative_error(fx.torch_logits(back, x), ours) <= fx.TOLERANCE
  assert fx.relative_error(fx.torch_logits(net, x), ours) <= fx.TOLERANCE
