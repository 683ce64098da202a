"""The check's rows, in the order they run: NaFlex's padded attention and its budgets'
train steps, the default train step beside timm, the recipe end to end from JPEGs beside
timm's loader on the same recipe, the profile, inference, then the rest, so that a check
cut short by its budget has measured what mattered (`ROWS`). Each row is a function of
``smoke`` returning its figures, with ``ok``; ``skipped`` says why a row could not run
here."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from benchmarks.gpu_check import (
  correctness,
  measure,
  naflex_rows,
  pipeline_rows,
  recipe_rows,
  timm_rows,
)
from benchmarks.gpu_check.config import (
  DEFAULT,
  RANDAUG_ROW,
  SIGLIP_ROW,
  get_config,
  randaug_config,
  siglip_config,
)

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
# The recipe (RandAugment (2, 10), Mixup) end to end from JPEG files, two sources.
RECIPE = f"recipe/ViT-B_16/{BATCH}"
RECIPE_ARRAY_RECORD = f"recipe/ViT-B_16/{BATCH}/array_record"
# The train rows `--make-plan` plans: row -> `config.get_config`'s argument; those the
# checks measured first. The recipe rows run the RandAugment row's step (10 classes, not
# 1000: the same time); ViT-S/16's einsum row is the one the first check measured.
PLANNED: dict[str, str] = {
  RANDAUG: RANDAUG_ROW,
  RECIPE: RANDAUG_ROW,
  RECIPE_ARRAY_RECORD: RANDAUG_ROW,
  SIGLIP: SIGLIP_ROW,
  "train/ViT-S_16/512/einsum": "ViT-S_16,512,einsum",
  **{s.name: f"{s.model},{s.batch},{s.attention}" for s in SPEEDS if s.mode == "train"},
}


def _profile(smoke: bool) -> dict[str, Any]:
  return measure.train_row(TRAIN_DEFAULT.config(smoke), smoke, profile_steps=PROFILE_STEPS)


NAFLEX_ATTENTION = "naflex/masked_attention"
NAFLEX_MIXED = "naflex/ViT-B_16/mixed_budgets"
ROWS: dict[str, Callable[[bool], dict[str, Any]]] = {
  NAFLEX_ATTENTION: naflex_rows.row_masked_attention,
  NAFLEX_MIXED: naflex_rows.row_mixed_budgets,
  TRAIN_DEFAULT.name: TRAIN_DEFAULT.measure,
  "timm": timm_rows.row_timm,
  RECIPE: recipe_rows.row_recipe_folder,
  RECIPE_ARRAY_RECORD: recipe_rows.row_recipe_array_record,
  "timm_recipe": recipe_rows.row_timm_recipe,
  "profile": _profile,
  INFER_DEFAULT.name: INFER_DEFAULT.measure,
  RANDAUG: lambda smoke: measure.train_row(randaug_config(BATCH), smoke),
  PIPELINE: pipeline_rows.row_pipeline,
  "timm_loader": timm_rows.row_timm_loader,
  SIGLIP: lambda smoke: measure.train_row(siglip_config(BATCH), smoke),
  "correctness": correctness.row_correctness,
  **{speed.name: speed.measure for speed in KNOWN},
}
