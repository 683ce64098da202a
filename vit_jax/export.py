r"""Writes a trained model in another framework's or a serving format.

    python -m vit_jax.export --checkpoint=PATH --format=FMT --out=DIR [--model=NAME]
        [--labels=imagenet2012|FILE] [--resolution=R]

PATH: anything `vit_jax.predict` reads (official `.npz`, a training run, a Hugging Face
or timm checkpoint, `hf-hub:<org>/<name>`, an official name). FMT:
  hf           `ViTForImageClassification` directory (config.json with id2label,
               model.safetensors, preprocessor_config.json): `from_pretrained(DIR)`.
  timm         timm's own folder (model.safetensors, config.json with the pretrained_cfg
               of the real input size, crop and interpolation): create_model('local-dir:DIR');
               timm_model.json (create_model's name and arguments) beside it.
  saved_model  TensorFlow SavedModel through jax2tf, batch dimension polymorphic.
  stablehlo    `jax.export` artifact model.jax_exported (parameters inside).
  npz          official-layout model.npz: e.g. a Hugging Face checkpoint in, then usable
               as `config.pretrained` for fine-tuning.
Every format but hf also gets labels.txt (one class name per line). The files are
written into a new folder beside DIR (`.DIR.tmp-*`) that is renamed to DIR at the end: a
failure, Ctrl-C or SIGTERM leaves nothing in DIR and removes that folder; one left by a
killed export (older than an hour) is removed by the next export to the same DIR. DIR must
not exist or be empty. The files get the modes of any file the user writes (umask). On
success the command prints the files written and how to load them. No torch is needed
(safetensors' numpy API).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from types import ModuleType
from typing import Any, Callable, Iterator, Optional, Sequence

import jax.numpy as jnp
from absl import flags, logging

from vit_jax import cli, errors, models
from vit_jax.models import families
from vit_jax.weights import hf as hf_lib
from vit_jax.weights import npz, serving, sources, timm_bit, timm_eva, timm_mixer
from vit_jax.weights import timm as timm_lib

FORMATS = ("hf", "timm", "saved_model", "stablehlo", "npz")
LABELS_FILE = "labels.txt"
NPZ_FILE = "model.npz"
STALE_SECONDS = 3600  # a temporary folder this old was left by a killed export
# How to load each format from its folder (printed after the export).
LOAD_HINTS = {
  "hf": "transformers.ViTForImageClassification.from_pretrained({out!r}) "
  "(and AutoImageProcessor.from_pretrained({out!r}) for the preprocessing)",
  "timm": "timm.create_model('local-dir:{out}') (a shape timm has no name for: "
  "timm_model.json's kwargs, the architecture's class)",
  "saved_model": "tf.saved_model.load({out!r}).signatures['serving_default']"
  "(images=x)['output_0'], x: float32 [B, H, W, 3] in [-1, 1]",
  "stablehlo": "jax.export.deserialize(open({out!r} + '/model.jax_exported', 'rb').read())"
  ".call(x), x: float32 [B, H, W, 3] in [-1, 1]",
  "npz": "python -m vit_jax.predict --checkpoint={out}/model.npz, or "
  "--config.pretrained={out}/model.npz to fine-tune",
}


# The timm mapping of each family (`models.FAMILIES`).
_TIMM_WRITERS: dict[families.Family, ModuleType] = {
  families.VIT: timm_lib,
  families.MIXER: timm_mixer,
  families.BIT: timm_bit,
}


def _writer(
  model: sources.LoadedModel, fmt: str, labels: Optional[str], resolution: Optional[int]
) -> Callable[[str], None]:
  """Checks that ``model`` can be written as ``fmt``; returns what writes it into a folder."""
  module = model.module(dtype=jnp.float32)
  params = model.params
  names = cli.class_names(labels, model)
  size = cli.image_size(model, resolution)
  family = models.family_of(model.config)
  data_config = model.data_config.at_size(size)  # the preprocessing each format states
  if fmt == "hf" and family.hf_refusal:
    raise errors.CommandLineError(
      f"{family.hf_refusal}: export this model with --format=timm, npz, saved_model or stablehlo."
    )
  if fmt == "hf":
    files = hf_lib.to_hf(
      params,
      model.config,
      image_size=size,
      class_names=names,
      data_config=data_config,
    )
    return lambda d: hf_lib.write_dir(d, *files)
  if fmt == "timm":
    timm_writer = _TIMM_WRITERS[family]
    if family is families.VIT and timm_eva.is_eva(model.config):
      timm_writer = timm_eva  # RoPE, SwiGLU, q+v biases: timm's Eva (DINOv3, EVA-02)
    spec = timm_writer.model_spec(
      model.config,
      num_classes=model.num_classes,
      image_size=size,
    )
    tensors = timm_writer.to_timm(params, model.config)
    write = lambda d: timm_lib.write_dir(d, tensors, spec, data_config)
  elif fmt == "saved_model":
    write = lambda d: serving.write_saved_model(d, module, params, size)
  elif fmt == "stablehlo":
    write = lambda d: serving.write_jax_exported(d, module, params, size)
  elif fmt == "npz":
    write = lambda d: npz.save_npz(
      os.path.join(d, NPZ_FILE), params, config=model.config, data_config=data_config.to_dict()
    )
  else:
    raise errors.CommandLineError(f"Unknown --format={fmt!r}; choose one of {', '.join(FORMATS)}.")

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
) -> str:
  """Writes the model at ``checkpoint_path`` as ``fmt`` into the new folder ``out``;
  returns the summary (`export_model`)."""
  _check_out(out)
  return export_model(
    sources.load(checkpoint_path, model_name), fmt, out, labels=labels, resolution=resolution
  )


def _check_out(out: str) -> None:
  if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
    raise errors.OutputExistsError(
      f"--out={out!r} exists and is not an empty folder: choose a new "
      "path (nothing is overwritten)."
    )


def _remove_stale_temporaries(out: str) -> None:
  """Removes the temporary folders of exports to ``out`` killed over an hour ago: the
  entries of its folder whose names start with its prefix, compared as text (no glob:
  ``out`` may hold ``*``, ``?`` or ``[``)."""
  parent, prefix = os.path.dirname(out), _temporary_prefix(out)
  for name in os.listdir(parent):
    path = os.path.join(parent, name)
    if not name.startswith(prefix) or os.path.islink(path):
      continue
    if os.path.isdir(path) and time.time() - os.path.getmtime(path) > STALE_SECONDS:
      logging.warning("Removing %s, left by an export to %s that was killed.", path, out)
      shutil.rmtree(path, ignore_errors=True)


def _temporary_prefix(out: str) -> str:
  return f".{os.path.basename(out)}.tmp-"


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
  """SIGTERM raises SystemExit(143) inside the block (as Ctrl-C raises KeyboardInterrupt),
  so that its cleanup runs; the process then exits with the status the shell expects."""
  if threading.current_thread() is not threading.main_thread():
    yield  # only the main thread can handle signals
    return

  def raise_exit(signum, frame):  # pylint: disable=unused-argument
    raise SystemExit(128 + signum)

  previous = signal.signal(signal.SIGTERM, raise_exit)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


def _user_modes(directory: str) -> None:
  """Gives ``directory`` and everything in it the modes of a new folder and file under the
  user's umask (a temporary folder is 0700, and some writers make their files 0600)."""
  probe = os.path.join(directory, ".mode-probe")
  os.mkdir(probe, 0o777)  # the umask applies: no process-wide os.umask() call needed
  folder_mode = os.stat(probe).st_mode & 0o777
  os.rmdir(probe)
  os.chmod(directory, folder_mode)
  for root, folders, files in os.walk(directory):
    for name in folders:
      os.chmod(os.path.join(root, name), folder_mode)
    for name in files:
      os.chmod(os.path.join(root, name), folder_mode & 0o666)


def _summary(fmt: str, source: str, out: str) -> str:
  """What was written, and how to load it."""
  lines = [f"Wrote the {fmt} export of {source} to {out}:"]
  for root, _, files in sorted(os.walk(out)):
    for name in sorted(files):
      path = os.path.join(root, name)
      lines.append(f"  {os.path.relpath(path, out)}  ({os.path.getsize(path):,} bytes)")
  lines.append("Load it with: " + LOAD_HINTS[fmt].format(out=out))
  return "\n".join(lines)


def export_model(
  model: sources.LoadedModel,
  fmt: str,
  out: str,
  *,
  labels: Optional[str] = None,
  resolution: Optional[int] = None,
) -> str:
  """Writes a loaded model as ``fmt`` into the new folder ``out``; returns the summary
  (the files written, how to load them)."""
  out = os.path.abspath(out)
  _check_out(out)
  write = _writer(model, fmt, labels, resolution)
  parent = os.path.dirname(out)
  os.makedirs(parent, exist_ok=True)
  _remove_stale_temporaries(out)
  with _sigterm_raises():
    tmp = tempfile.mkdtemp(prefix=_temporary_prefix(out), dir=parent)
    try:
      write(tmp)
      _user_modes(tmp)
      if os.path.isdir(out):
        os.rmdir(out)  # empty, checked above
      os.replace(tmp, out)
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
  return _summary(fmt, model.source, out)


def _parse(argv: Sequence[str]) -> dict[str, Any]:
  """The flag values; a `CommandLineError` for a bad command line."""
  flag_values = cli.new_flag_values()
  holders = dict(
    **cli.define_model_flags(flag_values),
    format=flags.DEFINE_enum("format", None, FORMATS, "What to write.", flag_values=flag_values),
    out=flags.DEFINE_string(
      "out", None, "A new (or empty) folder for the files.", flag_values=flag_values
    ),
  )
  return cli.parse_command_flags(
    flag_values, argv, holders, ("checkpoint", "format", "out"), __doc__
  )


def _export(values: dict[str, Any]) -> None:
  """Exports for the parsed command line and prints the summary."""
  summary = export(
    values["checkpoint"],
    values["format"],
    values["out"],
    model_name=values["model"],
    labels=values["labels"],
    resolution=values["resolution"],
  )
  print(summary)


def main(argv: Sequence[str]) -> int:
  """The command, callable in-process (`vit_jax.cli`): parses ``argv`` (argv[0]: the
  program), exports; the exit status."""
  return cli.run_command(argv, _parse, _export, context=lambda values: (values["out"], None))


if __name__ == "__main__":
  cli.exit_with(main(sys.argv))
