"""``python -m vit_jax.zeroshot`` on an image-text checkpoint that is no training run: a tiny
SigLIP built and saved as big_vision saves it (`tests/big_vision_reference.py`), with its
SentencePiece model, classifying a ``folder:`` dataset of images written here. Its printed
accuracy is the one the model's own probabilities and embeddings give on the same files."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import vit_jax
from tests import image_text_fixtures
from tests.test_big_vision import IMAGE, _model, _saved, vocabulary  # noqa: F401  (its fixture)
from vit_jax import zeroshot as zeroshot_cli
from vit_jax.data import captions

pytest.importorskip("sentencepiece")

CLASSES = ("bird", "cat", "dog")  # the folders' names: sorted, as the labels are
TEMPLATE = "a {}."  # within the text length in the tiny vocabulary's pieces
N = 8  # test images


def _accuracy(capsys, argv: list[str]) -> str:
  capsys.readouterr()
  assert zeroshot_cli.main(["zeroshot", *argv]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].endswith(f"test: {N} images"), lines[0]
  return dict(line.split() for line in lines[1:])["zeroshot/accuracy"]


def _ensemble_predictions(model: vit_jax.Model, files: list[str], templates) -> np.ndarray:
  """[N] classes from the model's own embeddings: each class the normalised mean of its
  prompts' normalised text embeddings (CLIP's prompt ensembling), nearest by cosine."""
  loaded = model.loaded
  prompts = [t.format(c) for c in CLASSES for t in templates]
  ids = loaded.tokenizer.encode(prompts, loaded.config.text_len)
  zimg, ztxt, _ = loaded.module().apply({"params": loaded.params}, model.prepare(files), ids)
  unit = lambda z: z / np.linalg.norm(z, axis=-1, keepdims=True)  # noqa: E731
  classes = unit(unit(np.asarray(ztxt)).reshape(len(CLASSES), len(templates), -1).mean(1))
  return (unit(np.asarray(zimg)) @ classes.T).argmax(-1)


def test_big_vision_siglip_zero_shot_is_its_own_probabilities(
  tmp_path, request, monkeypatch, capsys
):
  path, _ = _saved(tmp_path, request.getfixturevalue("vocabulary"), _model())
  model = vit_jax.load(path)
  pixels = np.random.default_rng(2).integers(0, 256, (N, IMAGE, IMAGE, 3), np.uint8)
  files = [str(tmp_path / f"{i}.png") for i in range(N)]
  for p, file in zip(pixels, files):  # at the model's size: no resize on either path
    Image.fromarray(p).save(file)
  texts = [TEMPLATE.format(c) for c in CLASSES]
  predicted = model.text_probabilities(files, texts).argmax(-1)  # [N]
  # --templates' default for a checkpoint is CLIP's prompts; this tiny model ranks the
  # images alike with them and with the one template, so the test sets another default.
  assert zeroshot_cli.CHECKPOINT_TEMPLATES == "clip"
  monkeypatch.setattr(zeroshot_cli, "CHECKPOINT_TEMPLATES", "digits")
  default = captions.TEMPLATES["digits"]
  ensembled_predicted = _ensemble_predictions(model, files, default)  # [N]
  # Three images in the class the one template picks, the rest in another (the ensemble's
  # pick where it differs): accuracy 3/8 with the one template, another with the default.
  other = np.where(ensembled_predicted != predicted, ensembled_predicted, predicted + 1)
  labels = np.where(np.arange(N) < 3, predicted, other % len(CLASSES))
  root = tmp_path / "data"
  image_text_fixtures.class_folder(root, CLASSES, pixels, labels)
  argv = [f"--checkpoint={path}", f"--dataset=folder:{root}"]

  monkeypatch.setitem(captions.TEMPLATES, "one", (TEMPLATE,))
  expected = float(np.mean(predicted == labels))
  assert expected == 3 / N
  assert _accuracy(capsys, [*argv, "--templates=one"]) == f"{expected:.4f}"
  # Without --templates: the default for a checkpoint, ensembled per class.
  ensembled = np.mean(ensembled_predicted == labels)
  assert ensembled != expected  # so the line below tells the templates apart
  assert _accuracy(capsys, argv) == f"{ensembled:.4f}"

  assert zeroshot_cli.main(["zeroshot", f"--checkpoint={path}"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert "is no training run, so it names no dataset: pass --dataset=folder:" in err[-1]
