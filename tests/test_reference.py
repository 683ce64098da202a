"""Our model against an independent float64 numpy reference of the official model's formulas.

The reference follows google-research/vision_transformer's `models_vit.py` and
`models_resnet.py` as formulas, not as code: pre-LayerNorm blocks (epsilon 1e-6), attention
scaled by 1/sqrt(Dh), a tanh-approximated GELU in the MLP (Flax's `nn.gelu` default), and
for the hybrids a ResNet root of weight-standardised convolutions ``(w - mean) /
(std + 1e-5)``, GroupNorm(32) with Flax's default epsilon 1e-6, a 7x7 stride-2 root conv and
a 3x3 stride-2 max-pool (both SAME), and bottleneck units whose first unit in each stage
projects the shortcut (stage strides 1, 2, 2, ...). It reads only the parameter tree.
"""

import flax.linen as nn
import jax
import numpy as np
import pytest
import scipy.special
from flax import traverse_util

from vit_jax.models import create_model, get_model_config


# The transformer shrunk to seconds; the ResNet stages keep their official unit counts.
def _tiny(config, **changes):
  """The model of ``config`` at width 32, depth 2, MLP 64, 2 heads, 10 classes."""
  config.hidden_size = 32
  config.transformer.update(num_layers=2, mlp_dim=64, num_heads=2)
  config.update(changes)
  return create_model(config, num_classes=10)


# ---------------------------------------------------------------- the reference, numpy float64


def _pad_same(x, k, s, value=0.0):
  """Pads H and W as XLA's SAME: output ceil(size / s), the odd pixel after."""
  pads = [(0, 0)]
  for size in x.shape[1:3]:
    total = max((-(-size // s) - 1) * s + k - size, 0)
    pads.append((total // 2, total - total // 2))
  return np.pad(x, pads + [(0, 0)], constant_values=value)


def _conv(x, w, stride, same):
  """x: [B, H, W, Cin], w: [kh, kw, Cin, Cout] -> [B, H', W', Cout]."""
  kh, kw = w.shape[:2]
  if same:
    x = _pad_same(x, kh, stride)
  oh, ow = (x.shape[1] - kh) // stride + 1, (x.shape[2] - kw) // stride + 1
  out = 0.0
  for i in range(kh):
    for j in range(kw):
      window = x[:, i : i + stride * oh : stride, j : j + stride * ow : stride]  # [B, oh, ow, Cin]
      out = out + window @ w[i, j]
  return out


def _max_pool_3x3_s2_same(x):
  x = _pad_same(x, 3, 2, value=-np.inf)
  oh, ow = (x.shape[1] - 3) // 2 + 1, (x.shape[2] - 3) // 2 + 1
  return np.max(
    [x[:, i : i + 2 * oh : 2, j : j + 2 * ow : 2] for i in range(3) for j in range(3)], axis=0
  )


def _std_conv(x, w, stride):
  w = w - w.mean(axis=(0, 1, 2))
  w = w / (w.std(axis=(0, 1, 2)) + 1e-5)
  return _conv(x, w, stride, same=True)


def _group_norm(x, p, groups=32, eps=1e-6):
  b, h, w, c = x.shape
  g = x.reshape(b, h, w, groups, c // groups)
  mean = g.mean(axis=(1, 2, 4), keepdims=True)
  var = g.var(axis=(1, 2, 4), keepdims=True)
  return ((g - mean) / np.sqrt(var + eps)).reshape(x.shape) * p["scale"] + p["bias"]


def _relu(x):
  return np.maximum(x, 0.0)


def _bottleneck(x, p, stride, project):
  residual = x
  if project:
    residual = _group_norm(_std_conv(x, p["conv_proj"]["kernel"], stride), p["gn_proj"])
  y = _relu(_group_norm(_std_conv(x, p["conv1"]["kernel"], 1), p["gn1"]))
  y = _relu(_group_norm(_std_conv(y, p["conv2"]["kernel"], stride), p["gn2"]))
  y = _group_norm(_std_conv(y, p["conv3"]["kernel"], 1), p["gn3"])
  return _relu(residual + y)


def _resnet_root(x, p, units_per_stage):
  x = _relu(_group_norm(_std_conv(x, p["conv_root"]["kernel"], 2), p["gn_root"]))
  x = _max_pool_3x3_s2_same(x)
  for s, units in enumerate(units_per_stage):
    for u in range(units):
      x = _bottleneck(
        x, p[f"block{s + 1}"][f"unit{u + 1}"], stride=2 if s and not u else 1, project=u == 0
      )
  return x


def _layer_norm(x, p, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = x.var(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _gelu(x, approximate):
  if approximate:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
  return 0.5 * x * (1 + scipy.special.erf(x / np.sqrt(2)))


def _attention(x, p):
  q, k, v = (
    np.einsum("bnd,dhk->bnhk", x, p[n]["kernel"]) + p[n]["bias"] for n in ("query", "key", "value")
  )  # [B, N, H, Dh]
  logits = np.einsum("bqhk,bnhk->bhqn", q, k) / np.sqrt(q.shape[-1])  # [B, H, N, N]
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  y = np.einsum("bhqn,bnhk->bqhk", weights, v)
  return np.einsum("bqhk,hkd->bqd", y, p["out"]["kernel"]) + p["out"]["bias"]


def _dense(x, p):
  return x @ p["kernel"] + p["bias"]


def reference_logits(params, images, *, resnet_units=None, gelu_approximate=True):
  """The official model's logits (classifier token, learned 1-D posemb), float64."""
  x = images.astype(np.float64)  # [B, H, W, C]
  if resnet_units is not None:
    x = _resnet_root(x, params, resnet_units)
  emb = params["embedding"]
  x = _conv(x, emb["kernel"], emb["kernel"].shape[0], same=False) + emb["bias"]
  b, gh, gw, d = x.shape
  x = x.reshape(b, gh * gw, d)
  x = np.concatenate([np.broadcast_to(params["cls"], (b, 1, d)), x], axis=1)
  t = params["Transformer"]
  x = x + t["posembed_input"]["pos_embedding"]
  for i in range(len([k for k in t if k.startswith("encoderblock_")])):
    blk = t[f"encoderblock_{i}"]
    x = x + _attention(_layer_norm(x, blk["LayerNorm_0"]), blk["MultiHeadDotProductAttention_1"])
    mlp = blk["MlpBlock_3"]
    y = _gelu(_dense(_layer_norm(x, blk["LayerNorm_2"]), mlp["Dense_0"]), gelu_approximate)
    x = x + _dense(y, mlp["Dense_1"])
  x = _layer_norm(x, t["encoder_norm"])[:, 0]
  if "pre_logits" in params:
    x = np.tanh(_dense(x, params["pre_logits"]))
  return _dense(x, params["head"])


# ---------------------------------------------------------------- the comparison


def _random_params(model, image_size, seed=0):
  """Every parameter random (zero-initialised heads and GroupNorms too), fan-in scaled.

  The last GroupNorm of a bottleneck (``gn3``, zero at initialisation) gets a small scale,
  so that residual branches stay small as in a trained ResNet: with unit scales a deep
  random stack amplifies float32 rounding alone past 1e-6.
  """
  shapes = jax.eval_shape(
    lambda: model.init(jax.random.key(0), np.zeros((1, image_size, image_size, 3)))
  )
  flat = traverse_util.flatten_dict(nn.unbox(shapes["params"]))
  rng = np.random.default_rng(seed)
  params = {}
  for path, leaf in sorted(flat.items()):
    noise = rng.standard_normal(leaf.shape)
    if path[-2:] == ("gn3", "scale"):
      value = 0.1 * noise
    elif path[-1] == "scale":
      value = 1.0 + 0.2 * noise
    elif path[-1] == "kernel":
      fan_in = leaf.shape[0] if path[-2] in ("query", "key", "value") else np.prod(leaf.shape[:-1])
      value = noise / np.sqrt(fan_in)
    else:  # biases, class token, position embeddings
      value = 0.2 * noise
    params[path] = value.astype(np.float32)
  return traverse_util.unflatten_dict(params)


def _relative_difference(model, image_size, **reference_kwargs):
  params = _random_params(model, image_size)
  images = np.random.default_rng(1).uniform(-1, 1, (2, image_size, image_size, 3))
  # One jit: one compile instead of one per operation of the eager forward.
  forward = jax.jit(lambda p, x: model.apply({"params": p}, x))
  ours = np.asarray(forward(params, images.astype(np.float32)), np.float64)
  want = reference_logits(params, images, **reference_kwargs)
  assert ours.shape == want.shape == (2, 10)
  return np.linalg.norm(ours - want) / np.linalg.norm(want)


@pytest.mark.parametrize("gelu_approximate", [True, False])
def test_plain_vit_equals_the_official_formulas(gelu_approximate):
  cfg = get_model_config("testing")
  assert cfg.gelu_approximate  # the default is the official (tanh) GELU
  model = _tiny(cfg, representation_size=16, gelu_approximate=gelu_approximate)
  assert _relative_difference(model, 16, gelu_approximate=gelu_approximate) <= 1e-6
  # The two GELUs are told apart at this scale: the bound above is a real check.
  assert _relative_difference(model, 16, gelu_approximate=not gelu_approximate) > 1e-5


@pytest.mark.parametrize(
  "name,units,image_size",
  [
    ("R50+ViT-B_16", (3, 4, 9), 32),  # stride 16: a 2x2 grid
    ("R26+ViT-S_32", (2, 2, 2, 2), 64),  # stride 32: a 2x2 grid
  ],
)
def test_hybrid_equals_the_official_formulas(name, units, image_size):
  # Width factor 0.5: 32 root channels, the fewest GroupNorm(32) allows.
  config = get_model_config(name)
  config.resnet.width_factor = 0.5
  model = _tiny(config)
  assert model.config.resnet.num_layers == units
  assert _relative_difference(model, image_size, resnet_units=units) <= 1e-6
