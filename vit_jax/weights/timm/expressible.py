"""Whether a timm checkpoint's architecture name is a model this package computes.

The arrays alone cannot tell: a model whose position embeddings are computed rather than
stored (rotary embeddings) leaves no array over, so a reader that maps the arrays it knows
would load it and compute something else. timm's `config.json` names its ``architecture``
(our export's `timm_model.json` its ``model_name``); `check_timm` decides from it, before
any array is read, asking the family records (`families.py`): a family this package does
not express, or a name it has never seen, is one `CheckpointError` naming it and what is
missing.
"""

from __future__ import annotations

from vit_jax.infra import errors
from vit_jax.weights.timm import families, names

# timm modules (`names.module`) whose models this package does not compute: the family
# and what it has that ours lacks. A name of a module a timm family reads is checked by
# that family's record (`families.TimmFamily.unexpressed`).
TIMM_MODULES_UNEXPRESSED = {
  "vision_transformer_relpos": (
    "a relative-position ViT",
    "a relative position bias per block (timm's RelPosMlp/RelPosBias)",
  ),
  "vision_transformer_sam": (
    "SAM's image encoder",
    "windowed attention with decomposed relative positions, and the convolutional neck",
  ),
  "beit": ("BEiT", "a relative position bias table per block"),
  "cait": ("CaiT", "talking-heads attention and class-attention blocks"),
  "convit": ("ConViT", "gated positional self-attention"),
  "crossvit": ("CrossViT", "two patch-size branches joined by cross-attention"),
  "xcit": ("XCiT", "cross-covariance attention, local patch interaction and a conv stem"),
  "deepseek_vit": ("DeepSeek's ViT", "RMSNorm, a bias-free SwiGLU and axial RoPE"),
  "gemma4_vit": ("Gemma 4's ViT", "2D RoPE, q/k normalisation and four norms per block"),
  "qwen3_vit": ("Qwen3's ViT", "axial RoPE beside a resampled absolute table"),
}


def check_timm(name: str, source: str) -> None:
  """A `CheckpointError` when timm architecture ``name`` (a pretrained tag after a dot is
  ignored; "" names nothing) is not a model this package computes."""
  base = name.split(".")[0]
  if not base:
    return
  module = names.module(base)
  family = families.for_module(module)
  if family is not None:
    missing = family.unexpressed(base) if family.unexpressed is not None else []
    if missing:
      refusal = family.refusal.format(module=module, missing=", ".join(missing))
      raise errors.CheckpointError(f"{source}: timm architecture {name!r} {refusal}")
    return
  if module in TIMM_MODULES_UNEXPRESSED:
    what, missing = TIMM_MODULES_UNEXPRESSED[module]
    raise errors.CheckpointError(
      f"{source}: timm architecture {name!r} is {what} (timm {module}.py), which this "
      f"package does not compute: it has {missing}."
    )
  if module is None and not families.named_by_prefix(base):
    raise errors.CheckpointError(
      f"{source}: timm architecture {name!r} is none this package computes (it reads "
      f"timm's {families.read_families()} models)."
    )
