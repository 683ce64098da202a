"""The input-pipeline rows: ViT-B/16 training fed from JPEG files on local disk through the
package's data pipeline over an image folder (``config.dataset='folder:ROOT'``), beside
the pipeline alone; `timm_rows.row_timm_loader` reads the same files. They use only the
public data interface (`vit_jax.data.train_iterator`: decoding in worker processes, one
per core of the host, and for comparison the pipeline alone in the main process's
threads, `config.decode_processes=0`), and skip with the reason when the pipeline cannot
import here."""

from __future__ import annotations

import io
import os
import tempfile
import time
from typing import Any, Optional

from benchmarks.gpu_check import measure
from benchmarks.gpu_check.config import DEFAULT, get_config

BATCH = 256
STEPS = 10  # timed batches of the pipeline alone
# Files: 4 batches' worth, photo-sized (500x375), read in as many epochs as the rows need.
IMAGES = 4 * BATCH
SIZE = (500, 375)
SMOKE_FILES = dict(images=16, size=(64, 48), batch=4, steps=2)
CLASSES = 10


def _jpeg(seed: int, size: tuple[int, int]) -> bytes:
  """A photo-like JPEG: a smooth random field (a bicubic upsampling of 12x16 values) with
  noise, so that it decodes like a photograph, not like a flat image."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)
  small = Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8))
  field = np.asarray(small.resize(size, Image.BICUBIC), np.float32)
  noisy = np.clip(field + rng.normal(0, 6, field.shape), 0, 255).astype(np.uint8)
  out = io.BytesIO()
  Image.fromarray(noisy).save(out, "JPEG", quality=90)
  return out.getvalue()


def _write(args: tuple[str, int, tuple[int, int]]) -> None:
  path, seed, size = args
  with open(path, "wb") as f:
    f.write(_jpeg(seed, size))


def jpeg_folder(smoke: bool) -> tuple[str, int, int]:
  """(root, batch, timed batches): ``root/{train,test}/class_<k>/*.jpg`` on local disk,
  written once per machine (a marker file says it is complete) by a process pool."""
  import multiprocessing  # pylint: disable=g-import-not-at-top

  images, size = (SMOKE_FILES["images"], SMOKE_FILES["size"]) if smoke else (IMAGES, SIZE)
  batch, steps = (SMOKE_FILES["batch"], SMOKE_FILES["steps"]) if smoke else (BATCH, STEPS)
  root = os.path.join(tempfile.gettempdir(), f"gpu_check_jpegs_{images}_{size[0]}x{size[1]}")
  marker = os.path.join(root, "complete")
  if not os.path.exists(marker):
    jobs = []
    for split, count in (("train", images), ("test", CLASSES)):
      for k in range(count):
        folder = os.path.join(root, split, f"class_{k % CLASSES}")
        os.makedirs(folder, exist_ok=True)
        jobs.append((os.path.join(folder, f"{k:05d}.jpg"), len(jobs), size))
    with multiprocessing.Pool(min(16, os.cpu_count() or 1)) as pool:
      pool.map(_write, jobs)
    open(marker, "w").close()
  return root, batch, steps


def folder_config(root: str, batch: int) -> Any:
  """ViT-B/16's default train row reading ``root`` as an image folder."""
  config = get_config(f"ViT-B_16,{batch},{DEFAULT}")
  config.dataset = f"folder:{root}"
  config.train_split, config.test_split = "train", "test"
  config.num_classes = CLASSES
  return config


def _pipeline() -> tuple[Optional[Any], Optional[str]]:
  """(the `vit_jax.data` module, None), or (None, why the pipeline cannot import here)."""
  try:
    from vit_jax import data  # pylint: disable=g-import-not-at-top

    data.train_iterator  # noqa: B018  (loads the pipeline's modules)
  except ImportError as e:
    return None, f"the input pipeline does not import here: {e}"
  return data, None


def row_pipeline(smoke: bool) -> dict[str, Any]:
  """The pipeline alone (img/s of blocked global batches), then the train step fed by it
  end to end (`measure.train_row` with the pipeline's batches)."""
  data, why = _pipeline()
  if data is None:
    return dict(ok=True, skipped=why)
  import jax  # pylint: disable=g-import-not-at-top

  from vit_jax.infra import sharding  # pylint: disable=g-import-not-at-top

  root, batch, steps = jpeg_folder(smoke)
  config = measure.shrink(folder_config(root, batch), smoke)
  config.batch = config.batch_eval = batch
  mesh = sharding.make_mesh(tuple(config.mesh))

  def alone(processes: Optional[int]) -> float:
    """Img/s of the pipeline alone, its images decoded by `processes` worker processes
    (None: the default, one per core; 0: the main process's threads)."""
    config.decode_processes = processes
    batches = data.train_iterator(data.Settings.from_config(config), mesh)
    jax.block_until_ready(next(batches))  # the pipeline's start-up
    start = time.perf_counter()
    for _ in range(steps):
      jax.block_until_ready(next(batches))
    rate = batch * steps / (time.perf_counter() - start)
    batches.close()
    return rate

  threads, processes = alone(0), alone(None)
  feed = lambda trainer: data.train_iterator(trainer.spec.data, trainer.mesh)  # noqa: E731
  result = measure.train_row(config, smoke, feed=feed)
  result.update(pipeline_img_s=processes, pipeline_threads_img_s=threads, files=root)
  return result
