"""Model structure and numerics: shapes, parameter counts, the official tree, options."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from vit_jax.infra import errors
from vit_jax.models import MODEL_NAMES, create_model, get_model_config, sincos_2d
from vit_jax.models.settings import PatchSettings, ResNetSettings
from vit_jax.weights import npz

# Pinned with 1000 classes at 224x224 (B/16, L/16, H/14 equal the paper's exact counts).
PARAM_COUNTS = {
  "ViT-Ti_16": 5_717_416,
  "ViT-S_32": 22_878_952,
  "ViT-S_16": 22_050_664,
  "ViT-B_32": 88_224_232,
  "ViT-B_16": 86_567_656,
  "ViT-B_8": 86_576_872,
  "ViT-L_32": 306_535_400,
  "ViT-L_16": 304_326_632,
  "ViT-H_14": 632_045_800,
  "R50+ViT-B_16": 98_659_112,
  "R26+ViT-S_32": 36_431_912,
  "R+ViT-Ti_16": 6_337_704,
  # The rest of the official repository's table (its models_test.py).
  "R26+ViT-B_32": 101_383_976,
  "R50+ViT-L_32": 328_994_856,
  "ViT-S_16-gap-norep": 22_049_896,
  "ViT-S_32-gap-norep": 22_878_184,
  "ViT-B_16-gap-norep": 86_566_120,
  "ViT-B_32-gap-norep": 88_222_696,
  "testing-unpooled": 21_370,
  # Each Axial-ViT block is two ViT-B blocks (12 x 7,087,872 more than the gap ViT).
  "Axial-ViT-B_32": 88_222_696 + 12 * 7_087_872,
  "Axial-ViT-B_16": 86_566_120 + 12 * 7_087_872,
  "Mixer-B_16": 59_880_472,
  "Mixer-B_32": 60_293_428,
  "Mixer-L_16": 208_196_168,
  # The later families: timm's counts of the same architectures at 1000 classes and 224
  # (tests/test_timm_name_status.py, tests/test_timm_eva.py).
  "SigLIP-B_16": 93_653_224,
  "SigLIP-So400m_14": 428_833_704,
  "SigLIP2-B_16": 93_653_224,
  "SigLIP2-So400m_16": 428_971_944,
  "DINOv2-S_14-reg4": 22_014_952,
  "DINOv2-B_14-reg4": 86_496_232,
  "DINOv2-L_14-reg4": 304_255_976,
  "CLIP-B_16": 86_568_424,
  "CLIP-B_16-quickgelu": 86_568_424,
  "DINOv3-S_16": 21_971_944,  # = timm's (tests/test_timm_eva.py)
  "DINOv3-B_16": 86_410_216,
  "DINOv3-L_16": 304_104_424,
  "EVA02-Ti_14": 5_695_144,
  "EVA02-S_14": 22_006_120,
  "EVA02-B_14": 86_527_720,
  # PE core (at 224) and RoPE-ViT (= timm's): tests/test_timm_eva.py.
  "PE-Core-T_16": 6_162_280,
  "PE-Core-S_16": 23_825_128,
  "PE-Core-B_16": 93_655_528,
  "PE-Core-L_14": 316_799_976,
  "RoPE-ViT-S_16": 21_984_232,
  "RoPE-ViT-B_16": 86_434_792,
  "RoPE-ViT-L_16": 304_174_056,
  "RoPE-Mixed-ViT-B_16": 86_444_008,
  "EVA02-L_14": 304_293_800,
  # The paper's other hybrids (Table 6) and its BiT ResNet baselines (= timm's
  # resnetv2_*_bit, tests/test_bit.py).
  "R50+ViT-B_32": 110_945_832,
  "R50+ViT-L_16": 316_483_624,
  "BiT-R50x1": 25_549_352,
  "BiT-R50x2": 97_988_712,
  "BiT-R101x1": 44_541_480,
  "BiT-R152x1": 60_185_128,
  "BiT-R152x2": 236_335_208,
  "BiT-R152x4": 936_533_224,
  "BiT-R200x3": 568_633_000,
}


def tiny(num_classes=10, **overrides):
  return create_model(get_model_config("testing"), num_classes=num_classes, **overrides)


def init(model, image_size=16, batch=2, seed=0):
  images = jax.random.uniform(
    jax.random.key(seed + 1), (batch, image_size, image_size, 3), minval=-1, maxval=1
  )
  params = nn.unbox(model.init(jax.random.key(seed), images)["params"])
  return params, images


def abstract_params(model, image_size=224):
  shapes = jax.eval_shape(
    lambda: model.init(jax.random.key(0), jnp.zeros((1, image_size, image_size, 3)))
  )
  return nn.unbox(shapes["params"])


def test_every_variant_has_its_pinned_parameter_count():
  assert set(PARAM_COUNTS) == set(MODEL_NAMES) - {"testing"}
  for name, expected in PARAM_COUNTS.items():
    # The blocks as one nn.scan: traced once instead of once per layer (half the time), their
    # parameters the loop's stacked (`test_scan_and_remat_compute_the_same_function`).
    model = create_model(get_model_config(name), num_classes=1000, scan=True)
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract_params(model)))
    assert count == expected, name


def test_unknown_model_name_lists_valid_names():
  with pytest.raises(ValueError, match="ViT-B_16.*R50\\+ViT-B_16"):
    get_model_config("ViT-X_16")


@pytest.mark.parametrize(
  "classifier,expected_shape", [("token", (2, 10)), ("gap", (2, 10)), ("unpooled", (2, 16, 10))]
)
def test_classifier_output_shapes(classifier, expected_shape):
  model = tiny(classifier=classifier)
  params, images = init(model)
  assert model.apply({"params": params}, images).shape == expected_shape
  assert ("cls" in params) == (classifier == "token")


def test_no_head_returns_the_representation():
  for num_classes in (0, None):
    model = tiny(num_classes=num_classes, representation_size=24)
    params, images = init(model)
    assert "head" not in params and "pre_logits" in params
    out = model.apply({"params": params}, images)
    assert out.shape == (2, 24)
    assert np.all(np.abs(out) <= 1.0)  # tanh representation


@pytest.mark.parametrize("posemb", ["learn", "learn_2d", "sincos2d", "none"])
@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_position_embedding_kinds(posemb, classifier):
  model = tiny(posemb=posemb, classifier=classifier)
  params, images = init(model, image_size=24)  # a 6x6 grid
  assert model.apply({"params": params}, images).shape == (2, 10)
  pe_params = params["Transformer"].get("posembed_input", {})
  shapes = {k: v.shape for k, v in pe_params.items()}
  expected = {
    "learn": {"pos_embedding": (1, 36 + (classifier == "token"), 32)},
    "learn_2d": {"pos_embedding_x": (1, 1, 6, 16), "pos_embedding_y": (1, 6, 1, 16)},
    "sincos2d": {},
    "none": {},
  }[posemb]
  assert shapes == expected


def test_position_embeddings_change_the_output_only_when_present():
  """Permuting patches changes the class token only if positions are encoded."""
  for posemb, should_change in (("none", False), ("sincos2d", True), ("learn", True)):
    model = tiny(posemb=posemb)
    params, images = init(model, image_size=8)  # 2x2 grid
    swapped = jnp.concatenate([images[:, :, 4:], images[:, :, :4]], axis=2)
    a = model.apply({"params": params}, images)
    b = model.apply({"params": params}, swapped)
    # The head is zero-initialised: compare the pre-head representation.
    rep = lambda x: tiny(num_classes=0, posemb=posemb).apply({"params": params}, x)
    changed = not np.allclose(rep(images), rep(swapped), atol=1e-6)
    assert changed == should_change, posemb
    np.testing.assert_array_equal(a, b)  # zero head: logits equal the bias


def test_sincos_features_match_their_formula():
  table = sincos_2d((3, 4), 8)  # [12, 8]: sin x, cos x, sin y, cos y with 2 frequencies
  assert table.shape == (12, 8)
  row, col = 2, 3
  omega = np.array([1.0, 1.0 / 100.0])
  want = np.concatenate(
    [np.sin(col * omega), np.cos(col * omega), np.sin(row * omega), np.cos(row * omega)]
  )
  np.testing.assert_allclose(table[row * 4 + col], want, rtol=1e-6)


def test_image_size_not_multiple_of_patch_names_both():
  model = tiny()
  with pytest.raises(ValueError, match="18x18.*4x4"):
    model.init(jax.random.key(0), jnp.zeros((1, 18, 18, 3)))


def test_hybrid_image_size_error_names_the_total_stride():
  model = create_model(get_model_config("R+ViT-Ti_16"), num_classes=3)
  with pytest.raises(ValueError, match="40x40.*32x32"):
    jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 40, 40, 3))))


@pytest.mark.parametrize("units,image_size,grid", [((), 32, 4), ((1, 1), 32, 2), ((2,), 16, 2)])
def test_hybrid_forward_shapes(units, image_size, grid):
  model = tiny(
    resnet=ResNetSettings(units, 0.5),
    patches=PatchSettings((2, 2)),
    classifier="unpooled",
    num_classes=None,
  )
  params, images = init(model, image_size=image_size)
  assert model.apply({"params": params}, images).shape == (2, grid * grid, 32)
  assert "conv_root" in params and "gn_root" in params
  assert [k for k in params if k.startswith("block")] == [
    f"block{i + 1}" for i in range(len(units))
  ]


def _expected_vit_tree(d, m, h, depth, patch, k, n, channels=3):
  """The official layout (docs/checkpoint_format.md), written out apart from the model code."""
  dh = d // h
  tree = {
    "embedding/kernel": (patch, patch, channels, d),
    "embedding/bias": (d,),
    "cls": (1, 1, d),
    "Transformer/posembed_input/pos_embedding": (1, n, d),
    "Transformer/encoder_norm/scale": (d,),
    "Transformer/encoder_norm/bias": (d,),
    "head/kernel": (d, k),
    "head/bias": (k,),
  }
  for i in range(depth):
    p = f"Transformer/encoderblock_{i}/"
    a = p + "MultiHeadDotProductAttention_1/"
    for ln in ("LayerNorm_0", "LayerNorm_2"):
      tree[p + ln + "/scale"] = tree[p + ln + "/bias"] = (d,)
    for proj in ("query", "key", "value"):
      tree[a + proj + "/kernel"] = (d, h, dh)
      tree[a + proj + "/bias"] = (h, dh)
    tree[a + "out/kernel"] = (h, dh, d)
    tree[a + "out/bias"] = (d,)
    tree[p + "MlpBlock_3/Dense_0/kernel"] = (d, m)
    tree[p + "MlpBlock_3/Dense_0/bias"] = (m,)
    tree[p + "MlpBlock_3/Dense_1/kernel"] = (m, d)
    tree[p + "MlpBlock_3/Dense_1/bias"] = (d,)
  return tree


def _tree_shapes(params):
  return {k: tuple(v.shape) for k, v in traverse_util.flatten_dict(params, sep="/").items()}


def test_b16_tree_equals_the_official_layout():
  model = create_model(get_model_config("ViT-B_16"), num_classes=1000)
  expected = _expected_vit_tree(768, 3072, 12, 12, 16, 1000, 197)
  assert _tree_shapes(abstract_params(model)) == expected


def test_r50_b16_tree_equals_the_official_layout():
  model = create_model(get_model_config("R50+ViT-B_16"), num_classes=1000)
  expected = _expected_vit_tree(768, 3072, 12, 12, 1, 1000, 197, channels=1024)
  expected["conv_root/kernel"] = (7, 7, 3, 64)
  expected["gn_root/scale"] = expected["gn_root/bias"] = (64,)
  cin = 64
  for s, units in enumerate((3, 4, 9)):
    w = 64 * 2**s
    for u in range(units):
      p = f"block{s + 1}/unit{u + 1}/"
      expected[p + "conv1/kernel"] = (1, 1, cin if u == 0 else 4 * w, w)
      expected[p + "conv2/kernel"] = (3, 3, w, w)
      expected[p + "conv3/kernel"] = (1, 1, w, 4 * w)
      for gn, width in (("gn1", w), ("gn2", w), ("gn3", 4 * w)):
        expected[p + gn + "/scale"] = expected[p + gn + "/bias"] = (width,)
      if u == 0:
        expected[p + "conv_proj/kernel"] = (1, 1, cin, 4 * w)
        expected[p + "gn_proj/scale"] = expected[p + "gn_proj/bias"] = (4 * w,)
    cin = 4 * w
  assert _tree_shapes(abstract_params(model)) == expected


def test_head_is_zero_initialised_with_configurable_bias():
  model = tiny(head_bias_init=-2.0)
  params, images = init(model)
  assert not np.any(params["head"]["kernel"])
  np.testing.assert_array_equal(params["head"]["bias"], -2.0)
  np.testing.assert_allclose(model.apply({"params": params}, images), -2.0)


def test_attention_implementations_compute_the_same_function():
  """`jax.nn.dot_product_attention` ('xla') equals the default einsum path, which sows weights."""
  model = tiny(classifier="unpooled", num_classes=None)
  params, images = init(model)
  einsum, state = model.apply({"params": params}, images, mutable=["intermediates"])
  assert state["intermediates"]  # the weights were explicit
  via_jax = tiny(classifier="unpooled", num_classes=None, attention_impl="xla")
  np.testing.assert_allclose(via_jax.apply({"params": params}, images), einsum, atol=1e-5)


def test_intermediates_give_attention_and_tokens_per_layer():
  for scan in (False, True):
    model = tiny(scan=scan)
    params, images = init(model)  # 16 tokens + cls
    _, state = model.apply({"params": params}, images, mutable=["intermediates"])
    flat = traverse_util.flatten_dict(state["intermediates"], sep="/")
    if scan:
      att = flat["Transformer/encoderblock/MultiHeadDotProductAttention_1/attention_weights"][0]
      tokens = flat["Transformer/encoderblock/tokens"][0]
      assert att.shape == (2, 2, 2, 17, 17)  # [L, B, H, N, N]
      assert tokens.shape == (2, 2, 17, 32)  # [L, B, N, D]
    else:
      att = flat["Transformer/encoderblock_1/MultiHeadDotProductAttention_1/attention_weights"][0]
      assert att.shape == (2, 2, 17, 17)
    np.testing.assert_allclose(np.sum(att, axis=-1), 1.0, rtol=1e-5)


def test_scan_and_remat_compute_the_same_function():
  base = tiny(num_classes=0)
  params, images = init(base)
  want = base.apply({"params": params}, images)
  scanned = npz.layers_to_scanned(params)
  for kw in (
    dict(scan=True),
    dict(scan=True, remat=True, remat_policy="nothing_saveable"),
    dict(remat=True),
  ):
    model = tiny(num_classes=0, **kw)
    p = scanned if kw.get("scan") else params
    np.testing.assert_allclose(model.apply({"params": p}, images), want, atol=1e-5)
    loss = lambda p, model=model: jnp.sum(model.apply({"params": p}, images) ** 2)
    grads = jax.grad(loss)(p)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


def test_unknown_remat_policy_is_an_error():
  model = tiny(remat=True, remat_policy="save_everything_please")
  with pytest.raises(ValueError, match="save_everything_please.*jax.checkpoint_policies"):
    init(model)


@pytest.mark.parametrize(
  "key, value, fragment",
  [
    ("classifier", "tokens", "config.model.classifier='tokens'"),
    ("remat_policy", "save_all", "config.model.remat_policy='save_all'"),
    ("posemb", "sincos", "config.model.posemb='sincos'"),
    ("dtype", "int8", "config.model.dtype='int8'"),
    ("attention_impl", "flash", "config.model.attention_impl='flash'"),
    ("hidden_size", 33, "Width 33 .*num_heads=2"),
  ],
)
def test_create_model_checks_a_config_and_its_overrides_before_building(key, value, fragment):
  cfg = get_model_config("testing")
  cfg[key] = value
  with pytest.raises(errors.ConfigError, match=fragment):
    create_model(cfg, num_classes=3)
  if key == "remat_policy":  # an execution option: the same check when the module is traced
    with pytest.raises(errors.ConfigError, match=fragment):
      init(tiny(remat=True, remat_policy=value))
  if key in ("classifier", "posemb"):  # a settings override: checked as the settings are
    with pytest.raises(errors.ConfigError, match=fragment):
      tiny(**{key: value})


def test_dropout_is_active_only_in_training():
  model = tiny(num_classes=0, dropout_rate=0.5, attention_dropout_rate=0.5)
  params, images = init(model)
  eval_a = model.apply({"params": params}, images)
  eval_b = model.apply({"params": params}, images)
  np.testing.assert_array_equal(eval_a, eval_b)
  train = lambda s: model.apply(
    {"params": params}, images, train=True, rngs={"dropout": jax.random.key(s)}
  )
  assert not np.allclose(train(0), train(1))


def test_bfloat16_forward_is_close_to_float32():
  model = tiny(num_classes=0)
  params, images = init(model)
  f32 = model.apply({"params": params}, images)
  bf16_model = tiny(num_classes=0, dtype=jnp.bfloat16)
  bf16 = bf16_model.apply({"params": params}, images)
  assert bf16.dtype == jnp.float32  # outputs are returned in float32
  rel = np.linalg.norm(bf16 - f32) / np.linalg.norm(f32)
  assert 0 < rel < 3e-2
  # Parameters stay float32 whatever the computation dtype.
  bf16_params, _ = init(bf16_model)
  assert {x.dtype for x in jax.tree.leaves(bf16_params)} == {jnp.dtype(jnp.float32)}


def test_parameters_carry_logical_axis_names():
  model = tiny(scan=True)
  boxed = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 16, 16, 3)))["params"]
  specs = traverse_util.flatten_dict(nn.get_partition_spec(boxed), sep="/")
  assert tuple(specs["Transformer/encoderblock/MlpBlock_3/Dense_0/kernel"]) == (
    "layers",
    "embed",
    "mlp",
  )
  assert tuple(specs["Transformer/encoderblock/MultiHeadDotProductAttention_1/out/kernel"]) == (
    "layers",
    "heads",
    "kv",
    "embed",
  )
