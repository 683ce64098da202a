"""Image folders: formats, labels, errors, corrupt files, exact eval coverage."""

import logging
import os

import jax
import ml_collections
import numpy as np
import pytest
from PIL import Image

from tests import train_fixtures
from vit_jax import data

CROP = 8


def _mesh():
  return jax.sharding.Mesh(np.array(jax.devices()).reshape(-1, 1), ("data", "model"))


def _config(root, **overrides) -> ml_collections.ConfigDict:
  config = train_fixtures.common_config(
    dataset=f"folder:{root}",
    train_split="train",
    test_split="test",
    pp=dict(crop=CROP),
    batch=4,
    batch_eval=4,
    shuffle_buffer=100,
  )
  config.update(overrides)
  return config


def _write(path, grey_level: int, mode: str = "RGB", size=(12, 10)):
  """A constant image: every pixel of every channel is `grey_level` (an id)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  image = Image.new("RGB", size, (grey_level,) * 3).convert(mode)
  image.save(path)


def _id_folder(root, split, counts):
  """counts[c] PNG images in class folder c; image k (over all classes) has id k."""
  k = 0
  for c, n in enumerate(counts):
    for _ in range(n):
      _write(os.path.join(root, split, f"class_{c}", f"{k:03d}.png"), 10 * k)
      k += 1
  return k


def _ids(images: np.ndarray) -> np.ndarray:
  """Recover ids from constant images in [-1, 1]."""
  levels = np.round(images.reshape(len(images), -1).mean(-1) * 127.5 + 127.5)
  return (levels / 10).round().astype(int)


def test_formats_modes_and_labels(tmp_path):
  root = tmp_path / "imgs"
  # Class folder names sort as: 'ant' < 'bee' < 'cat'.
  _write(root / "train/cat/a.JPG", 200, "L")
  _write(root / "train/cat/b.png", 200, "RGBA")
  _write(root / "train/ant/c.jpeg", 0, "RGB")
  _write(root / "train/ant/d.png", 0, "L")
  _write(root / "train/bee/e.png", 100, "P")  # Palette PNG.
  (root / "train/bee/notes.txt").write_text("not an image")
  _write(root / "test/bee/f.jpg", 100)
  info = data.dataset_info(_config(root))
  assert info == data.DatasetInfo(
    num_classes=3, num_train=5, num_test=1, class_names=["ant", "bee", "cat"]
  )
  batch = next(iter(data.eval_iterator(_config(root, test_split="train", batch_eval=5), _mesh())))
  images, labels = np.asarray(batch["image"]), np.asarray(batch["label"])
  assert images.shape == (5, CROP, CROP, 3) and labels.shape == (5, 3)
  levels = np.round(images.mean((1, 2, 3)) * 127.5 + 127.5)
  expected = {0: 0, 1: 100, 2: 200}  # label -> grey level
  for level, label in zip(levels, labels.argmax(-1)):
    assert abs(level - expected[label]) <= 2  # JPEG may move a constant by ~1.
  test = next(iter(data.eval_iterator(_config(root), _mesh())))
  np.testing.assert_array_equal(np.asarray(test["label"])[0], [0, 1, 0])  # 'bee'


def test_eval_visits_every_example_exactly_once(tmp_path):
  n = _id_folder(tmp_path, "test", [5, 9, 9])  # 23 examples; 23 % 4 != 0.
  _id_folder(tmp_path, "train", [1, 1, 1])
  evaluation = data.eval_iterator(_config(tmp_path, batch_eval=4), _mesh())
  assert len(evaluation) == 6
  for _ in range(2):  # Each iteration is a full pass.
    seen = []
    for batch in evaluation:
      mask = np.asarray(batch["mask"])
      assert batch["image"].shape[0] == 4 and mask.shape == (4,)
      seen += list(_ids(np.asarray(batch["image"]))[mask == 1])
    assert sorted(seen) == list(range(n))


def test_train_epoch_covers_the_split_and_is_seeded(tmp_path):
  n = _id_folder(tmp_path, "train", [3, 3, 2])  # 8 examples, 2 batches per epoch.
  _id_folder(tmp_path, "test", [1, 1, 1])

  def ids(seed, steps=4):
    it = data.train_iterator(data.Settings.from_config(_config(tmp_path, seed=seed)), _mesh())
    return [list(_ids(np.asarray(next(it)["image"]))) for _ in range(steps)]

  first = ids(0)
  assert sorted(first[0] + first[1]) == list(range(n))  # Epoch 0.
  assert sorted(first[2] + first[3]) == list(range(n))  # Epoch 1.
  assert first[:2] != first[2:]  # Epochs are shuffled differently.
  assert ids(0) == first
  assert ids(1) != first


def test_train_labels_match_class_folders(tmp_path):
  _id_folder(tmp_path, "train", [2, 3])  # ids 0, 1 -> class 0; ids 2..4 -> class 1.
  _id_folder(tmp_path, "test", [1, 1])
  batch = next(data.train_iterator(data.Settings.from_config(_config(tmp_path, batch=5)), _mesh()))
  ids, labels = _ids(np.asarray(batch["image"])), np.asarray(batch["label"])
  np.testing.assert_array_equal(labels.argmax(-1), (ids >= 2).astype(int))
  assert np.all(labels.sum(-1) == 1)


def test_corrupt_file_error_names_it(tmp_path):
  _id_folder(tmp_path, "train", [3, 3])
  _id_folder(tmp_path, "test", [1, 1])
  bad = tmp_path / "train" / "class_1" / "broken.png"
  bad.write_bytes(b"\x89PNG\r\n\x1a\n this is not a png")
  config = _config(tmp_path, batch=7)
  it = data.train_iterator(data.Settings.from_config(config), _mesh())
  with pytest.raises(ValueError, match="broken.png.*skip_corrupt_images"):
    next(it)
  config = _config(tmp_path, test_split="train")
  evaluation = data.eval_iterator(config, _mesh())
  with pytest.raises(ValueError, match="broken.png"):
    list(evaluation)


def test_corrupt_file_skipped_and_counted(tmp_path, caplog):
  n = _id_folder(tmp_path, "train", [3, 3])
  _id_folder(tmp_path, "test", [1, 1])
  (tmp_path / "train" / "class_0" / "broken.jpg").write_bytes(b"\xff\xd8\xff garbage")
  config = _config(tmp_path, batch=7, skip_corrupt_images=True, test_split="train")
  with caplog.at_level(logging.WARNING):
    evaluation = data.eval_iterator(config, _mesh())
    masks, seen = [], []
    for batch in evaluation:
      mask = np.asarray(batch["mask"])
      masks.append(mask)
      seen += list(_ids(np.asarray(batch["image"]))[mask == 1])
    assert sorted(seen) == list(range(n))  # Every readable example once.
    assert sum(m.sum() for m in masks) == n
    skipped = [r.getMessage() for r in caplog.records if "broken.jpg" in r.getMessage()]
    assert len(skipped) == 1 and "1 skipped so far" in skipped[0]  # One eval pass.
    train = data.train_iterator(data.Settings.from_config(config), _mesh())
    batch = next(train)
    train.close()
    # The broken row is replaced by another example of the batch: n + 1 rows, n ids.
    assert sorted(set(_ids(np.asarray(batch["image"])))) == list(range(n))
  # Training logs it again (more than once when prefetching has read into the next epoch).
  skipped = [r.getMessage() for r in caplog.records if "broken.jpg" in r.getMessage()]
  assert len(skipped) >= 2 and "1 skipped so far" in skipped[1]


def test_missing_split_folder(tmp_path):
  _id_folder(tmp_path, "train", [1, 1])
  with pytest.raises(FileNotFoundError, match=r"test.*does not exist.*\['train'\]"):
    data.dataset_info(_config(tmp_path))
  with pytest.raises(FileNotFoundError, match="does not exist"):
    data.dataset_info(_config(tmp_path / "nowhere"))


def test_empty_class_folder(tmp_path):
  _id_folder(tmp_path, "train", [1, 1])
  _id_folder(tmp_path, "test", [1, 1])
  os.makedirs(tmp_path / "train" / "class_9")
  with pytest.raises(ValueError, match="class_9.*holds no"):
    data.dataset_info(_config(tmp_path))


def test_unknown_class_in_test_split_and_class_count(tmp_path):
  _id_folder(tmp_path, "train", [1, 1])
  _id_folder(tmp_path, "test", [1, 1, 1])
  with pytest.raises(ValueError, match="class_2.*not a class of the train split"):
    data.dataset_info(_config(tmp_path))
  with pytest.raises(ValueError, match="num_classes=5.*2 classes"):
    data.dataset_info(_config(tmp_path, num_classes=5, test_split="train"))


def test_split_slicing_on_folders(tmp_path):
  _id_folder(tmp_path, "train", [5, 5])
  info = data.dataset_info(_config(tmp_path, train_split="train[:80%]", test_split="train[80%:]"))
  assert (info.num_train, info.num_test) == (8, 2)
  with pytest.raises(ValueError, match="train\\[:80\\]"):
    data.dataset_info(_config(tmp_path, train_split="train[:80]", test_split="train"))


def test_each_process_reads_its_own_shard(tmp_path):
  from vit_jax.data import dataset, pipeline
  from vit_jax.data import settings as data_settings

  n = _id_folder(tmp_path, "train", [4, 4, 3])  # 11 examples: shards of 5 and 6.
  _id_folder(tmp_path, "test", [1])
  config = _config(tmp_path)
  ds = dataset.Dataset(data_settings.Settings.from_config(config))
  epoch = []
  for process in (0, 1):
    batches = pipeline.local_train_batches(ds, 5, 0, process, 2)
    ids = list(_ids(next(batches)["image"]))
    assert len(set(ids)) == 5  # The first 5 positions are 5 distinct examples.
    epoch.append(set(ids))
  assert not epoch[0] & epoch[1]
  evals = [pipeline.EvalBatches(ds, "train", 2, p, 2) for p in (0, 1)]
  assert len(evals[0]) == len(evals[1]) == 3  # Same count: shards of 5 and 6.
  seen = []
  for ev in evals:
    for batch in ev:
      seen += list(_ids(batch["image"])[batch["mask"] == 1])
  assert sorted(seen) == list(range(n))
