"""Training, resuming and predicting without TensorFlow: a fresh process in which the
package cannot find TensorFlow (its path finder is blind to it, as if it were not
installed) trains the quickstart config a few steps over an image folder and over saved
arrays with the Grain pipeline, resumes one, and predicts; digits (a tfds dataset, built
with TensorFlow) is one error line naming the extra."""

import os
import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
  """
  import importlib.machinery, os, sys

  class HideTensorFlow:
    @staticmethod
    def find_spec(name, path=None, target=None):
      if name == "tensorflow" or name.startswith("tensorflow."):
        return None
      return importlib.machinery.PathFinder.find_spec(name, path, target)

    invalidate_caches = importlib.machinery.PathFinder.invalidate_caches

  finders = sys.meta_path
  finders[:] = [HideTensorFlow if f is importlib.machinery.PathFinder else f for f in finders]

  import numpy as np
  from PIL import Image

  import vit_jax
  from vit_jax import main
  from vit_jax.data import arrays

  tmp = sys.argv[1]
  rng = np.random.default_rng(0)
  for split, n in (("train", 24), ("test", 8)):
    for k in range(n):
      folder = os.path.join(tmp, "images", split, f"c{k % 2}")
      os.makedirs(folder, exist_ok=True)
      pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
      Image.fromarray(pixels).save(os.path.join(folder, f"{k}.jpg"))
  images = rng.integers(0, 256, (24, 8, 8, 3), dtype=np.uint8)
  arrays.save_arrays(
    os.path.join(tmp, "a.npz"), images, np.arange(24) % 3, test_images=images[:8],
    test_labels=np.arange(8) % 3,
  )

  def train(dataset, workdir, steps):
    flags = [f"--config.dataset={dataset}", "--config.batch=8", "--config.batch_eval=8",
      f"--config.total_steps={steps}", "--config.checkpoint_every=2", "--config.log_every=2",
      "--config.eval_every=100", "--config.lr.warmup_steps=1", "--config.shuffle_buffer=64",
      "--config.fewshot.every=0", "--config.pp.crop=8", "--config.model.patches.size=(4, 4)",
      "--config.model.transformer.num_layers=1"]
    code = main.main(["main", "--config=configs/quickstart.py", f"--workdir={workdir}", *flags])
    assert code == 0, code

  run = os.path.join(tmp, "run")
  train(f"folder:{tmp}/images", run, 2)
  train(f"folder:{tmp}/images", run, 4)  # resumed from step 2
  assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == ["2", "4"]
  train(f"arrays:{tmp}/a.npz", os.path.join(tmp, "arrays_run"), 2)
  top = vit_jax.load(run).predict(os.path.join(tmp, "images", "test", "c0", "0.jpg"))
  assert top[0][0][0] in ("c0", "c1"), top
  code = main.main(["main", "--config=configs/quickstart.py", f"--workdir={tmp}/digits"])
  assert code == 2, code  # digits is a tfds dataset: one Error line naming the [tf] extra
  assert "tensorflow" not in sys.modules
  print("OK")
  """
)


def test_trains_resumes_and_predicts_without_tensorflow(tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, "PYTHONPATH": root}
  done = subprocess.run(
    [sys.executable, "-c", _SCRIPT, str(tmp_path)],
    capture_output=True,
    text=True,
    cwd=root,
    env=env,
    timeout=600,
  )
  assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]
  assert "needs TensorFlow" not in done.stderr or "Traceback" not in done.stderr
  assert 'is a tfds dataset, read (and built) with TensorFlow: pip install -e ".[tf]"' in (
    done.stderr
  )
