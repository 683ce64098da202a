"""Every weights source and every fit of stored weights to a model, in one package.

Reading: `sources.load` (any source -> a `LoadedModel`: config, parameters, classes, image
size) and `sources.read_params` (the stored tree, for fine-tuning). The sources: official
`.npz` files (`npz.py`; LiT's image-text layout, `lit_npz.py`), a training run's Orbax
steps (`orbax_steps.py`), Hugging Face (`hf.py`; SigLIP, SigLIP 2 and CLIP two-tower
folders, `hf_two_tower.py`, written back by `hf_two_tower_write.py`) and timm
(the `timm/` package: one record per family, `timm/families.py`) folders or
`.safetensors`, and ``hf-hub:`` or
official names fetched through the hub cache (`hub.py`). The architecture of a tree is
read from its shapes in one place (`architecture.py`). Fitting: `load_pretrained`
(`fit.py`) adapts a stored tree to a new model (head, representation layer, class token,
position embeddings). Writing: `writers.save` (a loaded model -> a folder in one of
`writers.FORMATS`, all or nothing) through `.npz`, Hugging Face, timm, SavedModel and
StableHLO (`npz.py`, `hf.py`, `timm/folder.py`, `serving.py`). `fit_params` fits a tree in
memory as `load_pretrained` fits a stored one (a new head, another resolution).

Nothing here imports torch (the PyTorch side is only needed to load what is written), and
nothing imports `vit_jax.run`: the run asks `load_pretrained` for its initial parameters.
"""

from vit_jax.weights.fit import fit_params, load_pretrained
from vit_jax.weights.sources import LoadedModel, check_source, load, read_params
from vit_jax.weights.writers import FORMATS, save

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
