"""The entry of every command: its flags, quiet logging, and one line for a user error.

Every command (`main`, `predict`, `export`, `convert`, `fewshot`, `plan`) is written one
way: its own `flags.FlagValues` from `new_flag_values`, the shared flags of the commands
that read a model from `define_model_flags`, one `parse_command_flags` call, and
`run_command` as the whole command, callable in-process:

    def _parse(argv):
      flag_values = cli.new_flag_values()
      holders = dict(**cli.define_model_flags(flag_values), out=flags.DEFINE_string(...))
      return cli.parse_command_flags(flag_values, argv, holders, ("checkpoint",), __doc__)

    def main(argv: Sequence[str]) -> int:  # the exit status
      return cli.run_command(argv, _parse, lambda values: ...)

    if __name__ == "__main__":
      cli.exit_with(main(sys.argv))

`run_command` starts quietly (`platforms.quiet_start`) before anything loads TensorFlow or
starts a JAX backend: TensorFlow's C++ log level (read when TensorFlow loads), and JAX kept
off a TPU or GPU backend that is installed but has no chip. No command module imports
TensorFlow at its import. What a terminal shows:

* the command's own log lines (progress, results) and every warning and error, as plain
  text (`PlainFormatter`: the message, "Warning: " before a warning); with
  ``--verbosity`` given, in absl's format (level, time, thread, file:line) instead;
* not: the libraries' INFO lines (JAX probing for a TPU, Orbax's per-save and per-read
  lines, tfds' reads), nor TensorFlow's and XLA's C++ INFO and WARNING lines (its start-up
  notices, `Local rendezvous is aborting` at exit, `jpeg::Uncompress failed` beside a file
  the command reports itself). ``--verbosity=0`` (or higher) shows the libraries' INFO lines
  too, and ``TF_CPP_MIN_LOG_LEVEL=0`` the C++ ones;
* a user error (`vit_jax.infra.errors.UserError`, and what `errors.as_user_error` maps: a full
  disk, too little device memory, a folder that cannot be written) as one line
  ``Error: <message>`` with exit status `USER_ERROR_STATUS`; its traceback is logged at
  ``--verbosity=1``.
"""

from __future__ import annotations

import difflib
import json
import logging as std_logging  # noqa: TID251 (filters the std records absl forwards)
import os
import sys
from typing import Any, Callable, Optional, Sequence, TypeVar

import ml_collections
from absl import flags, logging
from ml_collections import config_flags

from vit_jax.infra import errors, input_files, platforms

# The flags defined here for a command are the command's own: its --help lists them beside
# its other flags, not under this module.
flags.disclaim_key_flags()

USER_ERROR_STATUS = 2
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
HELP_FLAGS = ("-h", "--help", "--helpfull")
# Library warnings that report nothing wrong: tfds' for a dataset not built yet (which it
# then builds, or the command reports).
_HARMLESS_WARNINGS = ("Variant folder %s has no %s",)

Parsed = TypeVar("Parsed")


class HelpRequested(Exception):
  """--help on the command line: the text to print instead of running."""


def _config_keys(config: Any, prefix: str = "") -> list[str]:
  """Every field path of a config, e.g. ["lr", "lr.base", ...]."""
  keys = []
  for key, value in config.items():
    keys.append(prefix + key)
    if isinstance(value, ml_collections.ConfigDict):
      keys.extend(_config_keys(value, f"{prefix}{key}."))
  return keys


def _unknown_key_message(argv: Sequence[str]) -> Optional[str]:
  """The message for the first `--config.<key>` of ``argv`` the config has no field for."""
  config_args = [a for a in argv if a.startswith("--config=")]
  overrides = [a[len("--config.") :].split("=")[0] for a in argv if a.startswith("--config.")]
  flag_values = flags.FlagValues()
  base = config_flags.DEFINE_config_file(
    "config", None, "", flag_values=flag_values, sys_argv=[argv[0], *config_args]
  )
  flag_values([argv[0], *config_args])
  valid = _config_keys(base.value)
  for key in overrides:
    if key not in valid:
      close = closest_keys(key, valid)
      hint = (
        f"closest valid keys: {', '.join(close)}"
        if close
        else f"valid top-level keys: {', '.join(k for k in valid if '.' not in k)}"
      )
      return f"Unknown config key {key!r} (--config.{key}); {hint}."
  return None


_MOST_LETTERS = 0.75  # difflib's similarity a key without a shared section needs


def closest_keys(typed: str, valid: Sequence[str]) -> list[str]:
  """Up to three valid keys like ``typed``: in its section (``lr.bse`` -> ``lr.base``) or,
  elsewhere, sharing most of its letters (``sed`` -> ``seed``); never one that shares
  nothing with it (``pp.randaug`` does not suggest ``pretrained``)."""
  section = typed.rpartition(".")[0]

  def resembles(key: str) -> bool:
    if section and key.rpartition(".")[0] == section:
      return True
    return difflib.SequenceMatcher(None, typed, key).ratio() >= _MOST_LETTERS

  return [k for k in difflib.get_close_matches(typed, valid, n=10, cutoff=0.5) if resembles(k)][:3]


def last_line(message: str) -> str:
  """The error itself: config_flags puts the config file's traceback before it."""
  lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
  return lines[-1] if "Traceback (most recent call last)" in message else " ".join(lines)


def new_flag_values() -> flags.FlagValues:
  """A command's own flags, holding absl's logging flags (--verbosity, ...) to begin with.

  The logging flags are absl's own flag objects, shared with `flags.FLAGS`: parsing them
  here sets what absl's logging reads."""
  flag_values = flags.FlagValues()
  for flag in flags.FLAGS.flags_by_module_dict().get(logging.__name__, []):
    flags.DEFINE_flag(flag, flag_values, module_name=logging.__name__)
  return flag_values


def define_config_flags(flag_values: flags.FlagValues, argv: Sequence[str], help_text: str) -> Any:
  """Defines ``--config`` (a config file, its fields as ``--config.<key>``) on
  ``flag_values``; returns its holder."""
  check_config_file(argv)
  return config_flags.DEFINE_config_file(
    "config", None, help_text, flag_values=flag_values, lock_config=True, sys_argv=list(argv)
  )


def _check_config_file(argv: Sequence[str]) -> None:
  """A ``--config=<file>[:<arg>]`` whose file is not there: one line saying where it was
  looked for (a relative path is read from the current directory)."""
  for arg in argv:
    if not arg.startswith("--config="):
      continue
    path = arg[len("--config=") :].split(":", 1)[0]
    if path and not os.path.isfile(path):
      fix = (
        "give an existing config file"
        if os.path.isabs(path)
        else "run the command from the repository root (where configs/ is), or give the "
        "config file's absolute path"
      )
      raise errors.CommandLineError(
        f"--config={path}: no such file (looked for {os.path.abspath(path)}): {fix}."
      )


def parse_config_flags(flag_values: flags.FlagValues, argv: Sequence[str]) -> list[str]:
  """Parses ``argv`` onto flags that include a `config_flags` config (``--config`` and its
  ``--config.<key>=value`` overrides); the arguments left. A bad command line is a
  `CommandLineError`: a config file that is not there says where it was looked for, an
  unknown key lists the closest valid keys, a config file that fails to load gives its
  error's own line."""
  _check_config_file(argv)
  try:
    return flag_values(list(argv))
  except (AttributeError, KeyError):  # ml_collections' error for an unknown --config.<key>
    message = _unknown_key_message(argv)
    if message is None:
      raise
    raise errors.CommandLineError(message) from None
  except (flags.Error, OSError, errors.UserError) as e:  # a bad value, a missing config file
    raise errors.CommandLineError(last_line(str(e))) from e
  except Exception as e:  # pylint: disable=broad-except  (the config file raised, or is no Python)
    raise errors.CommandLineError(
      f"The config file {config_file_arg(argv)!r} cannot be loaded "
      f"({type(e).__name__}: {last_line(str(e))}): fix it."
    ) from e


def config_file_arg(argv: Sequence[str]) -> Optional[str]:
  """The file of ``--config=FILE[:ARG]`` (or ``--config FILE``) in ``argv``; None if absent."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      value = arg[len("--config=") :]
    elif arg == "--config" and i + 1 < len(argv):
      value = argv[i + 1]
    else:
      continue
    return value.split(":", 1)[0]
  return None


def check_config_file(argv: Sequence[str]) -> None:
  """A config file that exists must be a regular file within `input_files.MAX_TEXT_BYTES`
  before it is loaded (a FIFO or /dev/zero would hang or fill memory); one that does not
  exist is left to the config loader's own error."""
  path = config_file_arg(argv)
  if path and os.path.lexists(path):
    input_files.regular_file(
      path, input_files.MAX_TEXT_BYTES, what="config file", error=errors.CommandLineError
    )


def parse_command_flags(
  flag_values: flags.FlagValues,
  argv: Sequence[str],
  holders: dict[str, Any],
  required: Sequence[str],
  help_intro: str = "",
  *,
  positional: Optional[str] = None,
) -> dict[str, Any]:
  """The values of ``holders`` (flags defined on ``flag_values``, ``--config`` among them)
  parsed from ``argv`` (argv[0]: the program), by name.

  positional: the name under which the positional arguments (a list, possibly empty) are
    returned, for a command that takes some; None: a positional argument is an error.
  --help is a `HelpRequested` (``help_intro`` above the flags' help); an unexpected
  positional argument or a missing ``required`` flag is a `CommandLineError`.
  """
  if any(arg in HELP_FLAGS for arg in argv[1:]):
    raise HelpRequested("\n\n".join(filter(None, (help_intro.strip(), flag_values.get_help()))))
  rest = parse_config_flags(flag_values, argv)[1:]
  if rest and positional is None:
    raise errors.CommandLineError(f"Unexpected arguments: {rest} (flags are --name=value).")
  for name in required:
    if holders[name].value is None:
      raise errors.CommandLineError(f"--{name} is required.")
  values = {name: holder.value for name, holder in holders.items()}
  if positional is not None:
    values[positional] = rest
  return values


# The flags of the commands that read a model (predict, export, fewshot, convert): one
# definition each, and what their values mean.


_MODEL_FLAG_HELP = {
  "checkpoint": "An official-layout .npz, a training run (its workdir, checkpoints/ or a step "
  "folder), a Hugging Face or timm checkpoint, hf-hub:<org>/<name> or an official name "
  "(ViT-B_16).",
  "model": "The official variant name (e.g. ViT-B_16) of an .npz; default: inferred from the "
  "array shapes (a run's model comes from its config.json).",
  "labels": "'imagenet2012' (the names shipped with the package) or a file of class names, "
  "one per line; default: the source's own names (a run's: its dataset's), ImageNet-1k's "
  "for a 1000-class head, else class indices.",
  "resolution": "Square input size; default: what the position embeddings were trained "
  "for (needed for a model without learned ones).",
}
MODEL_FLAGS = tuple(_MODEL_FLAG_HELP)


def define_model_flags(
  flag_values: flags.FlagValues, names: Sequence[str] = MODEL_FLAGS
) -> dict[str, Any]:
  """Defines the shared flags ``names`` (of `MODEL_FLAGS`) on ``flag_values``; their
  holders by name. Their values mean what `LoadedModel.class_names_for` and
  `image_size_for` read."""
  holders = {}
  for name in names:
    define = flags.DEFINE_integer if name == "resolution" else flags.DEFINE_string
    holders[name] = define(name, None, _MODEL_FLAG_HELP[name], flag_values=flag_values)
  return holders


def _no_context(_: Any) -> tuple[Optional[str], Any]:
  return None, None


def run_command(
  argv: Sequence[str],
  parse: Callable[[Sequence[str]], Parsed],
  command: Callable[[Parsed], Optional[int]],
  *,
  context: Callable[[Parsed], tuple[Optional[str], Any]] = _no_context,
) -> int:
  """Runs ``command(parse(argv))`` with the command's logging; the exit status.

  parse: raises a `UserError` (e.g. `CommandLineError`) for a bad command line, or
    `HelpRequested`; parses absl's logging flags (`new_flag_values`) with the command's.
  context: (the folder the command writes to, its config) for ``parse``'s result: what
    the errors of a full disk, an unusable folder and too little device memory name.
  """
  try:
    # First: parsing may load a config file, and nothing may start a backend or load
    # TensorFlow before this.
    platforms.quiet_start()  # TensorFlow's log level; libtpu installed, no TPU: the CPU
    platforms.default_gpu_memory_fraction()
    parsed = parse(argv)
  except HelpRequested as e:
    print(e)
    return 0
  except errors.UserError as e:
    return _report(e)
  flags.FLAGS.mark_as_parsed()  # absl's logging flags were parsed with the command's
  verbose = flags.FLAGS["verbosity"].present
  if not verbose:
    logging.set_verbosity(logging.INFO)  # the command's progress lines and results
  logging.use_absl_handler()
  handler = logging.get_absl_handler()
  quiet = _quiet_filter(show_library_info=verbose)
  handler.addFilter(quiet)
  absl_formatter = handler.python_handler.formatter
  if not verbose:
    handler.setFormatter(PlainFormatter())
  try:
    return command(parsed) or 0
  except Exception as e:  # pylint: disable=broad-except
    workdir, config = context(parsed)
    user_error = errors.as_user_error(e, workdir=workdir, config=config)
    if user_error is None:
      raise
    logging.debug("The error's traceback:", exc_info=e)
    return _report(user_error)
  finally:
    handler.removeFilter(quiet)
    handler.setFormatter(absl_formatter)


class PlainFormatter(std_logging.Formatter):
  """A log line as a user reads it: the message alone, a warning or error marked as one,
  without absl's prefix (level letter, date, time, thread id, file:line), which
  ``--verbosity`` brings back."""

  _MARKS = {std_logging.WARNING: "Warning: ", std_logging.ERROR: "ERROR: "}

  def __init__(self):
    super().__init__("%(message)s")

  def format(self, record: std_logging.LogRecord) -> str:
    mark = self._MARKS.get(min(record.levelno, std_logging.ERROR), "")
    return mark + super().format(record)


def write_table(workdir: str, stem: str, table: str, data: Any) -> None:
  """A command's result table, printed and written as ``<workdir>/<stem>.md``, with
  ``data`` beside it as ``<stem>.json`` (what other commands and scripts read)."""
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, f"{stem}.md"), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(workdir, f"{stem}.json"), "w") as f:
    json.dump(data, f, indent=1)
  print(table)


def exit_with(status: int) -> None:
  """Exits with ``status`` (a command's `__main__` entry); at once after a failure."""
  sys.stdout.flush()
  if status:
    # Threads still running (input pipeline, checkpoint writers) would print their own
    # errors at interpreter shutdown, after and around the message.
    os._exit(status)  # pylint: disable=protected-access
  sys.exit(0)


def _report(error: errors.UserError) -> int:
  logging.flush()
  sys.stderr.write(f"Error: {error}\n")
  sys.stderr.flush()
  return USER_ERROR_STATUS


def _quiet_filter(show_library_info: bool) -> Callable[[std_logging.LogRecord], bool]:
  """What the terminal shows of a log record (see the module doc). Orbax's background
  threads' tracebacks of a full disk never show: the command ends with one OutOfDiskError."""

  def keep(record: std_logging.LogRecord) -> bool:
    if record.pathname.startswith(_PACKAGE_DIR):
      return True
    failure = record.exc_info[1] if record.exc_info else None
    if errors.says_out_of_disk(record.getMessage()) or (
      failure is not None and errors.is_out_of_disk(failure)
    ):
      return False
    if record.msg in _HARMLESS_WARNINGS:
      return show_library_info
    return show_library_info or record.levelno >= std_logging.WARNING

  return keep
