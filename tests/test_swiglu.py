"""SwiGLU against timm's own modules (built in the test with random weights): split with
and without EVA-02's inner LayerNorm, and fused."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.models.swiglu import SwiGLU

torch = pytest.importorskip("torch")
mlp = pytest.importorskip("timm.layers.mlp")


def _randomize(module) -> None:
  generator = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for p in module.parameters():
      p.copy_(torch.randn(p.shape, generator=generator) * 0.3)


def _dense(linear) -> dict:
  return {"kernel": linear.weight.detach().numpy().T, "bias": linear.bias.detach().numpy()}


@pytest.mark.parametrize("inner_norm", [False, True])
def test_split_swiglu_equals_timms(inner_norm):
  norm = functools.partial(torch.nn.LayerNorm, eps=1e-6) if inner_norm else None
  theirs = mlp.SwiGLU(16, 40, norm_layer=norm).eval()
  _randomize(theirs)
  params = {name: _dense(getattr(theirs, name)) for name in ("fc1_g", "fc1_x", "fc2")}
  if inner_norm:
    params["norm"] = {
      "scale": theirs.norm.weight.detach().numpy(),
      "bias": theirs.norm.bias.detach().numpy(),
    }
  x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
  ours = SwiGLU(40, inner_norm=inner_norm).apply({"params": params}, jnp.asarray(x), True)
  np.testing.assert_allclose(ours, theirs(torch.from_numpy(x)).detach().numpy(), atol=2e-5)


def test_fused_swiglu_equals_timms_gate_first_glu_mlp():
  theirs = mlp.GluMlp(16, 2 * 24, act_layer=torch.nn.SiLU, gate_last=False).eval()
  _randomize(theirs)
  params = {"fc1": _dense(theirs.fc1), "fc2": _dense(theirs.fc2)}
  x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
  ours = SwiGLU(24, fused=True).apply({"params": params}, jnp.asarray(x), True)
  np.testing.assert_allclose(ours, theirs(torch.from_numpy(x)).detach().numpy(), atol=2e-5)
