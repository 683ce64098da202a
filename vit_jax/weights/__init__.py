"""Every weights source and every fit of stored weights to a model, in one package.

Reading: `sources.load` (any source -> a `LoadedModel`: config, parameters, classes, image
size) and `sources.read_params` (the stored tree, for fine-tuning), through the record of
the source's checkpoint format, found once (`formats.py`). The formats: official `.npz`
files (`npz.py`; LiT's image-text layout, `lit_npz.py`), a training run's folder
(`run_checkpoint.py`, its Orbax steps `orbax_steps.py`), transformers folders (`hf/`:
`hf/vit.py` the ViT, `hf/two_tower.py` SigLIP, SigLIP 2 and CLIP, each read and written in
one module) and timm folders or `.safetensors` (the `timm/` package: one record per
family, `timm/families.py`); ``hf-hub:`` and official names are fetched through the hub
cache first (`hub.py`). The architecture of a tree is read from its shapes in one place
(`architecture.py`). Fitting: `load_pretrained` (`fit.py`) adapts a stored tree to a new
model (head, representation layer, class token, position embeddings). Writing:
`writers.save` (a loaded model -> a folder in one of `exports.NAMES`, all or nothing)
through the hf, timm and npz formats' records (`formats.py`) and SavedModel and StableHLO
(`serving.py`). `fit_params` fits a tree in memory as `load_pretrained` fits a stored one
(a new head, another resolution).

Nothing here imports torch (the PyTorch side is only needed to load what is written), and
nothing imports `vit_jax.run`: the run asks `load_pretrained` for its initial parameters.
"""

from vit_jax.weights.exports import NAMES as FORMATS  # the export formats' names
from vit_jax.weights.fit import fit_params, load_pretrained
from vit_jax.weights.sources import LoadedModel, check_source, load, read_params
from vit_jax.weights.writers import save

__all__ = [
  "FORMATS",
  "LoadedModel",
  "check_source",
  "fit_params",
  "load",
  "load_pretrained",
  "read_params",
  "save",
]
