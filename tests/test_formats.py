"""The checkpoint formats' registry (`vit_jax.weights.formats`): a source's format is found
once per `load` or `read_params` call, each record's ``detect`` tried at most once, and the
record found is the source's."""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from typing import Callable

import numpy as np
import pytest

import vit_jax
from tests.finished_run import finished_run  # noqa: F401  (a fixture)
from vit_jax.infra import errors
from vit_jax.weights import formats, sources


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, str]:
  """A random tiny ViT written as each format `Model.save` writes, by source kind."""
  root = tmp_path_factory.mktemp("formats")
  model = vit_jax.create("testing", num_classes=3, image_size=8)
  for fmt in ("hf", "timm", "npz", "big_vision"):
    model.save(root / fmt, fmt)
  return {
    "hf folder": str(root / "hf"),
    "hf .safetensors": str(root / "hf" / "model.safetensors"),
    "timm folder": str(root / "timm"),
    "timm .safetensors": str(root / "timm" / "model.safetensors"),
    "npz": str(root / "npz" / "model.npz"),
    "big_vision": str(root / "big_vision" / "model.npz"),
  }


@pytest.fixture
def detects(monkeypatch) -> Counter:
  """Every record's detect calls and the lookups (``find``), counted by name."""
  calls: Counter = Counter()

  def counted(name: str, detect: Callable[[str], bool]) -> Callable[[str], bool]:
    def spy(path: str) -> bool:
      calls[name] += 1
      return detect(path)

    return spy

  spied = tuple(dataclasses.replace(f, detect=counted(f.name, f.detect)) for f in formats.FORMATS)
  monkeypatch.setattr(formats, "FORMATS", spied)
  find = formats.find
  monkeypatch.setattr(formats, "find", lambda path: calls.update(["find"]) or find(path))
  return calls


def _tried_up_to(found: formats.Format) -> dict[str, int]:
  """Each detect once, in order, up to and including ``found``'s; the rest not tried."""
  names = [f.name for f in formats.FORMATS]
  return {"find": 1} | dict.fromkeys(names[: names.index(found.name) + 1], 1)


@pytest.mark.parametrize(
  "kind, record",
  [
    ("hf folder", formats.HF_VIT),
    ("hf .safetensors", formats.HF_VIT),
    ("timm folder", formats.TIMM),
    ("timm .safetensors", formats.TIMM),
    ("npz", formats.NPZ),
    ("big_vision", formats.BIG_VISION),
  ],
)
def test_a_written_source_is_detected_once_per_call(written, detects, kind, record):
  path = written[kind]
  assert formats.of(path).format.name == record.name  # the spied copy of the record
  detects.clear()
  loaded = sources.load(path)
  assert dict(detects) == _tried_up_to(record) and loaded.num_classes == 3
  detects.clear()
  sources.read_params(path)
  assert dict(detects) == _tried_up_to(record)


def test_a_run_is_detected_once_per_call(finished_run, detects):  # noqa: F811
  for path in (finished_run, os.path.join(finished_run, "checkpoints")):
    detects.clear()
    loaded = sources.load(path)
    assert dict(detects) == _tried_up_to(formats.RUN) and loaded.run_config is not None
  detects.clear()
  sources.read_params(path)  # the Orbax steps as stored (read_params takes checkpoints/)
  assert dict(detects) == _tried_up_to(formats.RUN)


def test_image_text_records_are_found_once_and_read_by_their_module(tmp_path, detects):
  """A SigLIP folder and a LiT `.npz` (each incomplete: their readers' errors show which
  record read them) are found with each detect tried once."""
  siglip = tmp_path / "siglip"
  siglip.mkdir()
  (siglip / "config.json").write_text(json.dumps({"model_type": "siglip"}))
  with pytest.raises(errors.CheckpointError, match="vision_config"):
    sources.load(str(siglip))
  assert dict(detects) == _tried_up_to(formats.HF_TWO_TOWER)
  lit = str(tmp_path / "LiT-B16B.npz")
  zeros = np.zeros(1, np.float32)
  np.savez(lit, **{"img/cls": zeros, "txt/Encoder_0/x": zeros, "t": zeros})
  detects.clear()
  with pytest.raises(errors.CheckpointError, match="without Embed_0"):
    sources.load(lit)
  assert dict(detects) == _tried_up_to(formats.LIT_NPZ)
  detects.clear()
  assert set(sources.read_params(lit)[0]) == {"img", "txt", "t"}  # as stored
  assert dict(detects) == _tried_up_to(formats.LIT_NPZ)


def test_nothing_there_is_one_error_after_each_detect_once(tmp_path, detects):
  with pytest.raises(errors.MissingError, match="No checkpoint at"):
    sources.load(str(tmp_path / "absent.npz"))
  assert dict(detects) == {"find": 1} | dict.fromkeys((f.name for f in formats.FORMATS), 1)


def test_each_export_name_has_its_writer():
  from vit_jax.models import families  # pylint: disable=g-import-not-at-top
  from vit_jax.weights import exports  # pylint: disable=g-import-not-at-top

  assert formats.for_export(exports.by_name("hf"), families.TWO_TOWER) is formats.HF_TWO_TOWER
  assert formats.for_export(exports.by_name("hf"), families.VIT) is formats.HF_VIT
  assert formats.for_export(exports.by_name("timm"), families.MIXER) is formats.TIMM
  assert formats.for_export(exports.by_name("npz"), families.TWO_TOWER) is formats.NPZ
  assert formats.for_export(exports.by_name("big_vision"), families.TWO_TOWER) is formats.BIG_VISION
  assert formats.for_export(exports.by_name("stablehlo"), families.VIT) is None
  assert all(f.write is not None for f in formats.FORMATS if f.export)
