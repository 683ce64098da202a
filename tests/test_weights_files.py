"""Hostile and broken weights folders: each is one `CheckpointError` line, nothing hangs,
nothing outside the folder is opened (`vit_jax.weights.files`)."""

from __future__ import annotations

import json
import os
import shlex
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from vit_jax.infra import errors
from vit_jax.weights import files, hub, sources

_HF_CONFIG = {
  "model_type": "vit",
  "hidden_size": 8,
  "num_hidden_layers": 1,
  "num_attention_heads": 2,
  "intermediate_size": 16,
  "hidden_act": "gelu",
  "layer_norm_eps": 1e-6,
  "image_size": 16,
  "patch_size": 8,
}


def _hf_dir(path, config=None, index=None):
  path.mkdir(exist_ok=True)
  (path / "config.json").write_text(json.dumps(_HF_CONFIG if config is None else config))
  if index is not None:
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
  return path


@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/hostname", "sub/../../x"])
def test_an_index_cannot_name_a_file_outside_its_folder(tmp_path, name):
  save_file({"a": np.zeros(2, np.float32)}, str(tmp_path / "outside.safetensors"))
  folder = _hf_dir(tmp_path / "hf", index={"a": name})
  with pytest.raises(errors.CheckpointError, match="outside|not a file inside"):
    sources.load(str(folder))


def test_a_link_out_of_the_folder_is_refused(tmp_path):
  save_file({"a": np.zeros(2, np.float32)}, str(tmp_path / "secret.safetensors"))
  folder = _hf_dir(tmp_path / "hf", index={"a": "shard.safetensors"})
  os.symlink(tmp_path / "secret.safetensors", folder / "shard.safetensors")
  with pytest.raises(errors.CheckpointError, match="outside"):
    sources.load(str(folder))


def _write_header(path, header, data=b""):
  text = json.dumps(header).encode()
  path.write_bytes(struct.pack("<Q", len(text)) + text + data)


@pytest.mark.parametrize(
  "header, data, message",
  [
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, "outside the file"),
    ({"a": {"dtype": "F32", "shape": [4]}}, b"\0" * 16, "outside the file"),
    ({"a": {"dtype": "I8", "shape": [4], "data_offsets": [0, 4]}}, b"\0" * 4, "not floating"),
    ([1, 2], b"", "not an object"),
  ],
)
def test_a_lying_or_integer_safetensors_header_is_one_error(tmp_path, header, data, message):
  path = tmp_path / "model.safetensors"
  _write_header(path, header, data)
  with pytest.raises(errors.CheckpointError, match=message):
    files.read_safetensors(str(path))


def test_truncated_safetensors_and_huge_header_claims(tmp_path):
  path = tmp_path / "model.safetensors"
  path.write_bytes(b"\x01\x02")
  with pytest.raises(errors.CheckpointError, match="truncated"):
    files.read_safetensors(str(path))
  path.write_bytes(struct.pack("<Q", 2**62) + b"{}")
  with pytest.raises(errors.CheckpointError, match="header claims"):
    files.read_safetensors(str(path))


def test_integer_weights_in_a_timm_file_are_refused_not_cast(tmp_path):
  save_file(
    {"patch_embed.proj.weight": np.ones((8, 3, 8, 8), np.int8)}, str(tmp_path / "w.safetensors")
  )
  with pytest.raises(errors.CheckpointError, match="I8, not floating point"):
    sources.load(str(tmp_path / "w.safetensors"))


def test_a_fifo_is_refused_without_opening_it(tmp_path):
  os.mkfifo(tmp_path / "model.safetensors")
  with pytest.raises(errors.CheckpointError, match="not a regular file"):
    files.read_safetensors(str(tmp_path / "model.safetensors"))
  folder = tmp_path / "hf"
  folder.mkdir()
  os.mkfifo(folder / "config.json")
  with pytest.raises(errors.CheckpointError, match="not a regular file"):
    files.read_json(str(folder / "config.json"))


@pytest.mark.parametrize(
  "text, message",
  [("{not json", "not valid JSON"), ("[1]", "not an object"), (b"\xff\xfe", "not valid JSON")],
)
def test_broken_configs_are_one_error(tmp_path, text, message):
  path = tmp_path / "config.json"
  path.write_bytes(text if isinstance(text, bytes) else text.encode())
  with pytest.raises(errors.CheckpointError, match=message):
    files.read_json(str(path))


def test_wrong_typed_hf_config_fields_are_one_error(tmp_path):
  save_file({"a": np.zeros(2, np.float32)}, str(tmp_path / "model.safetensors"))
  folder = _hf_dir(tmp_path, config={**_HF_CONFIG, "num_hidden_layers": "12"})
  with pytest.raises(errors.CheckpointError, match="num_hidden_layers is '12', not an int"):
    sources.load(str(folder))


def test_a_large_json_file_is_refused_by_its_size(tmp_path, monkeypatch):
  monkeypatch.setattr(files, "MAX_JSON_BYTES", 10)
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit", "x": "y" * 20}))
  with pytest.raises(errors.CheckpointError, match="bytes, more than the 10"):
    files.read_json(str(tmp_path / "config.json"))


@pytest.mark.parametrize("source", ["hf-hub:../etc", "hf-hub:a/b/c", "hf-hub:org/na me"])
def test_invalid_hub_names_are_refused_before_the_hub_is_asked(source, monkeypatch):
  monkeypatch.setattr(hub, "download", lambda *a: pytest.fail("the hub was asked"))
  with pytest.raises(errors.CommandLineError, match="not a hub repository name"):
    hub.resolve(source)
  with pytest.raises(errors.CommandLineError, match="not a revision"):
    hub.resolve("hf-hub:org/name@main;touch X")


def test_advice_quotes_what_it_interpolates(tmp_path):
  command = hub._download_command("org/name", "v1 $(touch X)")  # pylint: disable=protected-access
  assert shlex.split(command)[:5] == ["hf", "download", "org/name", "--revision", "v1 $(touch X)"]
  pickle = tmp_path / "w$(touch X).bin"
  pickle.write_bytes(b"not read")
  with pytest.raises(errors.CheckpointError) as info:
    sources.load(str(pickle))
  shell = str(info.value).split("e.g. ", 1)[1].rstrip(".")
  code = shlex.split(shell)[2]  # python -c CODE: one argument, nothing for the shell to run
  assert repr(str(pickle)) in code
