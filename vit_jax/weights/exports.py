"""The export formats (``--format``, `Model.save`), one `Export` record each: its name, how
to load what it wrote (the line the export command prints), whether an image-text model is
written whole or as its image tower, and whether its loader reads local files only.

A checkpoint format that can be written names its record (`formats.Format.export`, whose
writer the model's family picks); a serving format writes through `serving` (``serve``).
A new export format is one record in `EXPORTS` and its writer.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from vit_jax.infra import errors
from vit_jax.infra.aliases import Params
from vit_jax.weights import serving


def _big_vision() -> Any:
  from vit_jax.weights import big_vision  # pylint: disable=g-import-not-at-top

  return big_vision


def _timm_naflex() -> Any:
  from vit_jax.weights.timm import naflex  # pylint: disable=g-import-not-at-top

  return naflex


# A serving format's writer: (folder, module, params, image_size) -> None.
Serve = Callable[[str, Any, Params, tuple[int, int]], None]


@dataclasses.dataclass(frozen=True)
class Export:
  """One export format."""

  name: str  # the --format value
  hint: str  # how to load the folder ``{out}``, printed after the export
  image_tower: bool = False  # an image-text model's image tower alone (its features)
  local_files: bool = False  # its loader reads local files only (copy a bucket's first)
  # How to load an image-text model written whole, where that differs from ``hint``.
  two_tower_hint: Optional[str] = None
  serve: Optional[Serve] = None  # a serving format's writer; None: its checkpoint format's
  # Whether the format keeps a model's table stored at its own grid (``posemb_grid``, a
  # NaFlex tower's) for its loader to resize; False: the table at the export's input grid.
  keeps_grid: Callable[[Any], bool] = lambda config: False


HF = Export(
  name="hf",
  hint="transformers.ViTForImageClassification.from_pretrained({out!r}) "
  "(and AutoImageProcessor.from_pretrained({out!r}) for the preprocessing)",
  local_files=True,
  two_tower_hint="transformers.AutoModel.from_pretrained({out!r}) and "
  "AutoProcessor.from_pretrained({out!r})",
)
TIMM = Export(
  name="timm",
  hint="timm.create_model('local-dir:{out}') (a shape timm has no name for: "
  "timm_model.json's kwargs, the architecture's class)",
  image_tower=True,
  local_files=True,
  keeps_grid=lambda config: _timm_naflex().writes(config),  # as timm's NaFlexViT
)
SAVED_MODEL = Export(
  name="saved_model",
  hint="tf.saved_model.load({out!r}).signatures['serving_default']"
  "(images=x)['output_0'], x: float32 [B, H, W, 3] in [-1, 1]",
  image_tower=True,
  serve=lambda *args: serving.write_saved_model(*args),  # serving's, looked up when called
)
STABLEHLO = Export(
  name="stablehlo",
  hint="jax.export.deserialize(open({out!r} + '/model.jax_exported', 'rb').read())"
  ".call(x), x: float32 [B, H, W, 3] in [-1, 1]",
  image_tower=True,
  local_files=True,
  serve=lambda *args: serving.write_jax_exported(*args),  # serving's, looked up when called
)
NPZ = Export(
  name="npz",
  hint="python -m vit_jax.predict --checkpoint={out}/model.npz, or "
  "--config.pretrained={out}/model.npz to fine-tune",
  keeps_grid=lambda config: True,  # its config travels with it
)
BIG_VISION = Export(
  name="big_vision",
  hint="big_vision's two_towers.load(None, {out!r} + '/model.npz', model_cfg) "
  "(a ViT: vit.load; a NaFlex tower: proj.image_text.naflex_vit.load), its tokenizer "
  "{out}/model.model; or vit_jax.load({out!r})",
  keeps_grid=lambda config: _big_vision().keeps_naflex_layout(config),
)

EXPORTS: tuple[Export, ...] = (HF, TIMM, SAVED_MODEL, STABLEHLO, NPZ, BIG_VISION)
NAMES: tuple[str, ...] = tuple(e.name for e in EXPORTS)


def by_name(name: str) -> Export:
  """The record of ``--format=name``; an unknown name is one error listing them."""
  found = next((e for e in EXPORTS if e.name == name), None)
  if found is None:
    raise errors.CommandLineError(f"Unknown format {name!r}; choose one of {', '.join(NAMES)}.")
  return found
