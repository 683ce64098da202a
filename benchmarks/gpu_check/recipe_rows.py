"""The flagship recipe end to end: JPEG files decoded by the pipeline's worker processes
(one per core), RandAugment (2, 10) and Mixup, the ViT-B/16 bf16 train step, read from
an image folder (`row_recipe_folder`) and from a tfds ArrayRecord dataset this module
prepares from the same files (`row_recipe_array_record`; tfds prepares ArrayRecord
without TensorFlow). Beside them timm's ``DataLoader`` runs the same recipe in its
workers (RandAugment ``rand-m10-n2``, Mixup in the workers' collate) and feeds timm's
compiled train step (`row_timm_recipe`)."""

from __future__ import annotations

import functools
import os
import pathlib
import time
from typing import Any, Callable

from benchmarks.gpu_check import measure, pipeline_rows
from benchmarks.gpu_check.config import MIXUP_P, RANDAUG, SMOKE

TFDS_NAME = "gpu_check_photos"
LOADER_WORKERS = 16


def recipe_settings(config: Any) -> dict[str, Any]:
  """What the recipe row ran: its augmentation, data and decoding."""
  return dict(
    randaug=list(config.pp.randaug),
    mixup=MIXUP_P,
    dataset=config.dataset,
    decode_processes=config.get("decode_processes"),
    cores=os.cpu_count(),
  )


def _recipe(config: Any) -> Any:
  config.pp.randaug = RANDAUG
  config.mixup.p = MIXUP_P
  return config


@functools.cache
def _builder_class() -> Any:
  """The tfds builder of `TFDS_NAME` (registered once per process)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  classes = pipeline_rows.CLASSES

  class GpuCheckPhotos(tfds.core.GeneratorBasedBuilder):
    """The check's JPEGs, ``root/{train,test}/class_<k>/*.jpg``."""

    VERSION = tfds.core.Version("1.0.0")
    code_path = pathlib.Path(__file__)

    def _info(self) -> Any:
      return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict(
          {
            "image": tfds.features.Image(encoding_format="jpeg"),
            "label": tfds.features.ClassLabel(num_classes=classes),
          }
        ),
      )

    def _split_generators(self, dl_manager: Any) -> Any:
      del dl_manager
      root = os.environ["GPU_CHECK_PHOTOS"]
      return {s: self._generate_examples(os.path.join(root, s)) for s in ("train", "test")}

    def _generate_examples(self, folder: str) -> Any:
      for label in range(classes):
        class_dir = os.path.join(folder, f"class_{label}")
        for name in sorted(os.listdir(class_dir)) if os.path.isdir(class_dir) else []:
          yield f"{label}/{name}", {"image": os.path.join(class_dir, name), "label": label}

  return GpuCheckPhotos


def prepare_tfds(root: str) -> str:
  """The tfds data_dir of `TFDS_NAME`: ``root``'s JPEGs stored as they are, prepared as
  ArrayRecord once per machine (tfds needs no TensorFlow for that format)."""
  os.environ["GPU_CHECK_PHOTOS"] = root
  data_dir = os.path.join(root, "tfds")
  builder = _builder_class()(data_dir=data_dir)
  if not builder.is_prepared():
    builder.download_and_prepare(file_format="array_record")
  return data_dir


def _row(smoke: bool, source: str) -> dict[str, Any]:
  """The recipe's train step fed from ``source`` ('folder' or 'array_record') by the
  package's pipeline, decoding in its worker processes."""
  _, why = pipeline_rows._pipeline()  # pylint: disable=protected-access
  if why:
    return dict(ok=True, skipped=why)
  from vit_jax import data  # pylint: disable=g-import-not-at-top

  root, batch, _ = pipeline_rows.jpeg_folder(smoke)
  config = _recipe(pipeline_rows.folder_config(root, batch))
  if source == "array_record":
    config.dataset, config.data_dir = TFDS_NAME, prepare_tfds(root)
  config = measure.shrink(config, smoke)
  config.batch = config.batch_eval = batch
  config.decode_processes = None  # one worker process per core
  feed = lambda trainer: data.train_iterator(trainer.spec.data, trainer.mesh)  # noqa: E731
  result = measure.train_row(config, smoke, feed=feed)
  result.update(**recipe_settings(config), files=root)
  return result


def row_recipe_folder(smoke: bool) -> dict[str, Any]:
  return _row(smoke, "folder")


def row_recipe_array_record(smoke: bool) -> dict[str, Any]:
  return _row(smoke, "array_record")


def row_timm_recipe(smoke: bool) -> dict[str, Any]:
  """timm's ViT-B/16 train step (bf16 autocast, fused AdamW, torch.compile, soft-target
  cross-entropy) fed by timm's ``DataLoader`` over the same JPEG folder with the recipe in
  its `LOADER_WORKERS` workers: RandAugment ``rand-m10-n2`` and Mixup (Beta(0.8, 0.8),
  every batch, as the package's ``config.mixup.p=0.8``) in the collate."""
  import timm  # pylint: disable=g-import-not-at-top
  import timm.data  # pylint: disable=g-import-not-at-top
  import timm.loss  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  from benchmarks.gpu_check import timm_rows  # pylint: disable=g-import-not-at-top

  root, batch, _ = pipeline_rows.jpeg_folder(smoke)
  cuda = torch.cuda.is_available() and not smoke
  device = torch.device("cuda" if cuda else "cpu")
  resolution = SMOKE["resolution"] if smoke else 224
  classes = pipeline_rows.CLASSES
  augment = f"rand-m{RANDAUG[1]}-n{RANDAUG[0]}"
  mixup = timm.data.FastCollateMixup(
    mixup_alpha=MIXUP_P, prob=1.0, label_smoothing=0.0, num_classes=classes
  )
  loader = timm.data.create_loader(
    timm.data.create_dataset("", root=root, split="train"),
    input_size=(3, resolution, resolution),
    batch_size=batch,
    is_training=True,
    auto_augment=augment,
    collate_fn=mixup,
    num_workers=0 if smoke else LOADER_WORKERS,
    device=device,
    use_prefetcher=True,
    pin_memory=cuda,
    persistent_workers=not smoke,
    use_multi_epochs_loader=not smoke,  # no stall at each pass over the 1,024 files
  )
  kwargs: dict[str, Any] = dict(num_classes=classes)
  if smoke:
    kwargs.update(img_size=resolution, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)
  net = timm.create_model(timm_rows.TIMM_MODEL, pretrained=False, **kwargs).to(device).train()
  compiled = torch.compile(net, backend="inductor" if cuda else "eager")
  opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.05, fused=cuda)
  loss_fn = timm.loss.SoftTargetCrossEntropy()
  steps, warmup = measure.counts(smoke)

  def step(images: Any, targets: Any) -> None:
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.bfloat16):
      loss = loss_fn(compiled(images.float()), targets)
    loss.backward()
    opt.step()

  sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
  seen, start = 0, 0.0
  while seen < steps + warmup:
    for images, targets in loader:
      step(images, targets)
      sync()
      seen += 1
      if seen == warmup:
        start = time.perf_counter()
      if seen >= steps + warmup:
        break
  seconds = time.perf_counter() - start
  return dict(
    ok=True,
    img_s=batch * steps / seconds,
    step_ms_mean=1e3 * seconds / steps,
    batch=batch,
    workers=0 if smoke else LOADER_WORKERS,
    randaug=list(RANDAUG),
    mixup=MIXUP_P,
    auto_augment=augment,
    cores=os.cpu_count(),
    timm=timm.__version__,
    torch=torch.__version__,
  )
