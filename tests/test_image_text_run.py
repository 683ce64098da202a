"""The two-tower family in the run: SigLIP on captioned digits resumes exactly, LiT keeps
the image tower it starts from, captions and their tokenizer are deterministic, retrieval
recall counts ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import traverse_util
from PIL import Image

import vit_jax
from configs import siglip
from tests import fresh_python, train_fixtures
from tests.test_feature_cache import _lit
from tests.test_main import assert_resume_is_exact
from vit_jax import models, predict, run
from vit_jax import zeroshot as zeroshot_cli
from vit_jax.data import captions, tokenizer_kinds
from vit_jax.infra import errors
from vit_jax.run.evaluators import retrieval
from vit_jax.weights import orbax_steps, sources

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = dict(width=16, depth=1, mlp_dim=32, num_heads=2, vocab_size=64, pool="gap")


def _siglip(data_dir: str, **overrides):
  config = siglip.get_config("digits")
  train_fixtures.override(config, train_fixtures.TINY)
  config.data_dir = data_dir
  config.model = models.two_tower_config(
    models.get_model_config("testing"), text=TEXT, text_len=8, embed_dim=16
  )
  return train_fixtures.override(config, overrides)


def _flat(tree):
  return traverse_util.flatten_dict(tree, sep="/")


def test_two_tower_family_builds_from_config_and_refuses_unknown_text_keys():
  config = models.two_tower_config(
    models.get_model_config("testing"), text=TEXT, text_len=8, embed_dim=16, loss="softmax"
  )
  settings = models.model_settings(config)
  assert models.is_two_tower(config) and settings.bias_init is None
  assert settings.replace(remat=True).image.remat and models.image_settings(config).name
  config.text.dim = 3
  with pytest.raises(errors.ConfigError, match="unknown keys \\['dim'\\]"):
    models.model_settings(config)


def test_siglip_run_with_text_in_the_batch_resumes_exactly(tmp_path, digits_dir, monkeypatch):
  # Evaluated at the end only (eval_every past total_steps): the final evaluations and
  # parameters are compared; the stop (step 4) is after the checkpoint of step 3. Decoded
  # by threads: no worker processes to start for each split of the three runs (the LiT
  # run below decodes in worker processes; their batches are the threads',
  # tests/test_decode_workers.py).
  config = _siglip(digits_dir, eval_every=100, decode_processes=0)
  assert_resume_is_exact(config, tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def lit_run(tmp_path_factory, digits_dir, tiny_run):
  """(config, workdir, final metrics) of the LiT run (locked image tower,
  `test_feature_cache._lit`) from the supervised tiny run's checkpoints. Copy the workdir
  before changing it."""
  config = _lit(digits_dir, os.path.join(tiny_run[0], "checkpoints"))
  workdir = str(tmp_path_factory.mktemp("lit_plain"))
  return config, workdir, run.train_and_evaluate(config, workdir)


def test_locked_image_tower_ends_as_it_started_and_has_no_optimizer_state(
  tmp_path, tiny_run, lit_run, capsys
):
  source = os.path.join(tiny_run[0], "checkpoints")  # the supervised tiny run
  config, workdir, metrics = lit_run
  assert config.contrastive.lock_image and config.pretrained == source
  shutil.copytree(workdir, tmp_path / "lit")  # changed below
  assert 0.0 <= metrics["zeroshot/accuracy"] <= 1.0
  # In-batch top-1 is named so, beside zero-shot accuracy: not a class accuracy.
  assert 0.0 <= metrics["eval/in_batch_top1"] <= 1.0 and "eval/accuracy" not in metrics
  start = _flat(orbax_steps.read_params(source))
  end_tree = orbax_steps.read_params(tmp_path / "lit" / "checkpoints")
  end = _flat(end_tree)
  image = {k[len("img/") :]: v for k, v in end.items() if k.startswith("img/")}
  assert image and set(image) == set(start) - {"head/kernel", "head/bias"}
  for k, v in image.items():
    np.testing.assert_array_equal(v, start[k], err_msg=k)
  assert any(not np.array_equal(v, 0) for k, v in end.items() if k.startswith("txt/"))
  steps = train_fixtures.build_steps(config)
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(
    steps.abstract_state.opt_state)]  # fmt: skip
  assert paths and not any("'img'" in p for p in paths)
  # The command reads the run back and gives the in-training evaluation's numbers, also
  # for a run made before a top-level key existed (its config.json lacks `text`).
  config_json = tmp_path / "lit" / "config.json"
  saved = json.loads(config_json.read_text())
  config_json.write_text(json.dumps({k: v for k, v in saved.items() if k != "text"}))
  capsys.readouterr()
  assert zeroshot_cli.main(["zeroshot", f"--checkpoint={tmp_path / 'lit'}"]) == 0
  printed = dict(line.split() for line in capsys.readouterr().out.splitlines()[1:])
  assert float(printed["zeroshot/accuracy"]) == pytest.approx(
    metrics["zeroshot/accuracy"], abs=1e-4
  )
  recall = metrics["retrieval/text_to_image_recall@5"]
  assert float(printed["retrieval/text_to_image_recall@5"]) == pytest.approx(recall, abs=1e-4)
  # predict --texts reads the run (its tokenizer rebuilt from its captions): SigLIP's sigmoid
  # of t * zimg . ztxt + b, computed here from the stored parameters.
  image = tmp_path / "seven.png"
  Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), np.uint8)).save(image)
  texts = ["a photo of the digit seven.", "a photo of the digit two."]
  argv = ["predict", f"--checkpoint={tmp_path / 'lit'}", f"--texts={','.join(texts)}", "--json"]
  assert predict.main([*argv, str(image)]) == 0
  top = json.loads(capsys.readouterr().out)["top_k"]
  loaded = sources.load(tmp_path / "lit")
  x = vit_jax.Model(loaded).prepare([str(image)])
  ids = captions.Captions(loaded.class_names, "digits", 8).tokenizer.encode(texts, 8)
  zimg, ztxt, out = loaded.module().apply({"params": end_tree}, x, ids)
  expected = jax.nn.sigmoid(out["t"] * zimg @ ztxt.T + out["b"])[0]
  assert {e["label"]: e["probability"] for e in top} == pytest.approx(
    dict(zip(texts, np.asarray(expected).tolist())), abs=1e-6
  )


def test_lock_without_weights_and_sigmoid_without_bias_are_clear_errors(digits_dir):
  config = _siglip(digits_dir, **{"contrastive.lock_image": True})
  with pytest.raises(errors.ConfigError, match="config.pretrained names no weights"):
    train_fixtures.build_steps(config)
  config = _siglip(digits_dir, **{"model.bias_init": None})
  with pytest.raises(errors.ConfigError, match="config.model.bias_init=None"):
    train_fixtures.build_steps(config)


def test_captions_do_not_depend_on_the_process_split_and_the_tokenizer_reads_back(tmp_path):
  made = captions.Captions([str(d) for d in range(10)], "digits", length=12)
  assert made.texts[7][0] == "a photo of the digit seven."
  labels = np.eye(10, dtype=np.float32)[np.arange(16) % 10]
  whole = made.train_ids(labels, step=5, first_row=0, seed=1)
  halves = [made.train_ids(labels[i : i + 8], step=5, first_row=i, seed=1) for i in (0, 8)]
  np.testing.assert_array_equal(whole, np.concatenate(halves))
  assert len({tuple(r) for r in whole}) > 10  # several templates are drawn
  made.tokenizer.save(str(tmp_path / "tokenizer.json"))
  again = tokenizer_kinds.load_tokenizer(str(tmp_path))
  texts = [t for row in made.texts for t in row]
  np.testing.assert_array_equal(again.encode(texts, 12), made.tokenizer.encode(texts, 12))


def test_recall_counts_the_candidates_scoring_strictly_higher():
  scores = np.array([[0.9, 0.1, 0.0], [0.8, 0.5, 0.1], [0.3, 0.2, 0.1]])
  assert retrieval.recall_at(scores, (1, 2, 3)) == {1: 1 / 3, 2: 2 / 3, 3: 1.0}


def test_the_runs_sigmoid_loss_passes_texts_around_8_devices_and_equals_one_device(tmp_path):
  out = tmp_path / "results.npz"
  env = {**os.environ, "XLA_FLAGS": fresh_python.xla_flags(8), "PYTHONPATH": REPO}
  proc = subprocess.run(
    [sys.executable, "-m", "tests._contrastive_step", str(out)],
    cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  with np.load(out) as f:
    r = dict(f)
  assert r["ring/permutes"] and not r["one/permutes"]
  np.testing.assert_allclose(r["ring/loss"], r["one/loss"], rtol=1e-5)
  assert r["one/loss"][1] < r["one/loss"][0]
  np.testing.assert_allclose(r["accum/loss"], r["one/loss"], rtol=1e-5)
  assert r["accum/permutes"]
  for k in (k for k in r if k.startswith("one/params/")):
    for other in ("ring", "accum"):
      np.testing.assert_allclose(r[f"{other}/" + k[len("one/") :]], r[k], atol=1e-5, err_msg=k)
