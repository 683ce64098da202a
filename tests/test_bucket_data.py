"""Data on a bucket (a real GCS server, `tests.gcs_server`, behind a proxy that adds a
bucket's latency, `tests.gcs_proxy`), read by the real pipeline with its decode workers: an
image folder's files read many at a time, a tfds ArrayRecord data_dir read from local
copies of its files; the same batches as from local disk, exact resume, and a storage
that keeps failing is one StorageError line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from tests import gcs_proxy, train_fixtures
from vit_jax.data import dataset, digits, pipeline
from vit_jax.data import settings as data_settings
from vit_jax.infra import errors, storage

_BATCH, _STEPS, _RESUME = 8, 5, 3
_LATENCY_S = 0.05
_DOWNLOADS = "GET /download/"  # gcsfs reads an object's bytes with .../download/...?alt=media


def _folder(root: str) -> None:
  """<root>/{train,test}/class_<c>/<k>.jpg: 40 and 6 random 16x16 JPEGs of 3 classes."""
  rng = np.random.default_rng(0)
  for split, count in (("train", 40), ("test", 6)):
    for k in range(count):
      folder = os.path.join(root, split, f"class_{k % 3}")
      os.makedirs(folder, exist_ok=True)
      pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
      Image.fromarray(pixels).save(os.path.join(folder, f"{k:03d}.jpg"), quality=90)


def _settings(name: str, data_dir: str | None = None, **overrides) -> data_settings.Settings:
  config = train_fixtures.common_config(
    dataset=name,
    data_dir=data_dir,
    train_split="train",
    test_split="test",
    pp=dict(crop=8),
    batch=_BATCH,
    batch_eval=_BATCH,
    decode_processes=2,  # the default on 2 cores: worker processes read and decode
  )
  config.update(overrides)
  return data_settings.Settings.from_config(config)


def _train(settings: data_settings.Settings, start_step: int, steps: int) -> dict[str, np.ndarray]:
  """{'image', 'label'} of `steps` host batches from `start_step`, concatenated."""
  batches = pipeline.local_train_batches(dataset.Dataset(settings), _BATCH, start_step, 0, 1)
  try:
    got = [next(batches) for _ in range(steps)]
  finally:
    batches.close()
  return {k: np.concatenate([b[k] for b in got]) for k in ("image", "label")}


def _assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.fixture
def proxied(gcs_server, gcs_bucket):
  """(bucket, proxy): a new bucket, and a proxy in front of the server adding `_LATENCY_S`
  to every request (a test points STORAGE_EMULATOR_HOST at it once its data is uploaded)."""
  proxy = gcs_proxy.GcsProxy(gcs_server.url, latency_s=_LATENCY_S)
  yield gcs_bucket, proxy
  proxy.close()


def _folder_on_bucket(tmp_path, bucket: str, proxy: gcs_proxy.GcsProxy, monkeypatch) -> tuple:
  """(local folder, its copy on the bucket): `_folder`'s images, uploaded; this process and
  those it starts reach the bucket through ``proxy`` from now on."""
  local = str(tmp_path / "images")
  _folder(local)
  remote = f"{bucket}/images"
  storage.filesystem(remote).put(local, remote, recursive=True)
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
  return local, remote


def _arrivals(proxy: gcs_proxy.GcsProxy, pattern: str) -> list[float]:
  """The times at which requests matching ``pattern`` reach the proxy, from now on."""
  times: list[float] = []
  lock = threading.Lock()

  def seen(_):
    with lock:
      times.append(time.monotonic())

  proxy.on(pattern, seen)
  return times


def _most_within(times: list[float], seconds: float) -> int:
  """The most requests that arrived within any ``seconds``."""
  times = sorted(times)
  return max((np.searchsorted(times, t + seconds) - i for i, t in enumerate(times)), default=0)


def test_an_image_folder_on_a_bucket_gives_the_local_batches_reading_files_at_once(
  tmp_path, proxied, monkeypatch
):
  """The workers read a group's remote files at once (a burst of requests within one
  latency, where one file at a time would send one per worker); the batches are the local
  folder's, bit for bit, and a resumed stream is the straight one's tail."""
  bucket, proxy = proxied
  local, remote = _folder_on_bucket(tmp_path, bucket, proxy, monkeypatch)
  arrivals = _arrivals(proxy, rf"{_DOWNLOADS}.*\.jpg")
  straight = _train(_settings(f"folder:{remote}"), 0, _STEPS)
  assert _most_within(arrivals, _LATENCY_S / 2) >= 8, sorted(arrivals)
  _assert_same(straight, _train(_settings(f"folder:{local}"), 0, _STEPS))
  resumed = _train(_settings(f"folder:{remote}"), _RESUME, _STEPS - _RESUME)
  _assert_same({k: v[_RESUME * _BATCH :] for k, v in straight.items()}, resumed)
  # Grain's threads (config.decode_processes=0) read a group's files at once too.
  _assert_same(straight, _train(_settings(f"folder:{remote}", decode_processes=0), 0, _STEPS))


def test_an_image_missing_from_the_bucket_is_named_or_skipped_as_a_local_one(
  tmp_path, proxied, monkeypatch
):
  bucket, proxy = proxied
  _, remote = _folder_on_bucket(tmp_path, bucket, proxy, monkeypatch)
  data = dataset.Dataset(_settings(f"folder:{remote}"))
  data.split("train")  # listed: the file is known
  gone = f"{remote}/train/class_1/004.jpg"
  storage.filesystem(gone).rm(gone)
  batches = pipeline.local_train_batches(data, _BATCH, 0, 0, 1)
  with pytest.raises(errors.ConfigError, match=re.escape(f"Cannot read image {gone!r}")):
    for _ in range(_STEPS):
      next(batches)
  batches.close()
  skipping = _settings(f"folder:{remote}", skip_corrupt_images=True)
  got = _train(skipping, 0, _STEPS)
  assert got["image"].shape == (_STEPS * _BATCH, 8, 8, 3)


def _fail_retries_at_once(tmp_path, monkeypatch) -> None:
  """gcsfs retries a 503 with about 30 s of backoff: made instant in this process and, by a
  `sitecustomize` on PYTHONPATH, in the decode workers it starts."""
  import gcsfs.retry  # pylint: disable=g-import-not-at-top

  async def no_wait(_):
    pass

  monkeypatch.setattr(gcsfs.retry.asyncio, "sleep", no_wait)
  site = tmp_path / "site"
  site.mkdir()
  (site / "sitecustomize.py").write_text(
    "import gcsfs.retry\n\n\nasync def _no_wait(_):\n  pass\n\n\n"
    "gcsfs.retry.asyncio.sleep = _no_wait\n"
  )
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))


def _storage_error(
  settings: data_settings.Settings, proxy: gcs_proxy.GcsProxy, pattern: str
) -> str:
  """The error of the first batch once the requests matching ``pattern`` are answered 503
  past every retry (the data listed before): one line that says 503."""
  data = dataset.Dataset(settings)
  data.split("train")
  proxy.fail(10_000, pattern)
  batches = pipeline.local_train_batches(data, _BATCH, 0, 0, 1)
  with pytest.raises(errors.StorageError) as raised:
    next(batches)
  batches.close()
  message = str(raised.value)
  assert "\n" not in message and "503" in message, message
  return message


def test_a_bucket_failing_during_image_reads_is_one_storage_error_line(
  tmp_path, proxied, monkeypatch
):
  bucket, proxy = proxied
  _, remote = _folder_on_bucket(tmp_path, bucket, proxy, monkeypatch)
  _fail_retries_at_once(tmp_path, monkeypatch)
  message = _storage_error(_settings(f"folder:{remote}"), proxy, rf"{_DOWNLOADS}.*\.jpg")
  assert re.search(rf"Reading {re.escape(remote)}/train/class_\d/\d+\.jpg failed", message)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict[str, str]:
  """{file format: a local tfds data_dir of digits prepared in it, 3 files per split}."""
  dirs = {}
  for file_format in ("array_record", "tfrecord"):
    dirs[file_format] = str(tmp_path_factory.mktemp(file_format))
    tfds.builder(digits.NAME, data_dir=dirs[file_format]).download_and_prepare(
      file_format=file_format, download_config=tfds.download.DownloadConfig(num_shards=3)
    )
  return dirs


def _tfds_on_bucket(local: str, tmp_path, bucket: str, proxy, monkeypatch) -> str:
  """The data_dir ``local`` uploaded (its URL); reached through ``proxy`` from now on, the
  local copies of its files under ``tmp_path / 'cache'``."""
  remote = f"{bucket}/tfds"
  storage.filesystem(remote).put(local, remote, recursive=True)
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  return remote


@pytest.mark.parametrize("file_format", ["array_record", "tfrecord"])
def test_a_tfds_data_dir_on_a_bucket_reads_from_local_copies_made_once(
  file_format, prepared, tmp_path, proxied, monkeypatch
):
  """Its files are copied into $XDG_CACHE_HOME/vit_jax/data on the first read and read there:
  the local data_dir's batches, exact resume and evaluation; a later run copies nothing."""
  bucket, proxy = proxied
  local = prepared[file_format]
  remote = _tfds_on_bucket(local, tmp_path, bucket, proxy, monkeypatch)
  copied = _arrivals(proxy, rf"{_DOWNLOADS}.*{file_format}")
  straight = _train(_settings("digits", remote), 0, _STEPS)
  folder = tmp_path / "cache" / "vit_jax" / "data" / "gs" / bucket.removeprefix("gs://")
  copies = sorted(p.name for p in folder.rglob("digits-*"))  # tfds/digits/<version>/
  assert [re.sub(r"\.\d+$", "", c) for c in copies] == [
    f"digits-train.{file_format}-0000{k}-of-00003" for k in range(3)
  ]
  assert copied  # read from the bucket once
  _assert_same(straight, _train(_settings("digits", local), 0, _STEPS))
  del copied[:]
  resumed = _train(_settings("digits", remote), _RESUME, _STEPS - _RESUME)
  _assert_same({k: v[_RESUME * _BATCH :] for k, v in straight.items()}, resumed)
  assert not copied  # the copies are read
  passes = []
  for data_dir in (remote, local):
    data = dataset.Dataset(_settings("digits", data_dir))
    evaluation = pipeline.EvalBatches(data, "test", 64, 0, 1)
    passes.append([(b["image"], b["mask"]) for b in evaluation])
  for (image, mask), (local_image, local_mask) in zip(*passes):
    np.testing.assert_array_equal(mask, local_mask)
    np.testing.assert_array_equal(image, local_image)


def test_a_bucket_failing_while_a_file_is_copied_is_one_storage_error_line(
  prepared, tmp_path, proxied, monkeypatch
):
  bucket, proxy = proxied
  remote = _tfds_on_bucket(prepared["array_record"], tmp_path, bucket, proxy, monkeypatch)
  _fail_retries_at_once(tmp_path, monkeypatch)
  message = _storage_error(_settings("digits", remote), proxy, rf"{_DOWNLOADS}.*array_record")
  assert re.search(
    rf"Reading {re.escape(remote)}/digits/[\d.]+/digits-train\.array_record", message
  )
  left = [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.name != ".lock"]
  assert not left  # no part of a copy is left behind


def test_webdataset_shards_on_a_bucket_are_read_from_local_copies(tmp_path, proxied, monkeypatch):
  """Indexing a split reads every shard whole: it copies them, and the examples are read
  from the copies, as the local shards' (a copy made, an example would be two requests)."""
  from tests import image_text_fixtures  # pylint: disable=g-import-not-at-top
  from vit_jax.data import tar_shards  # pylint: disable=g-import-not-at-top

  bucket, proxy = proxied
  local = image_text_fixtures.write_shards(tmp_path / "shards").removeprefix(tar_shards.PREFIX)
  remote = f"{bucket}/shards"
  storage.filesystem(remote).put(local, remote, recursive=True)
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  shards = tar_shards.TarShards(remote)
  shards.index("train")
  reads = _arrivals(proxy, _DOWNLOADS)
  n = image_text_fixtures.N
  got, expected = shards.rows("train", 0, n), tar_shards.TarShards(local).rows("train", 0, n)
  assert not reads  # read from the copies
  assert list(got[0]) == list(expected[0]) and list(got[1]) == list(expected[1])
  assert len(list((tmp_path / "cache").rglob("0000[01].tar.*"))) == 2


@pytest.mark.slow  # the benchmark script; the bucket reads it times are tested above
def test_the_benchmark_smoke_times_each_source_local_and_on_the_bucket():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run(
    [sys.executable, "benchmarks/bucket_reads.py", "--smoke"],
    capture_output=True,
    text=True,
    cwd=root,
    timeout=600,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
  assert rows[0].startswith("| data (") and "| bucket 20 ms / local |" in rows[0]
  for row, label in zip(rows[1:], ("image folder", "tfds ArrayRecord"), strict=True):
    assert row.startswith(f"| {label}") and re.search(r"\| \*\*\d+\.\d\d\*\* \|", row), row
  assert re.search(r"storage's CPU .*: \d+\.\d\d ms per request", done.stdout), done.stdout
