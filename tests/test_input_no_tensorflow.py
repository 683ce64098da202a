"""Training, resuming and predicting without TensorFlow: a fresh process in which the
package cannot find TensorFlow (its path finder is blind to it, as if it were not
installed) trains over an image folder (and resumes, and predicts), saved arrays, the
quickstart's `digits` (scikit-learn's arrays: the batches of the tfds dataset TensorFlow
builds, checked here in this process, which has TensorFlow), a tfds dataset prepared as
ArrayRecord and SigLIP on a captions folder and on WebDataset shards (each stopped after a
saved step and resumed exactly, then evaluated); the same tfds dataset as TFRecord is one
error line naming the extra and tfds' conversion."""

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import tensorflow_datasets as tfds

from tests import batches_of

_SCRIPT = textwrap.dedent(
  """
  import importlib.machinery, os, pathlib, sys

  from tests.no_tensorflow import HideTensorFlow

  finders = sys.meta_path
  finders[:] = [HideTensorFlow if f is importlib.machinery.PathFinder else f for f in finders]

  import jax
  import numpy as np
  from PIL import Image

  import vit_jax
  from configs import quickstart
  from tests import batches_of
  from tests import image_text_fixtures as fixtures
  from vit_jax import data, main, run
  from vit_jax.data import arrays
  from vit_jax.weights import orbax_steps

  tmp, array_record_dir, tfrecord_dir = sys.argv[1:]
  # Runs of one model share their programs through JAX's compilation cache (a resumed run
  # compiles what its straight run did): seconds, not minutes, for the runs below.
  jax.config.update("jax_compilation_cache_dir", os.path.join(tmp, "xla"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  # Every image classifier below has the 10 classes of digits and takes the same steps (a
  # constant learning rate after its warmup step: the step does not depend on
  # total_steps): one train step and one evaluation program, compiled once and read back
  # from the cache by the other runs.
  rng = np.random.default_rng(0)
  for split, n in (("train", 30), ("test", 10)):
    for k in range(n):
      folder = os.path.join(tmp, "images", split, f"c{k % 10}")
      os.makedirs(folder, exist_ok=True)
      pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
      Image.fromarray(pixels).save(os.path.join(folder, f"{k}.jpg"))
  images = rng.integers(0, 256, (24, 8, 8, 3), dtype=np.uint8)
  arrays.save_arrays(
    os.path.join(tmp, "a.npz"), images, np.arange(24) % 10, test_images=images[:8],
    test_labels=np.arange(8) % 10,
  )
  # Decoded by threads (config.decode_processes=0): worker processes, fresh Pythons that
  # can find TensorFlow, would test nothing of the core install and start for each split of
  # each run.
  FLAGS = ["--config.batch=8", "--config.batch_eval=8", "--config.checkpoint_every=2",
    "--config.log_every=2", "--config.eval_every=100", "--config.lr.warmup_steps=1",
    "--config.lr.decay=constant",
    "--config.shuffle_buffer=64", "--config.fewshot.every=0", "--config.pp.crop=8",
    "--config.model.patches.size=(4, 4)", "--config.model.transformer.num_layers=1",
    "--config.decode_processes=0"]

  def train(dataset, workdir, steps, *extra):
    flags = [f"--config.dataset={dataset}", f"--config.total_steps={steps}", *FLAGS, *extra]
    return main.main(["main", "--config=configs/quickstart.py", f"--workdir={workdir}", *flags])

  run_dir = os.path.join(tmp, "run")
  assert train(f"folder:{tmp}/images", run_dir, 2) == 0
  assert train(f"folder:{tmp}/images", run_dir, 4) == 0  # resumed from step 2
  assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["2", "4"]
  assert train(f"arrays:{tmp}/a.npz", os.path.join(tmp, "arrays_run"), 4) == 0
  top = vit_jax.load(run_dir).predict(os.path.join(tmp, "images", "test", "c0", "0.jpg"))
  assert top[0][0][0] in {f"c{k}" for k in range(10)}, top

  # The quickstart's digits, from scikit-learn's arrays: it trains, and its batches are saved
  # for the parent to compare with the tfds-built dataset's.
  assert train("digits", os.path.join(tmp, "digits_run"), 4) == 0
  np.savez(os.path.join(tmp, "digits.npz"), **batches_of.quickstart_batches())

  # Stopped after step 3 (step 2 saved) and resumed, a run ends as a straight one: its last
  # step's (4) parameters and the metrics `keys` (evaluation's among them), bit for bit.
  def resumes_exactly(config, name, keys):
    assert (config.total_steps, config.checkpoint_every) == (4, 2), config
    straight_dir, resumed_dir = (os.path.join(tmp, name, d) for d in ("straight", "resumed"))
    straight = run.train_and_evaluate(config, straight_dir)
    real_iterator = data.train_iterator

    def preempted(*args, **kwargs):
      batches = real_iterator(*args, **kwargs)
      for _ in range(3):
        yield next(batches)
      batches.close()
      raise RuntimeError("preempted")

    data.train_iterator = preempted
    try:
      run.train_and_evaluate(config, resumed_dir)
      raise AssertionError("not preempted")
    except RuntimeError as e:
      assert str(e) == "preempted", e
    finally:
      data.train_iterator = real_iterator
    assert sorted(os.listdir(os.path.join(resumed_dir, "checkpoints"))) == ["2"]
    resumed = run.train_and_evaluate(config, resumed_dir)
    for key in keys:
      assert resumed[key] == straight[key], (name, key, resumed, straight)
    a = orbax_steps.read_params(os.path.join(straight_dir, "checkpoints", "4"))
    b = orbax_steps.read_params(os.path.join(resumed_dir, "checkpoints", "4"))
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
      np.testing.assert_array_equal(x, y)

  # A tfds dataset prepared as ArrayRecord: the model, classes and steps of the runs above.
  config = quickstart.get_config()
  config.update(dict(dataset="no_tf_images", data_dir=array_record_dir, batch=8, batch_eval=8,
    total_steps=4, checkpoint_every=2, log_every=1, eval_every=100, shuffle_buffer=16,
    decode_processes=0))
  config.lr.warmup_steps, config.lr.decay = 1, "constant"
  config.pp.crop, config.fewshot.every = 8, 0
  config.model.transformer.num_layers = 1
  resumes_exactly(config, "tfds", ("train/loss", "eval/loss", "eval/accuracy"))

  # Image-text sources: a captions folder and WebDataset shards, SigLIP on their captions
  # (evaluated by retrieval on their test splits).
  tokenizer = fixtures.write_tokenizer(os.path.join(tmp, "tokenizer.json"))
  for name, write in (("captions", fixtures.write_caption_folder),
                      ("wds", fixtures.write_shards)):
    source = write(pathlib.Path(tmp, f"{name}_data"))
    config = fixtures.image_text_config(source, tokenizer, batch=8, batch_eval=8,
      total_steps=4, checkpoint_every=2, decode_processes=0)
    resumes_exactly(config, name, ("train/loss", "retrieval/image_to_text_recall@1"))

  # The same dataset as TFRecord: one Error line naming the [tf] extra and the conversion.
  code = train("no_tf_images", os.path.join(tmp, "tfrecord_run"), 2,
    f"--config.data_dir={tfrecord_dir}")
  assert code == 2, code
  assert "tensorflow" not in sys.modules
  print("OK")
  """
)


class NoTfImages(tfds.core.GeneratorBasedBuilder):
  """40 train and 8 test random 12x12 RGB images of 10 classes (as digits)."""

  VERSION = tfds.core.Version("1.0.0")
  code_path = pathlib.Path(__file__)  # as digits.Digits: importlib_resources is not installed

  def _info(self) -> tfds.core.DatasetInfo:
    features = {
      "image": tfds.features.Image(shape=(12, 12, 3)),
      "label": tfds.features.ClassLabel(names=list("abcdefghij")),
    }
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(40, 0), "test": self._generate_examples(8, 1)}

  def _generate_examples(self, n: int, seed: int):
    rng = np.random.default_rng(seed)
    for i in range(n):
      yield i, {"image": rng.integers(0, 256, (12, 12, 3), dtype=np.uint8), "label": i % 10}


def test_trains_resumes_and_predicts_without_tensorflow(tmp_path, digits_dir):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  prepared = {}
  for file_format in ("array_record", "tfrecord"):
    prepared[file_format] = str(tmp_path / file_format)
    builder = NoTfImages(data_dir=prepared[file_format], file_format=file_format)
    builder.download_and_prepare()
  env = {**os.environ, "PYTHONPATH": root}
  done = subprocess.run(
    [sys.executable, "-c", _SCRIPT, str(tmp_path), prepared["array_record"], prepared["tfrecord"]],
    capture_output=True,
    text=True,
    cwd=root,
    env=env,
    timeout=600,
  )
  assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]
  assert "tfds convert_format --dataset_version_dir=" in done.stderr, done.stderr[-3000:]
  assert 'pip install -e ".[tf]"' in done.stderr

  # The quickstart's batches without TensorFlow are those of the tfds dataset TensorFlow
  # built: the same examples in the same order, the same PNG pixels.
  without_tf = np.load(tmp_path / "digits.npz")
  with_tf = batches_of.quickstart_batches(data_dir=digits_dir)
  for key in ("index", "label", "eval_label", "eval_mask", "eval_image"):
    np.testing.assert_array_equal(without_tf[key], with_tf[key], err_msg=key)
