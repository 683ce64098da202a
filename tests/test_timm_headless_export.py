"""A model without a head (timm's ``num_classes=0``) exports to timm as timm builds one:
the ViT and Eva from a headless timm checkpoint, read back by timm's ``local-dir:``; the
Mixer and BiT (shapes timm has no name for) rebuilt from the export's spec."""

import json
import sys

import pytest

import vit_jax
from tests import interop_fixtures as fx
from tests import test_bit, test_mixer
from vit_jax import export
from vit_jax.weights import sources

sys.modules.setdefault("triton", None)  # see tests/test_export.py: triton beside TensorFlow
timm = pytest.importorskip("timm")
torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


@pytest.mark.parametrize(
  "name, size, kwargs",
  [
    ("vit_tiny_patch16_224", 32, dict(depth=2)),
    ("eva02_tiny_patch14_224", 28, dict(embed_dim=24, depth=2)),
  ],
)
def test_headless_timm_checkpoint_exports_and_timm_loads_it_headless(tmp_path, name, size, kwargs):
  net = timm.create_model(name, pretrained=False, num_classes=0, img_size=size, **kwargs).eval()
  fx.perturb_torch(net)
  timm.models.save_for_hf(net, str(tmp_path / "in"), safe_serialization=True)
  model = vit_jax.load(str(tmp_path / "in"))
  assert model.num_classes is None
  out = model.save(tmp_path / "out", format="timm")
  back = timm.create_model(f"local-dir:{out}", pretrained=True, num_classes=0).eval()
  assert back.num_classes == 0 and isinstance(back.head, torch.nn.Identity)
  x = fx.images(2, size)
  ours = model(x)  # [2, D] pre-logits
  assert ours.shape == (2, net.num_features)
  assert fx.relative_error(fx.torch_logits(back, x), ours) <= fx.TOLERANCE
  assert fx.relative_error(fx.torch_logits(net, x), ours) <= fx.TOLERANCE


@pytest.mark.parametrize(
  "config, size, rebuild",
  [
    (test_mixer.tiny_config(), 16, test_mixer.rebuild_timm),
    (test_bit.tiny_config(), 32, test_bit.rebuild_timm),
  ],
  ids=["mixer", "bit"],
)
def test_headless_mixer_and_bit_export_as_timms_num_classes_0(tmp_path, config, size, rebuild):
  params = fx.random_tree(config, None, size)
  model = sources.LoadedModel(config, params, None, (size, size), None, "tiny")
  export.export_model(model, "timm", str(tmp_path / "timm"))
  spec = json.loads((tmp_path / "timm" / "timm_model.json").read_text())
  assert spec["kwargs"]["num_classes"] == spec["pretrained_cfg_overlay"]["num_classes"] == 0
  net = rebuild(spec)
  net.load_state_dict(safetensors_torch.load_file(str(tmp_path / "timm" / "model.safetensors")))
  x = fx.images(2, size)
  ours = fx.logits(config, params, x, None)  # [2, D] pooled features
  assert fx.relative_error(fx.torch_logits(net, x), ours) <= fx.TOLERANCE
