"""The check's rows, in the order they run: what is still unknown first, so that a check
cut short by its budget has measured what mattered (`ROWS`). Each row is a function of
``smoke`` returning its figures, with ``ok``; ``skipped`` says why a row could not run
here."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from benchmarks.gpu_check import correctness, measure, pipeline_rows, timm_rows
from benchmarks.gpu_check.config import DEFAULT, get_config, randaug_config, siglip_config

PROFILE_STEPS = 5
BATCH = 256  # ViT-B/16's and SigLIP B/16's train batch per GPU


@dataclasses.dataclass(frozen=True)
class Speed:
  """A timed step of the run: train or infer, the model, its global batch, the attention
  (`DEFAULT`: the attention and dtype left unset, the backend's choice)."""

  mode: str
  model: str
  batch: int
  attention: str

  @property
  def name(self) -> str:
    return f"{self.mode}/{self.model}/{self.batch}/{self.attention}"

  def config(self, smoke: bool) -> Any:
    # The CPU has no cuDNN: XLA's attention there, the same code path up to the kernel.
    attention = "xla" if smoke and self.attention == "cudnn" else self.attention
    return get_config(f"{self.model},{self.batch},{attention}")

  def measure(self, smoke: bool) -> dict[str, Any]:
    if self.mode == "train":
      return measure.train_row(self.config(smoke), smoke)
    return measure.infer_row(self.config(smoke), smoke)


TRAIN_DEFAULT = Speed("train", "ViT-B_16", BATCH, DEFAULT)
INFER_DEFAULT = Speed("infer", "ViT-B_16", 512, DEFAULT)
# Rows measured before (docs/performance.md, "On a GPU"), run as time allows.
KNOWN = (
  Speed("train", "ViT-L_16", 128, DEFAULT),
  Speed("train", "ViT-B_16", BATCH, "einsum"),
  Speed("train", "ViT-S_16", 512, DEFAULT),
  Speed("train", "ViT-B_16", BATCH, "xla"),
)
SPEEDS = (TRAIN_DEFAULT, INFER_DEFAULT, *KNOWN)
RANDAUG = f"randaug/ViT-B_16/{BATCH}"
PIPELINE = f"pipeline/ViT-B_16/{BATCH}"
SIGLIP = f"siglip/B_16/{BATCH}"


def _profile(smoke: bool) -> dict[str, Any]:
  return measure.train_row(TRAIN_DEFAULT.config(smoke), smoke, profile_steps=PROFILE_STEPS)


ROWS: dict[str, Callable[[bool], dict[str, Any]]] = {
  TRAIN_DEFAULT.name: TRAIN_DEFAULT.measure,
  "timm": timm_rows.row_timm,
  "profile": _profile,
  INFER_DEFAULT.name: INFER_DEFAULT.measure,
  RANDAUG: lambda smoke: measure.train_row(randaug_config(BATCH), smoke),
  PIPELINE: pipeline_rows.row_pipeline,
  "timm_loader": timm_rows.row_timm_loader,
  SIGLIP: lambda smoke: measure.train_row(siglip_config(BATCH), smoke),
  "correctness": correctness.row_correctness,
  **{speed.name: speed.measure for speed in KNOWN},
}
