r"""Writes an official-layout `.npz` from any weights source.

    python -m vit_jax.convert SOURCE --out=FILE.npz [--scanned] [--model=NAME]

SOURCE: anything `vit_jax.interop.loader` reads: an official `.npz`, a training run, a
Hugging Face or timm checkpoint (folder or `.safetensors`), ``hf-hub:<org>/<name>[@rev]``
or an official name (``ViT-B_16``, an AugReg file stem), fetched through the Hugging Face
cache. The file has the official keys and shapes (docs/checkpoint_format.md), per-layer
as the official files (which the official code and timm's npz loader read), or with
--scanned the stacked `Transformer/encoderblock` layout of big_vision. An `.npz` holds no
GELU choice: code reading it runs the tanh GELU, as the official weights were trained.
"""

from __future__ import annotations

from typing import Sequence

from absl import app, flags, logging

from vit_jax import checkpoint
from vit_jax.interop import loader

_OUT = flags.DEFINE_string("out", None, "The .npz file to write.")
_SCANNED = flags.DEFINE_bool(
  "scanned", False, "Stack the encoder blocks (Transformer/encoderblock [L, ...], big_vision)."
)
_MODEL = flags.DEFINE_string(
  "model", None, "An official variant name for an .npz source; default: inferred."
)


def convert(source: str, out: str, *, scanned: bool = False, model_name: str | None = None) -> None:
  """Reads ``source`` and writes its parameters to the official-layout `.npz` ``out``."""
  model = loader.load(source, model_name)
  checkpoint.save_npz(out, model.params, scanned=scanned)
  gelu = "tanh" if model.config.get("gelu_approximate", True) else "exact (erf)"
  logging.info(
    "Wrote %s (%s, %s classes) from %s; its source computes the %s GELU.",
    out,
    model.config.name,
    model.num_classes or "no head,",
    source,
    gelu,
  )


def main(argv: Sequence[str]) -> None:
  if len(argv) != 2:
    raise app.UsageError("Name one source: python -m vit_jax.convert SOURCE --out=FILE.npz")
  convert(argv[1], _OUT.value, scanned=_SCANNED.value, model_name=_MODEL.value)


if __name__ == "__main__":
  flags.mark_flag_as_required("out")
  app.run(main)
