"""timm on the same GPU in the same run: ``vit_base_patch16_224``'s train step (bf16
autocast, fused AdamW, ``torch.compile``, PyTorch's fused attention: timm's default) and
inference on synthetic batches (`row_timm`), and timm's ``DataLoader`` over the check's
JPEG files (`row_timm_loader`)."""

from __future__ import annotations

import time
from typing import Any, Callable

from benchmarks.gpu_check import measure
from benchmarks.gpu_check.config import NUM_CLASSES, RESOLUTION, SMOKE

TIMM_MODEL = "vit_base_patch16_224"
LOADER_WORKERS = 16


def row_timm(smoke: bool) -> dict[str, Any]:
  """timm's ViT-B/16 train step (bf16 autocast, fused AdamW, torch.compile) and inference."""
  import timm  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  cuda = torch.cuda.is_available() and not smoke
  device = torch.device("cuda" if cuda else "cpu")
  kwargs = dict(num_classes=NUM_CLASSES)
  resolution = SMOKE["resolution"] if smoke else RESOLUTION
  if smoke:
    kwargs.update(img_size=resolution, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)
  steps_n, warmup = measure.counts(smoke)
  results: dict[str, Any] = dict(
    device=torch.cuda.get_device_name() if cuda else "cpu",
    torch=torch.__version__,
    timm=timm.__version__,
    compile_backend="inductor" if cuda else "eager",  # inductor's CPU code needs a compiler
  )

  def sync():
    if cuda:
      torch.cuda.synchronize()

  def timed(fn: Callable[[], Any]) -> tuple[float, list[float]]:
    start = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - start  # the compile
    for _ in range(warmup):
      fn()
    sync()
    times = []
    for _ in range(steps_n):
      start = time.perf_counter()
      fn()
      sync()
      times.append(time.perf_counter() - start)
    return first, times

  for mode, batch in (("train", 256), ("infer", 512)):
    batch = SMOKE["batch"] if smoke else batch
    torch.manual_seed(0)
    net = timm.create_model(TIMM_MODEL, pretrained=False, **kwargs).to(device)
    images = torch.rand(batch, 3, resolution, resolution, device=device) * 2 - 1
    labels = torch.randint(0, NUM_CLASSES, (batch,), device=device)
    compiled = torch.compile(net, backend=results["compile_backend"])
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    if mode == "train":
      net.train()
      opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.05, fused=cuda)

      def step(compiled=compiled, opt=opt, images=images, labels=labels, autocast=autocast):
        opt.zero_grad(set_to_none=True)
        with autocast:
          loss = torch.nn.functional.cross_entropy(compiled(images), labels)
        loss.backward()
        opt.step()
    else:
      net.eval()

      def step(compiled=compiled, images=images, autocast=autocast):
        with torch.inference_mode(), autocast:
          compiled(images)

    if cuda:
      torch.cuda.reset_peak_memory_stats()
    compile_s, times = timed(step)
    median = sorted(times)[len(times) // 2]
    results[mode] = dict(
      batch=batch,
      img_s=batch / median,
      step_ms_median=1e3 * median,
      compile_s=compile_s,
      peak_bytes=torch.cuda.max_memory_allocated() if cuda else None,
    )
    del net, compiled
  results["ok"] = True
  return results


def row_timm_loader(smoke: bool) -> dict[str, Any]:
  """Images/s of timm's train loader (`timm.data.create_loader`: decode, random resized
  crop, flip, normalise, `LOADER_WORKERS` workers, pinned memory) over the JPEG folder of
  `pipeline_rows.jpeg_folder`, batch 256, to tensors on the GPU."""
  import timm.data  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  from benchmarks.gpu_check import pipeline_rows  # pylint: disable=g-import-not-at-top

  root, batch, steps = pipeline_rows.jpeg_folder(smoke)
  cuda = torch.cuda.is_available() and not smoke
  resolution = SMOKE["resolution"] if smoke else RESOLUTION
  dataset = timm.data.create_dataset("", root=root, split="train")
  loader = timm.data.create_loader(
    dataset,
    input_size=(3, resolution, resolution),
    batch_size=batch,
    is_training=True,
    num_workers=0 if smoke else LOADER_WORKERS,
    device=torch.device("cuda" if cuda else "cpu"),
    use_prefetcher=cuda,
    pin_memory=cuda,
    persistent_workers=not smoke,
  )
  warmup = 1 if smoke else 3
  images, start, seen = 0, 0.0, 0
  while seen < steps + warmup:
    for x, _ in loader:
      if cuda:
        torch.cuda.synchronize()
      seen += 1
      if seen == warmup:
        start = time.perf_counter()
      elif seen > warmup:
        images += x.shape[0]
      if seen >= steps + warmup:
        break
  seconds = time.perf_counter() - start
  return dict(
    ok=True, img_s=images / seconds, batch=batch, workers=LOADER_WORKERS if not smoke else 0
  )
