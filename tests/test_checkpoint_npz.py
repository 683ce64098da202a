"""Official `.npz` layout: write -> read, scanned <-> per-layer, tree checks."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from vit_jax.models import create_model, get_model_config
from vit_jax.models.settings import PatchSettings, ResNetSettings
from vit_jax.weights import npz


def tiny(**overrides):
  return create_model(get_model_config("testing"), num_classes=5, **overrides)


def random_params(model, image_size=16, seed=0):
  """Parameters with no zero tensors (zero heads would hide layout mistakes)."""
  shapes = nn.unbox(
    model.init(jax.random.key(seed), jnp.zeros((1, image_size, image_size, 3)))["params"]
  )
  leaves, treedef = jax.tree.flatten(shapes)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  return jax.tree.unflatten(
    treedef, [0.1 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
  )


def flat(tree) -> dict:
  """{'a': {'b': x}} -> {'a/b': x}: the keys of an `.npz` file."""
  return traverse_util.flatten_dict(tree, sep="/")


def assert_trees_equal(a, b):
  fa, fb = flat(a), flat(b)
  assert fa.keys() == fb.keys()
  for k in fa:
    np.testing.assert_array_equal(np.asarray(fa[k]), np.asarray(fb[k]), err_msg=k)
    assert np.asarray(fa[k]).dtype == np.asarray(fb[k]).dtype, k


def test_npz_write_read_is_bit_exact(tmp_path):
  params = random_params(tiny())
  path = tmp_path / "tiny.npz"
  npz.save_npz(path, params)
  loaded = npz.load_npz(path)
  assert_trees_equal(params, loaded)
  # Readable with plain numpy, keys joined by '/', as the official files.
  with np.load(path, allow_pickle=False) as f:
    assert "Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel" in f.files
  assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_scanned_model_is_written_per_layer_and_reloads_into_either_layout(tmp_path):
  per_layer_model, scanned_model = tiny(), tiny(scan=True)
  params = random_params(per_layer_model)
  scanned = npz.layers_to_scanned(params)
  npz.check_tree(scanned, random_params(scanned_model))  # the layout a scan expects
  assert flat(scanned)["Transformer/encoderblock/LayerNorm_0/scale"].shape == (2, 32)

  # scanned <-> per-layer is exact, both ways.
  assert_trees_equal(npz.scanned_to_layers(scanned), params)
  assert_trees_equal(npz.layers_to_scanned(npz.scanned_to_layers(scanned)), scanned)

  # A scanned tree is written in the per-layer layout.
  npz.save_npz(tmp_path / "s.npz", scanned)
  loaded = npz.load_npz(tmp_path / "s.npz")
  assert not npz.is_scanned(loaded)
  assert_trees_equal(loaded, params)

  images = jax.random.uniform(jax.random.key(3), (2, 16, 16, 3), minval=-1, maxval=1)
  logits_layers = per_layer_model.apply({"params": loaded}, images)
  logits_scan = scanned_model.apply({"params": npz.to_layout(loaded, scanned=True)}, images)
  np.testing.assert_allclose(logits_scan, logits_layers, atol=1e-6)
  assert np.abs(logits_layers).max() > 0


def test_scanned_npz_file_is_read_as_scanned(tmp_path):
  scanned = npz.layers_to_scanned(random_params(tiny()))
  np.savez(tmp_path / "bv.npz", **flat(jax.tree.map(np.asarray, scanned)))
  loaded = npz.load_npz(tmp_path / "bv.npz")
  assert npz.is_scanned(loaded)
  assert_trees_equal(loaded, scanned)


def test_old_groupnorm_shapes_are_squeezed(tmp_path):
  model = tiny(resnet=ResNetSettings((1,), 0.5), patches=PatchSettings((1, 1)))
  params = random_params(model, image_size=8)
  arrays = {k: np.asarray(v) for k, v in flat(params).items()}
  old = {
    k: (v.reshape(1, 1, 1, -1) if "/gn" in "/" + k and k.endswith(("scale", "bias")) else v)
    for k, v in arrays.items()
  }
  assert old["gn_root/scale"].shape == (1, 1, 1, 32)
  np.savez(tmp_path / "old.npz", **old)
  assert_trees_equal(npz.load_npz(tmp_path / "old.npz"), params)


def test_bfloat16_params_are_written_as_float32(tmp_path):
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), random_params(tiny()))
  npz.save_npz(tmp_path / "bf16.npz", params)
  loaded = npz.load_npz(tmp_path / "bf16.npz")
  for k, v in flat(loaded).items():
    assert v.dtype == np.float32, k
    np.testing.assert_array_equal(v, np.asarray(flat(params)[k], np.float32))


def test_check_tree_lists_every_difference_at_once():
  params = random_params(tiny())
  wider = get_model_config("testing")
  wider.hidden_size, wider.transformer.num_heads = 48, 2
  other = random_params(create_model(wider, num_classes=5))
  broken = flat(other)
  del broken["head/bias"]
  broken["extra/kernel"] = np.zeros(3)
  with pytest.raises(ValueError) as e:
    npz.check_tree(traverse_util.unflatten_dict(broken, sep="/"), params, source="ckpt.npz")
  msg = str(e.value)
  assert "missing keys (1)" in msg and "head/bias" in msg
  assert "unexpected keys (1)" in msg and "extra/kernel" in msg
  assert "shape mismatches" in msg
  assert "embedding/kernel: ckpt.npz (4, 4, 3, 48) vs model (4, 4, 3, 32)" in msg
  npz.check_tree(params, params)  # equal trees pass


def test_object_arrays_are_refused(tmp_path):
  np.savez(tmp_path / "pickled.npz", head=np.array([{"a": 1}], dtype=object))
  with pytest.raises(ValueError, match="not a plain-array .npz"):
    npz.load_npz(tmp_path / "pickled.npz")


def test_missing_file_names_the_path(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.npz"):
    npz.load_npz(tmp_path / "nope.npz")


def test_failed_write_keeps_the_earlier_file(tmp_path, monkeypatch):
  path = tmp_path / "keep.npz"
  params = random_params(tiny())
  npz.save_npz(path, params)
  before = path.read_bytes()

  def broken_savez(*args, **kwargs):
    raise OSError("disk full")

  monkeypatch.setattr(np, "savez", broken_savez)
  with pytest.raises(OSError, match="disk full"):
    npz.save_npz(path, params)
  assert path.read_bytes() == before
  assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.npz"]
