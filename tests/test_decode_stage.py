"""The decoding stage's batches (`data/decode_stage.py`): threads or processes write each image
straight into its batch row; a failed image's gap is closed by moving the later rows up."""

import io
import os
from typing import Iterator

import numpy as np
import pytest
from PIL import Image

from tests import train_fixtures
from vit_jax import data
from vit_jax.data import decode_stage

CROP = 8


def _jpeg(value: int) -> bytes:
  out = io.BytesIO()
  Image.fromarray(np.full((12, 10, 3), value, np.uint8)).save(out, "JPEG", quality=95)
  return out.getvalue()


class _Reader:
  """A reader's stream in chunks of 5: example i is a flat JPEG of value 10 * i, or
  broken bytes where i is in `broken`."""

  def __init__(self, count: int, broken: set[int]):
    self._values = [b"\xff\xd8\xff broken" if i in broken else _jpeg(10 * i) for i in range(count)]

  def __call__(self) -> Iterator[tuple[np.ndarray, ...]]:
    for start in range(0, len(self._values), 5):
      ids = np.arange(start, min(start + 5, len(self._values)))
      values = np.empty(len(ids), object)
      values[:] = [self._values[i] for i in ids]
      yield ids + 100, ids, values, ids % 3, np.full(len(ids), b"", object)


@pytest.mark.parametrize("processes", [0, 2], ids=["threads", "processes"])
@pytest.mark.parametrize("broken", [set(), {0}, {3, 4, 5}, {6, 13, 22}, set(range(7, 15))])
def test_rows_close_the_gaps_of_failed_images(broken, processes):
  config = train_fixtures.common_config(dataset="digits", pp=dict(crop=CROP))
  settings = data.Settings.from_config(config)
  stage = decode_stage.Stage(
    settings, "bytes", num_classes=3, train=True, workers=2, processes=processes
  )
  reader = _Reader(23, broken)
  batches = list(stage.batches(reader, local_batch=4)())
  kept = [i for i in range(23) if i not in broken]
  positions, images, labels, _, uids = (np.concatenate(a) for a in zip(*batches))
  assert [len(b[0]) for b in batches] == [4] * (len(kept) // 4) + [len(kept) % 4] * (
    len(kept) % 4 > 0
  )
  np.testing.assert_array_equal(uids, kept)
  np.testing.assert_array_equal(positions, np.asarray(kept) + 100)
  np.testing.assert_array_equal(labels.argmax(-1), np.asarray(kept) % 3)
  for uid, image in zip(kept, images):  # Each row is its own example's image.
    np.testing.assert_array_equal(image, stage.image(_jpeg(10 * uid), uid))
    assert abs(image.mean() - (10 * uid - 127.5) / 127.5) < 0.02


def test_usable_cores_are_bounded_by_a_containers_cpu_quota(tmp_path):
  affinity = len(os.sched_getaffinity(0))
  (tmp_path / "cpu.max").write_text("250000 100000\n")  # cgroup v2: 2.5 CPUs
  assert decode_stage.cpu_quota(str(tmp_path)) == 2.5
  assert decode_stage.usable_cores(str(tmp_path)) == min(affinity, 3)
  (tmp_path / "cpu.max").write_text("max 100000\n")
  assert decode_stage.cpu_quota(str(tmp_path)) is None
  assert decode_stage.usable_cores(str(tmp_path)) == affinity
  v1 = tmp_path / "v1" / "cpu"  # cgroup v1: quota and period in microseconds
  v1.mkdir(parents=True)
  (v1 / "cpu.cfs_quota_us").write_text("50000\n")
  (v1 / "cpu.cfs_period_us").write_text("100000\n")
  assert decode_stage.cpu_quota(str(tmp_path / "v1")) == 0.5
  assert decode_stage.usable_cores(str(tmp_path / "v1")) == 1
  (v1 / "cpu.cfs_quota_us").write_text("-1\n")  # unlimited
  assert decode_stage.cpu_quota(str(tmp_path / "v1")) is None
