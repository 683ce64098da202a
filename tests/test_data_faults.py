"""Faults of the input files while a run reads them, each one line naming the file and the
way out (or, for an image, a warning with config.skip_corrupt_images): an image deleted or
cut short after the folder was listed, a tar shard cut short or deleted. (Damaged record
files: tests/test_data_records.py; decode workers killed or unable to start:
tests/test_decode_workers.py.)"""

import logging
import os
import tarfile

import numpy as np
import pytest
from PIL import Image

from tests import image_text_fixtures, train_fixtures
from vit_jax import data
from vit_jax.data import dataset, pipeline, tar_shards
from vit_jax.infra import errors

CROP = 8


def _photos(root) -> list[str]:
  """A folder of 16 noisy JPEGs in 2 classes; their paths, sorted."""
  rng = np.random.default_rng(0)
  paths = []
  for k in range(16):
    folder = root / "train" / f"class_{k % 2}"
    folder.mkdir(parents=True, exist_ok=True)
    paths.append(str(folder / f"{k:02d}.jpg"))
    Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(paths[-1])
  return sorted(paths)


def _batches(root, skip: bool):
  """Train batches of 4 of the folder at ``root``, decoded by 2 worker processes; the
  folder is listed here, before they start."""
  config = train_fixtures.common_config(
    dataset=f"folder:{root}",
    train_split="train",
    test_split="train",
    pp=dict(crop=CROP),
    shuffle_buffer=16,
    skip_corrupt_images=skip,
    decode_processes=2,
  )
  folder = dataset.Dataset(data.Settings.from_config(config))
  return pipeline.local_train_batches(folder, 4, 0, 0, 1)


def _cut(path: str) -> None:
  with open(path, "rb") as f:
    head = f.read(200)
  with open(path, "wb") as f:
    f.write(head)


@pytest.mark.parametrize("fault, reason", [(os.remove, "No such file"), (_cut, "Truncated")])
def test_an_image_deleted_or_cut_after_listing_is_named_or_skipped(tmp_path, caplog, fault, reason):
  paths = _photos(tmp_path)
  batches = _batches(tmp_path, skip=False)
  fault(paths[5])
  with pytest.raises(errors.ConfigError, match=rf"Cannot read image '{paths[5]}': .*{reason}"):
    for _ in range(8):  # two epochs
      next(batches)
  _photos(tmp_path)
  batches = _batches(tmp_path, skip=True)
  fault(paths[5])
  with caplog.at_level(logging.WARNING):
    images = np.concatenate([next(batches)["image"] for _ in range(8)])
  skipped = [r.getMessage() for r in caplog.records if "Skipped unreadable image" in r.getMessage()]
  assert len(skipped) == 2 and all(f"{paths[5]!r}" in line for line in skipped)  # once an epoch
  assert np.ptp(images.reshape(32, -1), axis=1).min() > 0.5  # every row a real crop


def _shards(tmp_path) -> tuple[str, bytes]:
  """Tar shards of a train split (12 and 8 examples): the root, the second shard's bytes."""
  image_text_fixtures.write_shards(tmp_path)
  second = tmp_path / "train" / "00001.tar"
  return str(tmp_path), second.read_bytes()


@pytest.mark.parametrize("size", [3000, 5800, 6144 + 100])
def test_a_tar_shard_cut_short_is_one_line_not_fewer_examples(tmp_path, size):
  """Cut in a member's data or header: before, tarfile ended quietly there and the examples
  after the cut were left out (or a key lost its caption)."""
  root, whole = _shards(tmp_path)
  (tmp_path / "train" / "00001.tar").write_bytes(whole[:size])
  with pytest.raises(errors.InputFileError) as raised:
    tar_shards.TarShards(root).split("train")
  assert str(raised.value).startswith(
    f"Shard '{root}/train/00001.tar' is cut short or damaged at byte "
  )
  assert str(raised.value).endswith(
    ": put an intact copy of it in its place, then run the same command again."
  )


def test_a_tar_shard_cut_at_a_member_is_read_with_a_warning(tmp_path, caplog):
  """No byte tells a shard cut between two members from one written without tar's end
  marker (GNU tar reads both): its members are read, and a warning says it."""
  root, whole = _shards(tmp_path)
  with tarfile.open(tmp_path / "train" / "00001.tar") as tar:
    ends = [m.offset_data + -(-m.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE for m in tar]
  (tmp_path / "train" / "00001.tar").write_bytes(whole[: ends[5]])  # 3 image-caption pairs
  with caplog.at_level(logging.WARNING):
    split = tar_shards.TarShards(root).split("train")
  assert split.num_examples == 12 + 3
  (line,) = [r.getMessage() for r in caplog.records if "end marker" in r.getMessage()]
  assert "may have been cut short (its 3 images are read)" in line


def test_a_tar_shard_cut_or_deleted_while_read_is_one_line(tmp_path):
  root, whole = _shards(tmp_path)
  shards = tar_shards.TarShards(root)
  shards.split("train")  # indexed
  second = tmp_path / "train" / "00001.tar"
  second.write_bytes(whole[:4000])
  with pytest.raises(errors.InputFileError, match=r"00001.tar' is cut short or damaged at byte "):
    shards.rows("train", 10, 20)
  assert [len(c) for c in shards.rows("train", 0, 12)[1]] == [1] * 12  # the first shard reads
  second.unlink()
  with pytest.raises(errors.MissingError, match=r"00001.tar' is missing \(it was listed when"):
    shards.rows("train", 10, 20)
