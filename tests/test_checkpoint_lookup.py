"""Every command reads what Python reads: each checkpoint form the suite makes in seconds
(the folders `Model.save` writes as npz, big_vision, hf and timm, and their archive or
`.safetensors` file) is found by the one lookup (`vit_jax.weights.formats.locate`) when
given to `vit_jax.load` and to the commands' main functions, in-process: predict, export,
zeroshot (which finds it, then refuses an image model by name) and fewshot."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

import vit_jax
from vit_jax import export, fewshot, predict, zeroshot
from vit_jax.weights import formats

NAMES = ["zero", "one", "two"]
FORMS = {  # form -> (the format Model.save writes, the path given: the folder or a file in it)
  "npz folder": ("npz", ""),
  "npz file": ("npz", "model.npz"),
  "big_vision folder": ("big_vision", ""),
  "big_vision file": ("big_vision", "model.npz"),
  "hf folder": ("hf", ""),
  "timm folder": ("timm", ""),
  "timm .safetensors": ("timm", "model.safetensors"),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[vit_jax.Model, dict[str, str]]:
  """A tiny ViT with named classes, written as each format `Model.save` writes."""
  root = tmp_path_factory.mktemp("lookup")
  model = vit_jax.create("testing", num_classes=3, image_size=8, seed=1)
  head = np.random.default_rng(1).normal(size=model.params["head"]["kernel"].shape)
  params = {**model.params, "head": {**model.params["head"], "kernel": head.astype(np.float32)}}
  model = vit_jax.Model(
    vit_jax.weights.LoadedModel(
      model.config, params, 3, (8, 8), NAMES, "created", data_config=model.loaded.data_config
    )
  )
  for fmt in {fmt for fmt, _ in FORMS.values()}:
    model.save(root / fmt, fmt)
  return model, {form: str(root / fmt / name) for form, (fmt, name) in FORMS.items()}


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> str:
  path = tmp_path_factory.mktemp("image") / "grey.png"
  Image.new("RGB", (8, 8), (90, 120, 150)).save(path)
  return str(path)


@pytest.mark.parametrize("form", list(FORMS))
def test_each_form_is_read_by_python_and_every_command(
  form, written, image, digits_dir, tmp_path, capsys
):
  model, paths = written
  path = paths[form]
  assert formats.locate(path) is not None
  loaded = vit_jax.load(path)
  np.testing.assert_allclose(loaded.logits(loaded.prepare([image])), model.logits(
    model.prepare([image])), rtol=1e-4, atol=1e-4)  # fmt: skip
  a_folder = FORMS[form][1] == ""  # its labels.txt (hf: its config) names the classes
  assert loaded.class_names == (NAMES if a_folder else None)

  capsys.readouterr()
  assert predict.main(["predict", f"--checkpoint={path}", "--top_k=1", "--json", image]) == 0
  (line,) = [json.loads(text) for text in capsys.readouterr().out.splitlines()]
  want = loaded.predict([image], top_k=1)[0][0]
  assert (line["top_k"][0]["label"], line["top_k"][0]["probability"]) == pytest.approx(want)

  out = tmp_path / "exported"
  assert export.main(["export", f"--checkpoint={path}", "--format=npz", f"--out={out}"]) == 0
  again = vit_jax.load(out)
  np.testing.assert_array_equal(again.params["head"]["kernel"], loaded.params["head"]["kernel"])

  capsys.readouterr()
  assert zeroshot.main(["zeroshot", f"--checkpoint={path}", "--dataset=digits"]) != 0
  assert "is an image model, not an image-text one" in capsys.readouterr().err


# The few-shot command compiles its own feature extractor and reads every digit (20-40 s
# on 2 cores): by default on the folder `Model.save` writes (what it refused before it
# read through `locate`), the other forms with -m slow.
FEWSHOT_BY_DEFAULT = ("npz folder",)


@pytest.mark.parametrize(
  "form",
  [f if f in FEWSHOT_BY_DEFAULT else pytest.param(f, marks=pytest.mark.slow) for f in FORMS],
)
def test_each_form_few_shots(form, written, digits_dir, capsys):
  _, paths = written
  argv = ["fewshot", f"--checkpoint={paths[form]}", "--dataset=digits", "--shots=2", "--seeds=1"]
  assert fewshot.main([*argv, f"--data_dir={digits_dir}", "--batch=256"]) == 0
  rows = [r.split() for r in capsys.readouterr().out.splitlines() if r.startswith("digits ")]
  assert [row[:2] for row in rows] == [["digits", "2"]]
