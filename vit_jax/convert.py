r"""Writes an official-layout `.npz` from any weights source.

    python -m vit_jax.convert SOURCE --out=FILE.npz [--scanned] [--model=NAME] [--overwrite]

SOURCE: anything `vit_jax.weights.sources` reads: an official `.npz`, a training run, a
Hugging Face or timm checkpoint (folder or `.safetensors`), ``hf-hub:<org>/<name>[@rev]``
or an official name (``ViT-B_16``, an AugReg file stem), fetched through the Hugging Face
cache. The file has the official keys and shapes (docs/checkpoint_format.md), per-layer
as the official files (which the official code and timm's npz loader read), or with
--scanned the stacked `Transformer/encoderblock` layout of big_vision. An `.npz` holds no
GELU choice: code reading it runs the tanh GELU, as the official weights were trained.
An existing FILE is refused (nothing is overwritten) unless --overwrite is given; a
folder is always refused. The file appears atomically when the source has been read.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Sequence

from absl import flags, logging

from vit_jax import cli, models
from vit_jax.infra import errors
from vit_jax.weights import npz, sources


def convert(
  source: str,
  out: str,
  *,
  scanned: bool = False,
  model_name: str | None = None,
  overwrite: bool = False,
) -> None:
  """Reads ``source`` and writes its parameters to the official-layout `.npz` ``out``
  (an existing file only with ``overwrite``)."""
  check_out(out, overwrite)
  model = sources.load(source, model_name)
  npz.save_npz(
    out,
    model.params,
    scanned=scanned,
    config=models.to_config(model.config),
    data_config=model.data_config.to_dict(),
  )
  gelu = "tanh" if model.config.get("gelu_approximate", True) else "exact (erf)"
  logging.info(
    "Wrote %s (%s, %s classes) from %s; its source computes the %s GELU.",
    out,
    model.config.name,
    model.num_classes or "no head,",
    source,
    gelu,
  )


def check_out(out: str, overwrite: bool) -> None:
  """``out`` may be written: a new path, or an existing file with ``overwrite``."""
  if not out:
    raise errors.CommandLineError("--out= is empty: name the .npz file to write.")
  if os.path.isdir(out):
    raise errors.OutputExistsError(
      f"--out={out!r} is a folder: name a file to write, e.g. {os.path.join(out, 'model.npz')!r}."
    )
  for path in (out, npz.config_path(out)):  # the archive and its model config beside it
    if os.path.lexists(path) and not overwrite:
      raise errors.OutputExistsError(
        f"--out={out!r}: {path!r} exists: choose a new path (nothing is overwritten), or pass "
        "--overwrite to replace it."
      )


def _parse(argv: Sequence[str]) -> dict[str, Any]:
  """The flag values and the source named; a `CommandLineError` for a bad command line."""
  flag_values = cli.new_flag_values()
  holders = dict(
    **cli.define_model_flags(flag_values, ("model",)),
    out=flags.DEFINE_string("out", None, "The .npz file to write.", flag_values=flag_values),
    scanned=flags.DEFINE_bool(
      "scanned",
      False,
      "Stack the encoder blocks (Transformer/encoderblock [L, ...], big_vision).",
      flag_values=flag_values,
    ),
    overwrite=flags.DEFINE_bool(
      "overwrite", False, "Replace --out when it is an existing file.", flag_values=flag_values
    ),
  )
  values = cli.parse_command_flags(
    flag_values, argv, holders, ("out",), __doc__, positional="sources"
  )
  if len(values["sources"]) != 1:
    raise errors.CommandLineError(
      f"Name one source (got {values['sources']}): python -m vit_jax.convert SOURCE --out=FILE.npz"
    )
  return values


def main(argv: Sequence[str]) -> int:
  """The command, callable in-process (`vit_jax.cli`): parses ``argv`` (argv[0]: the
  program), converts; the exit status."""
  return cli.run_command(
    argv,
    _parse,
    lambda values: convert(
      values["sources"][0],
      values["out"],
      scanned=values["scanned"],
      model_name=values["model"],
      overwrite=values["overwrite"],
    ),
    context=lambda values: (os.path.abspath(values["out"]), None),
  )


if __name__ == "__main__":
  cli.exit_with(main(sys.argv))
