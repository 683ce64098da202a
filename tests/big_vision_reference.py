"""A minimal reproduction of big_vision's image-text models, their save and load, and their
text tokenization, written from its sources for the tests (big_vision is not installable
here). It follows, module for module and name for name:

- `big_vision/models/vit.py`: ``MlpBlock``, ``Encoder1DBlock``, ``Encoder`` (a Python loop
  or ``nn.scan`` over ``encoderblock``), ``MAPHead``, the ViT (``pool_type`` 'map', 'gap',
  'tok'; learned ``posemb``), ``pyloop_to_scan`` / ``scan_to_pyloop`` in its ``load``;
- `big_vision/models/proj/image_text/text_transformer.py` (pool 'last' or 'map');
- `big_vision/models/proj/image_text/two_towers.py` (``out_dim``, ``t``, ``b``) and its
  ``load`` of one file's ``img``, ``txt``, ``t``, ``b``;
- `big_vision/utils.py`: the tree flattened with '/' into ``np.savez`` (releases under
  ``params/``), ``load_params`` (recover the tree, take ``params``);
- `big_vision/pp/ops_text.py` ``tokenize``: `tf.strings.lower` (ASCII letters only, as
  `bytes.lower`), the SentencePiece ids with the end token, truncated keeping the end
  token ('sticky'), padded with ``pad_value``.

Where it differs: no dropout, remat, dtypes or sharding constraints (none changes the
values in evaluation); the class token and the image head start random, not at zero (a
zero head would give zero embeddings); the tokenizer runs the Python `sentencepiece` with
``add_eos`` rather than `tensorflow_text`'s op over the same model.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util


class MlpBlock(nn.Module):
  mlp_dim: int

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    x = nn.gelu(nn.Dense(self.mlp_dim)(x))  # flax's default: the tanh form
    return nn.Dense(d)(x)


class Encoder1DBlock(nn.Module):
  mlp_dim: int
  num_heads: int

  @nn.compact
  def __call__(self, x, _=None):
    y = nn.LayerNorm()(x)
    x = x + nn.MultiHeadDotProductAttention(num_heads=self.num_heads)(y, y)
    y = nn.LayerNorm()(x)
    return x + MlpBlock(self.mlp_dim)(y), None


class Encoder(nn.Module):
  depth: int
  mlp_dim: int
  num_heads: int
  scan: bool = False

  @nn.compact
  def __call__(self, x):
    if self.scan:
      x, _ = nn.scan(
        Encoder1DBlock, variable_axes={"params": 0}, split_rngs={"params": True},
        in_axes=nn.broadcast, length=self.depth,
      )(name="encoderblock", mlp_dim=self.mlp_dim, num_heads=self.num_heads)(x, None)  # fmt: skip
    else:
      for i in range(self.depth):
        x, _ = Encoder1DBlock(self.mlp_dim, self.num_heads, name=f"encoderblock_{i}")(x)
    return nn.LayerNorm(name="encoder_norm")(x)


class MAPHead(nn.Module):
  mlp_dim: int
  num_heads: int

  @nn.compact
  def __call__(self, x):
    n, _, d = x.shape
    probe = self.param("probe", nn.initializers.xavier_uniform(), (1, 1, d), x.dtype)
    x = nn.MultiHeadDotProductAttention(num_heads=self.num_heads)(jnp.tile(probe, [n, 1, 1]), x)
    return (x + MlpBlock(self.mlp_dim)(nn.LayerNorm()(x)))[:, 0]


class ViT(nn.Module):
  num_classes: Optional[int]
  patch_size: int
  width: int
  depth: int
  mlp_dim: int
  num_heads: int
  pool_type: str = "gap"
  scan: bool = False

  @nn.compact
  def __call__(self, image):
    p = (self.patch_size, self.patch_size)
    x = nn.Conv(self.width, p, strides=p, padding="VALID", name="embedding")(image)
    n, h, w, c = x.shape
    x = x.reshape(n, h * w, c)
    init = nn.initializers.normal(stddev=1 / np.sqrt(c))
    x = x + self.param("pos_embedding", init, (1, h * w, c), x.dtype)
    if self.pool_type == "tok":
      cls = self.param("cls", nn.initializers.normal(1.0), (1, 1, c), x.dtype)
      x = jnp.concatenate([jnp.tile(cls, [n, 1, 1]), x], axis=1)
    x = Encoder(self.depth, self.mlp_dim, self.num_heads, self.scan, name="Transformer")(x)
    if self.pool_type == "map":
      x = MAPHead(self.mlp_dim, self.num_heads)(x)
    elif self.pool_type == "gap":
      x = x.mean(axis=1)
    else:  # tok
      x = x[:, 0]
    if self.num_classes:
      x = nn.Dense(self.num_classes, name="head", kernel_init=nn.initializers.normal(0.5))(x)
    return x


def _naflex_positions(table, shapes, coords, side):
  """`naflex_vit._pos_emb_resize`: the table resized into a side x side canvas to each
  image's grid ``shapes`` [B, 2], gathered at ``coords`` [B, N, 2] (outside: NaN)."""

  def one(shape, where):
    canvas = jax.image.scale_and_translate(
      table, (side, side, table.shape[-1]), (0, 1), shape / jnp.asarray(table.shape[:2]),
      jnp.asarray([0, 0]), method="bilinear", antialias=True,
    )  # fmt: skip
    numbers = jax.lax.GatherDimensionNumbers(
      offset_dims=(1,), collapsed_slice_dims=(0, 1), start_index_map=(0, 1, 2)
    )
    start = jnp.pad(where, [[0, 0], [0, 1]])
    return jax.lax.gather(canvas, start, numbers, [1, 1, canvas.shape[-1]], mode="fill")

  return jax.vmap(one)(shapes, coords)


def naflex_target_hw(image_hw, patch_size: int, max_sequence_len: int) -> tuple[int, int]:
  """`ops_naflex._get_image_size_for_seq` (divisible_by_patch, eps 1e-5), in TensorFlow:
  the pixel size ``resize_to_sequence`` resizes an image of ``image_hw`` to."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  eps = 1e-5

  def target(ratio):
    hw = tf.cast(image_hw, tf.float32) * ratio
    hw = patch_size * tf.math.ceil(hw / patch_size)
    return tf.cast(tf.maximum(hw, patch_size), tf.int32)

  def search(low, high):
    mid = (low + high) / 2
    feasible = tf.math.reduce_prod(target(mid) / patch_size) <= max_sequence_len
    return tf.cond(feasible, lambda: (mid, high), lambda: (low, mid))

  state = (tf.constant(eps / 10.0), tf.constant(100.0))
  ratio, _ = tf.while_loop(lambda low, high: (high - low) >= eps, search, state)
  return tuple(int(v) for v in target(ratio).numpy())


class NaFlexBlock(nn.Module):
  mlp_dim: int
  num_heads: int

  @nn.compact
  def __call__(self, x, mask):
    y = nn.LayerNorm()(x)
    x = x + nn.MultiHeadDotProductAttention(num_heads=self.num_heads)(y, y, mask=mask)
    return x + MlpBlock(self.mlp_dim)(nn.LayerNorm()(x))


class NaFlexEncoder(nn.Module):
  depth: int
  mlp_dim: int
  num_heads: int

  @nn.compact
  def __call__(self, x, mask):
    for i in range(self.depth):
      x = NaFlexBlock(self.mlp_dim, self.num_heads, name=f"encoderblock_{i}")(x, mask)
    return nn.LayerNorm(name="encoder_norm")(x)


class NaFlexMAPHead(nn.Module):
  mlp_dim: int
  num_heads: int

  @nn.compact
  def __call__(self, x, mask):
    n, _, d = x.shape
    probe = self.param("probe", nn.initializers.xavier_uniform(), (1, 1, d), x.dtype)
    attention = nn.MultiHeadDotProductAttention(num_heads=self.num_heads)
    x = attention(jnp.tile(probe, [n, 1, 1]), x, mask=mask[..., None, None, :])
    return (x + MlpBlock(self.mlp_dim)(nn.LayerNorm()(x)))[:, 0]


class NaFlexViT(nn.Module):
  """`naflex_vit._Model` (posemb 'learn_2d(side)', pool 'map' or 'gap'): input (patches
  [B, N, P * P * 3], ptype [B, N] 1 a patch 0 padding, row [B, N], column [B, N])."""

  num_classes: int
  width: int
  depth: int
  mlp_dim: int
  num_heads: int
  nposemb: int
  pool_type: str = "map"
  side: int = 64

  @nn.compact
  def __call__(self, image):
    patches, ptype, yabs, xabs = image
    x = nn.Dense(self.width, name="embedding")(patches)
    init = nn.initializers.normal(stddev=1 / np.sqrt(self.width))
    table = self.param("pos_embedding", init, (self.nposemb, self.nposemb, self.width))
    coords = jnp.stack([yabs, xabs], axis=-1)
    x = x + _naflex_positions(table, coords.max(axis=1) + 1, coords, self.side)
    valid = ptype == 1
    mask = (valid[..., :, None] & valid[..., None, :])[..., None, :, :]
    x = NaFlexEncoder(self.depth, self.mlp_dim, self.num_heads, name="Transformer")(x, mask)
    if self.pool_type == "map":
      x = NaFlexMAPHead(self.mlp_dim, self.num_heads, name="MAPHead_0")(x, valid)
    else:  # gap
      weights = valid[..., None]
      x = jnp.sum(x * weights, axis=1) / jnp.sum(weights, axis=1)
    return nn.Dense(self.num_classes, name="head", kernel_init=nn.initializers.normal(0.5))(x)


class TextTransformer(nn.Module):
  num_classes: Optional[int]
  width: int
  depth: int
  mlp_dim: int
  num_heads: int
  vocab_size: int
  pool_type: str = "last"
  scan: bool = False

  @nn.compact
  def __call__(self, text):
    x = nn.Embed(num_embeddings=self.vocab_size, features=self.width)(text)
    _, length, d = x.shape
    init = nn.initializers.normal(1 / np.sqrt(d))
    x = x + self.param("pos_embedding", init, (1, length, d))
    x = Encoder(self.depth, self.mlp_dim, self.num_heads, self.scan)(x)  # Encoder_0
    x = MAPHead(self.mlp_dim, self.num_heads)(x) if self.pool_type == "map" else x[:, -1]
    if self.num_classes:
      x = nn.Dense(self.num_classes, name="head")(x)
    return x


class TwoTowers(nn.Module):
  image: dict
  text: dict
  out_dim: Any  # int or (image, text)
  temperature_init: float = 10.0
  bias_init: Optional[float] = -10.0
  naflex: bool = False  # the image tower is `NaFlexViT` (SigLIP 2 NaFlex), else `ViT`

  @nn.compact
  def __call__(self, image, text):
    dims = (self.out_dim, self.out_dim) if isinstance(self.out_dim, int) else self.out_dim
    zimg = ztxt = None
    if text is not None:
      ztxt = TextTransformer(dims[1], **self.text, name="txt")(text)
      ztxt = ztxt / (jnp.linalg.norm(ztxt, axis=1, keepdims=True) + 1e-8)
    if image is not None:
      tower = NaFlexViT if self.naflex else ViT
      zimg = tower(dims[0], **self.image, name="img")(image)
      zimg = zimg / (jnp.linalg.norm(zimg, axis=1, keepdims=True) + 1e-8)
    t_init = jnp.log(self.temperature_init)
    t = self.param("t", lambda k, s: t_init * jnp.ones(s), (1,))
    out = {"t": jnp.exp(t)}
    if self.bias_init is not None:
      out["b"] = self.param("b", lambda k, s: self.bias_init * jnp.ones(s), (1,))
    return zimg, ztxt, out


def probabilities(model: TwoTowers, params: Any, images, ids) -> np.ndarray:
  """The demo notebooks' probabilities: sigmoid(t zimg . ztxt + b); LiT's softmax."""
  zimg, ztxt, out = jax.jit(model.apply)({"params": params}, images, ids)
  logits = zimg @ ztxt.T * out["t"]
  if "b" in out:
    return np.asarray(jax.nn.sigmoid(logits + out["b"]))
  return np.asarray(jax.nn.softmax(logits, axis=-1))


# ------------------------------------------------------------------ save and load


def save(path: str, params: Any, *, prefix: bool = True) -> None:
  """`np.savez` of the '/'-flattened tree, under ``params/`` as releases are."""
  flat = traverse_util.flatten_dict(jax.device_get(params), sep="/")
  np.savez(path, **{("params/" if prefix else "") + k: np.asarray(v) for k, v in flat.items()})


def load_params(path: str) -> dict:
  """utils.load_params: the tree recovered from the flat keys, ``params`` taken."""
  with np.load(path, allow_pickle=False) as archive:
    tree = traverse_util.unflatten_dict({k: archive[k] for k in archive.files}, sep="/")
  return tree.get("params", tree)


def _scan_to_pyloop(tower: dict) -> dict:
  t = dict(tower["Transformer"])
  stacked = t.pop("encoderblock")
  depth = len(stacked["LayerNorm_0"]["bias"])
  for i in range(depth):
    t[f"encoderblock_{i}"] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return {**tower, "Transformer": t}


def _pyloop_to_scan(tower: dict) -> dict:
  t = dict(tower["Transformer"])
  depth = len([k for k in t if k.startswith("encoderblock_")])
  blocks = [t.pop(f"encoderblock_{i}") for i in range(depth)]
  t["encoderblock"] = jax.tree.map(lambda *xs: np.stack(xs), *blocks)
  return {**tower, "Transformer": t}


def load(path: str, image_scan: bool) -> dict:
  """two_towers.load of one file: ``img`` (vit.load: the layout converted to the model's
  ``scan``), ``txt`` (as stored: text_transformer.load converts nothing), ``t``, ``b``."""
  tree = load_params(path)
  img = tree["img"]
  if image_scan and "encoderblock" not in img["Transformer"]:
    img = _pyloop_to_scan(img)
  if not image_scan and "encoderblock" in img["Transformer"]:
    img = _scan_to_pyloop(img)
  return {**tree, "img": img}


# ------------------------------------------------------------------------- tokenize


def tokenize(
  texts: Sequence[str], vocabulary: str, max_len: int, *, pad_value: int, lower: bool = True
) -> np.ndarray:
  """ops_text.tokenize(max_len, eos='sticky', pad_value=..., lower=...) of each text."""
  import sentencepiece

  sp = sentencepiece.SentencePieceProcessor(model_file=vocabulary)
  rows = []
  for text in texts:
    if lower:  # tf.strings.lower's default: ASCII letters only, as bytes.lower
      text = text.encode("utf-8").lower().decode("utf-8")
    tokens = sp.encode(text, add_eos=True)
    if len(tokens) >= max_len:
      tokens = tokens[: max_len - 1] + tokens[-1:]
    else:
      tokens = tokens + [pad_value] * (max_len - len(tokens))
    rows.append(tokens)
  return np.asarray(rows, np.int32)
