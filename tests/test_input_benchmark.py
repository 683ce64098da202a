"""benchmarks/tf_input.py (the input benchmarks' own tf.data pipeline) against the package's
eval preprocessing, and benchmarks/input_rows.py's rows and table."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import input_data, input_rows

tf = pytest.importorskip("tensorflow")
tf_input = pytest.importorskip("benchmarks.tf_input")


@pytest.fixture(scope="module")
def jpeg() -> bytes:
  return input_data.photo_jpeg(np.random.default_rng(3))


def _train(jpeg: bytes, seed: int, *, min_area: float = 0.05, flip: bool = True) -> np.ndarray:
  seed_ = tf.constant([0, seed], tf.int64)
  return tf_input.train_image(tf.constant(jpeg), seed_, 224, min_area, flip).numpy()


def test_eval_image_equals_the_packages_official_eval(jpeg):
  from vit_jax.data import data_config, host_images

  ours = tf_input.eval_image(tf.constant(jpeg), 224).numpy()
  reference = host_images.eval_image(jpeg, data_config.official((224, 224)))  # [224, 224, 3]
  assert ours.shape == reference.shape == (224, 224, 3)
  np.testing.assert_allclose(ours, reference, atol=0.01)


def test_train_image_is_a_seeded_crop_in_range(jpeg):
  first, again, other = _train(jpeg, 1), _train(jpeg, 1), _train(jpeg, 2)
  assert first.shape == (224, 224, 3) and first.dtype == np.float32
  assert first.min() >= -1.0 and first.max() <= 1.0
  np.testing.assert_array_equal(first, again)
  assert np.abs(first - other).mean() > 0.01


def test_train_image_at_full_area_is_the_whole_image_maybe_flipped(jpeg):
  whole = tf_input.eval_image(tf.constant(jpeg), 224).numpy()
  np.testing.assert_allclose(_train(jpeg, 5, min_area=1.0, flip=False), whole, atol=1e-5)
  flips = [_train(jpeg, s, min_area=1.0) for s in range(8)]
  flipped = [np.allclose(image, whole[:, ::-1], atol=1e-5) for image in flips]
  assert all(f or np.allclose(image, whole, atol=1e-5) for f, image in zip(flipped, flips))
  assert 0 < sum(flipped) < len(flips)


def test_train_batches_are_reproducible_one_hot_batches(tmp_path):
  input_data.write_jpeg_folder(str(tmp_path), 12, classes=3)
  paths, labels = input_data.folder_files(str(tmp_path), "train")
  assert len(paths) == 12 and sorted(set(labels)) == [0, 1, 2]

  def first_batches(seed: int) -> list:
    ds = tf_input.train_batches(paths, labels, 3, 5, crop=32, seed=seed)
    return [batch for batch, _ in zip(ds.as_numpy_iterator(), range(3))]

  batches, again = first_batches(0), first_batches(0)
  for (images, onehot), (images_again, _) in zip(batches, again):
    assert images.shape == (5, 32, 32, 3) and onehot.shape == (5, 3)
    np.testing.assert_array_equal(onehot.sum(axis=1), 1.0)
    np.testing.assert_array_equal(images, images_again)
  assert not np.array_equal(first_batches(1)[0][0], batches[0][0])


def test_the_table_compares_each_side_with_its_tf_data_row():
  result = lambda images, wall, cpu: dict(images=images, wall_s=wall, cpu_s=cpu)  # noqa: E731
  results = {
    "tf.data": [result(100, 1.0, 2.0), result(100, 0.5, 2.0), result(100, 2.0, 2.0)],
    "grain": [result(100, 0.5, 1.0)] * 3,
    "grain threads": [result(100, 1.0, 1.0)] * 3,
    "torch DataLoader": [{"error": "ModuleNotFoundError: No module named 'torch'"}] * 3,
  }
  lines = input_rows._table(results, input_rows.TRAIN_ROWS, 2)
  assert "x tf.data (wall)" in lines[0]
  tf_row, grain_row, threads_row, torch_row = lines[2:]
  assert "| 100 (100, 200, 50) | 50 (50, 50, 50) | 1.00 | 1.00 |" in tf_row
  assert grain_row.endswith("| 200 (200, 200, 200) | 100 (100, 100, 100) | 2.00 | 2.00 |")
  assert threads_row.endswith("| 100 (100, 100, 100) | 100 (100, 100, 100) | 1.00 | 2.00 |")
  assert "not run: ModuleNotFoundError" in torch_row


@pytest.mark.slow
def test_every_row_runs_on_a_small_folder(tmp_path):
  input_data.write_jpeg_folder(str(tmp_path), 32)  # Enough timed work for CPU ticks (10 ms).
  lines = input_rows.compare(str(tmp_path), workers=1, batch=8, steps=10, rounds=1)
  assert not [line for line in lines if "not run" in line]
  rows = {line.split(" | ")[0][2:] for line in lines if line.startswith("| ")}
  assert set(input_rows._LABELS.values()) < rows
