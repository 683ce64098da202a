r"""Writes a trained model in another framework's or a serving format.

    python -m vit_jax.export --checkpoint=PATH --format=FMT --out=DIR [--model=NAME]
        [--labels=imagenet2012|FILE] [--resolution=R]

PATH: anything `vit_jax.predict` reads (official `.npz`, a training run, a Hugging Face
ViT directory). FMT:
  hf           `ViTForImageClassification` directory (config.json with id2label,
               model.safetensors, preprocessor_config.json): `from_pretrained(DIR)`.
  timm         model.safetensors with timm's names + timm_model.json (create_model args).
  saved_model  TensorFlow SavedModel through jax2tf, batch dimension polymorphic.
  stablehlo    `jax.export` artifact model.jax_exported (parameters inside).
  npz          official-layout model.npz: e.g. a Hugging Face checkpoint in, then usable
               as `config.pretrained` for fine-tuning.
Every format but hf also gets labels.txt (one class name per line). The files are
written into a new folder beside DIR that is renamed to DIR at the end: a failure leaves
nothing in DIR. DIR must not exist or be empty. No torch is needed (safetensors' numpy API).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Callable, Optional, Sequence

import jax.numpy as jnp
from absl import app, flags, logging

from vit_jax import checkpoint
from vit_jax.interop import hf as hf_lib
from vit_jax.interop import loader, serving
from vit_jax.interop import timm as timm_lib

FORMATS = ("hf", "timm", "saved_model", "stablehlo", "npz")
LABELS_FILE = "labels.txt"
NPZ_FILE = "model.npz"


def _writer(
  model: loader.LoadedModel, fmt: str, labels: Optional[str], resolution: Optional[int]
) -> Callable[[str], None]:
  """Checks that ``model`` can be written as ``fmt``; returns what writes it into a folder."""
  module = model.module(dtype=jnp.float32)
  params = model.params
  names = loader.class_names(labels, model)
  size = loader.image_size(model, resolution)
  if fmt == "hf":
    files = hf_lib.to_hf(
      params,
      model.config,
      gelu_approximate=module.gelu_approximate,
      image_size=size,
      class_names=names,
    )
    return lambda d: hf_lib.write_dir(d, *files)
  if fmt == "timm":
    spec = timm_lib.model_spec(
      model.config,
      num_classes=model.num_classes,
      gelu_approximate=module.gelu_approximate,
      image_size=size,
    )
    tensors = timm_lib.to_timm(params, model.config)
    write = lambda d: timm_lib.write_dir(d, tensors, spec)
  elif fmt == "saved_model":
    write = lambda d: serving.write_saved_model(d, module, params, size)
  elif fmt == "stablehlo":
    write = lambda d: serving.write_jax_exported(d, module, params, size)
  elif fmt == "npz":
    write = lambda d: checkpoint.save_npz(os.path.join(d, NPZ_FILE), params)
  else:
    raise ValueError(f"Unknown --format={fmt!r}; choose one of {', '.join(FORMATS)}.")

  def write_with_labels(directory: str) -> None:
    write(directory)
    if names:
      with open(os.path.join(directory, LABELS_FILE), "w") as f:
        f.write("\n".join(names) + "\n")

  return write_with_labels


def export(
  checkpoint_path: str,
  fmt: str,
  out: str,
  *,
  model_name: Optional[str] = None,
  labels: Optional[str] = None,
  resolution: Optional[int] = None,
) -> None:
  """Writes the model at ``checkpoint_path`` as ``fmt`` into the new folder ``out``."""
  _check_out(out)
  export_model(
    loader.load(checkpoint_path, model_name), fmt, out, labels=labels, resolution=resolution
  )


def _check_out(out: str) -> None:
  if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
    raise FileExistsError(
      f"--out={out!r} exists and is not an empty folder: choose a new "
      "path (nothing is overwritten)."
    )


def export_model(
  model: loader.LoadedModel,
  fmt: str,
  out: str,
  *,
  labels: Optional[str] = None,
  resolution: Optional[int] = None,
) -> None:
  """Writes a loaded model as ``fmt`` into the new folder ``out``."""
  out = os.path.abspath(out)
  _check_out(out)
  write = _writer(model, fmt, labels, resolution)
  parent = os.path.dirname(out)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
  try:
    write(tmp)
    if os.path.isdir(out):
      os.rmdir(out)  # empty, checked above
    os.replace(tmp, out)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  logging.info("Wrote %s export of %s to %s.", fmt, model.source, out)


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """The command's flags (defined only when run as a command: `vit_jax.predict` has some
  of the same names)."""
  flags.DEFINE_string(
    "checkpoint",
    None,
    "An official-layout .npz, a training run or a Hugging Face ViT directory.",
    flag_values=values,
  )
  flags.DEFINE_enum("format", None, FORMATS, "What to write.", flag_values=values)
  flags.DEFINE_string("out", None, "A new (or empty) folder for the files.", flag_values=values)
  flags.DEFINE_string(
    "model",
    None,
    "An official variant name for an .npz; default: inferred from the array shapes.",
    flag_values=values,
  )
  flags.DEFINE_string(
    "labels",
    None,
    "'imagenet2012' or a file of class names; default as in vit_jax.predict.",
    flag_values=values,
  )
  flags.DEFINE_integer(
    "resolution",
    None,
    "Input size, for models without learned position embeddings.",
    flag_values=values,
  )
  flags.mark_flags_as_required(["checkpoint", "format", "out"], flag_values=values)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  values = flags.FLAGS
  export(
    values.checkpoint,
    values.format,
    values.out,
    model_name=values.model,
    labels=values.labels,
    resolution=values.resolution,
  )


if __name__ == "__main__":
  define_flags()
  app.run(main)
