"""tfds datasets by name: the built-in digits, mocked cifar10, clear errors offline."""

import io
import logging
import time

import jax
import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from tests import train_fixtures
from vit_jax import data
from vit_jax.data import digits, order, readers, tfds_source


def _mesh():
  return jax.sharding.Mesh(np.array(jax.devices()).reshape(-1, 1), ("data", "model"))


def _config(dataset, data_dir, **overrides) -> ml_collections.ConfigDict:
  config = train_fixtures.common_config(
    dataset=dataset,
    data_dir=str(data_dir),
    train_split="train",
    test_split="test",
    pp=dict(crop=16, min_area=0.05, flip=True),
    batch=8,
    batch_eval=8,
    shuffle_buffer=1000,
    seed=0,
  )
  config.update(overrides)
  return config


def test_digits_builds_offline_with_documented_splits(tmp_path, capsys):
  start = time.time()
  info = data.dataset_info(_config("digits", tmp_path))
  assert time.time() - start < 30
  assert capsys.readouterr().out == ""  # no tfds "Downloading and preparing dataset ..."
  assert info.num_classes == 10 and info.class_names == [str(d) for d in range(10)]
  assert (info.num_train, info.num_test) == (digits.NUM_TRAIN, digits.NUM_TEST)
  assert (digits.NUM_TRAIN, digits.NUM_TEST) == (1437, 360)
  builder = tfds.builder("digits", data_dir=str(tmp_path))
  assert builder.is_prepared()
  # Stored images are uint8 [8, 8, 1] scaled to 0..255; labels match scikit-learn's.
  images, labels = digits.digits_arrays()
  ds = builder.as_dataset(split="test")
  assert images.dtype == np.uint8 and images.shape == (1797, 8, 8, 1)
  assert images.max() == 255
  test_idx = digits.split_indices()["test"]
  got = sorted((ex["image"].numpy().tobytes(), int(ex["label"])) for ex in ds)
  want = sorted((images[i].tobytes(), int(labels[i])) for i in test_idx)
  assert got == want
  assert not set(test_idx) & set(digits.split_indices()["train"])
  # Slicing works on the real builder.
  info = data.dataset_info(_config("digits", tmp_path, train_split="train[:90%]"))
  assert info.num_train == round(0.9 * 1437)


def test_digits_from_arrays_are_the_prepared_dataset_in_its_order(digits_dir):
  """Without TensorFlow digits reads scikit-learn's arrays (`digits.DigitsArrays`): the
  examples tfds stores, in its stored order, with the same pixels, for any split string."""
  prepared = tfds_source.TfdsDataset("digits", digits_dir)
  arrays = digits.DigitsArrays()
  assert arrays.class_names == prepared.class_names
  for spec in ("train", "test", "train[5:]+test[:10%]"):
    want, got = prepared.split(spec), arrays.split(spec)
    assert (got.num_examples, got.random_access) == (want.num_examples, want.random_access)
    values, labels = want.read(0, want.num_examples)
    got_values, got_labels = got.read(0, got.num_examples)
    np.testing.assert_array_equal(got_labels, labels, err_msg=spec)
    for a, b in zip(got_values, values, strict=True):
      np.testing.assert_array_equal(_pixels(a), _pixels(b), err_msg=spec)


def _pixels(png: bytes) -> np.ndarray:
  return np.asarray(Image.open(io.BytesIO(png)))


def test_digits_pipeline_delivers_rgb(tmp_path):
  batch = next(iter(data.eval_iterator(_config("digits", tmp_path), _mesh())))
  image = np.asarray(batch["image"])
  assert image.shape == (8, 16, 16, 3)
  np.testing.assert_array_equal(image[..., 0], image[..., 2])  # Grey on 3 channels.
  assert image.min() >= -1 and image.max() <= 1 and image.std() > 0.1


def test_mocked_cifar10_through_the_tfds_path(tmp_path):
  config = _config("cifar10", tmp_path, train_split="train[:98%]", batch=4, batch_eval=8)
  with tfds.testing.mock_data(num_examples=10):
    info = data.dataset_info(config)  # mock_data has no split sizes: counted.
    assert (info.num_classes, info.num_train, info.num_test) == (10, 10, 10)
    batches = data.train_iterator(data.Settings.from_config(config), _mesh())
    for _ in range(3):  # Crosses an epoch boundary.
      batch = next(batches)
      assert batch["image"].shape == (4, 16, 16, 3) and batch["label"].shape == (4, 10)
    evaluation = data.eval_iterator(config, _mesh())
    masks = [np.asarray(b["mask"]) for b in evaluation]
  assert len(masks) == 2 and sum(m.sum() for m in masks) == 10
  np.testing.assert_array_equal(masks[1], [1, 1, 0, 0, 0, 0, 0, 0])


def test_unprepared_dataset_is_one_clear_error(tmp_path, caplog):
  with caplog.at_level(logging.INFO, logger="absl"), pytest.raises(FileNotFoundError) as e:
    data.dataset_info(_config("cifar10", tmp_path))
  message = str(e.value)
  assert "'cifar10'" in message and str(tmp_path) in message
  assert f"`tfds build cifar10 --data_dir={tmp_path}`" in message
  assert "gs://" in message
  # Nothing said before it about reading a split that is not there.
  assert "whole split" not in caplog.text


def test_unknown_dataset_name(tmp_path):
  with pytest.raises(ValueError, match="'no_such_set'.*folder:"):
    data.dataset_info(_config("no_such_set", tmp_path))


def test_bad_split_string(tmp_path):
  with pytest.raises(ValueError, match="'validation'.*'train'"):
    data.dataset_info(_config("digits", tmp_path, test_split="validation"))


@pytest.mark.parametrize("window", [40, 97])  # 97: every fine-tuning preset's lane window
def test_lane_windows_larger_than_tfds_blocks_resume_exactly_from_their_own_lanes(
  digits_dir, window
):
  """tfds interleaves several read ranges in blocks of 16 unless told to read them in order."""
  dataset = tfds_source.TfdsDataset("digits", digits_dir)
  source = dataset.split("train")
  stored_values, _ = dataset.load("train")  # one range: the stored order
  n, lanes = source.num_examples, 8

  def rows(start_step: int, stop_step: int) -> dict[int, tuple[int, bytes]]:
    reader = readers.LaneReader(source, 0, lanes, lanes, window, 0, start_step)
    out = {}
    for positions, uids, values, *_ in reader():
      out.update(
        (int(p), (int(u), v)) for p, u, v in zip(positions, uids, values) if p < stop_step * lanes
      )
      if positions[-1] >= stop_step * lanes - 1:
        break
    return out

  straight = rows(0, 300)  # more than a block of read_many (128 steps) and a lane's examples
  resumed = rows(150, 300)
  assert len(resumed) == 150 * lanes
  assert all(straight[p] == row for p, row in resumed.items())
  for position, (uid, value) in straight.items():
    index = uid % n
    lo, hi = order.process_shard(n, position % lanes, lanes)
    assert lo <= index < hi and value == stored_values[index], position
