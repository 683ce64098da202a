"""Input files are stat-checked before they are opened: regular files within a bound."""

import os
import re

import pytest

from vit_jax.infra import errors, input_files


def test_a_regular_file_within_its_bound_is_read(tmp_path):
  path = tmp_path / "labels.txt"
  path.write_text("a\nb\n")
  assert input_files.regular_file(str(path), 4) == 4
  assert input_files.read_text(str(path), what="labels") == "a\nb\n"
  assert input_files.not_regular(str(path)) is None


@pytest.mark.parametrize(
  "make, kind",
  [
    (lambda p: os.mkfifo(p), "a FIFO (named pipe)"),
    (lambda p: os.symlink("/dev/zero", p), "a character device"),
    (lambda p: os.mkdir(p), "a folder"),
  ],
)
def test_fifos_devices_and_folders_are_refused_unopened(make, kind, tmp_path):
  path = str(tmp_path / "input")
  make(path)
  assert input_files.not_regular(path) == kind
  with pytest.raises(errors.InputFileError, match=re.escape(f"is {kind}, not a regular file")):
    input_files.read_text(path, what="labels")


def test_size_bound_and_encoding_are_one_error_naming_the_file(tmp_path):
  big = tmp_path / "big.txt"
  with open(big, "wb") as f:
    f.truncate(input_files.MAX_TEXT_BYTES + 1)  # sparse: nothing is written or read
  with pytest.raises(errors.InputFileError, match="big.txt' has 16,777,217 bytes, more than"):
    input_files.read_text(str(big), what="labels")
  latin = tmp_path / "latin.txt"
  latin.write_bytes(b"caf\xe9\n")
  with pytest.raises(errors.InputFileError, match="latin.txt' is not UTF-8 text"):
    input_files.read_text(str(latin), what="labels")
  with pytest.raises(errors.CommandLineError, match="cannot be read"):
    input_files.regular_file(str(tmp_path / "nope"), None, error=errors.CommandLineError)
