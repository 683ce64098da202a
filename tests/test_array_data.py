"""In-memory arrays as a run's dataset (``arrays:``) and fine-tuning from Python on them
(`vit_jax.Model.fine_tune`): the pipeline every source goes through, with exact resume."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import vit_jax
from tests import train_fixtures
from vit_jax import data, models
from vit_jax.data import arrays
from vit_jax.infra import errors, sharding

N, SIZE, CLASSES = 24, 8, 3


def _arrays(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(seed)
  return rng.integers(0, 256, (N, SIZE, SIZE, 3), dtype=np.uint8), rng.integers(0, CLASSES, N)


@pytest.fixture
def settings(tmp_path):
  images, labels = _arrays()
  dataset = arrays.save_arrays(tmp_path / "a.npz", images, labels, class_names=["x", "y", "z"])
  config = train_fixtures.common_config(dataset=dataset, train_split="train", test_split="train")
  train_fixtures.override(
    config, {"pp.crop": SIZE, "batch": 4, "batch_eval": 8, "seed": 3, "shuffle_buffer": 16}
  )
  config.model = models.get_model_config("testing")
  return data.Settings.from_config(config), images, labels


def _batches(settings, start_step: int, count: int) -> list[dict[str, np.ndarray]]:
  mesh = sharding.make_mesh((("data", -1), ("model", 1)))
  stream = data.train_iterator(settings, mesh, start_step=start_step)
  try:
    return [{k: np.asarray(v) for k, v in b.items()} for b in itertools.islice(stream, count)]
  finally:
    stream.close()


def test_a_resumed_stream_reads_the_batches_of_an_uninterrupted_one(settings):
  settings, _, _ = settings
  whole = _batches(settings, 0, 7)  # steps 1..7: more than an epoch of 24 at batch 4
  resumed = _batches(settings, 4, 3)  # a run resumed at step 4: steps 5..7
  for want, got in zip(whole[4:], resumed, strict=True):
    np.testing.assert_array_equal(got["image"], want["image"])
    np.testing.assert_array_equal(got["label"], want["label"])
  assert not np.array_equal(whole[0]["image"], whole[1]["image"])


def test_eval_batches_are_the_arrays_normalised_with_their_labels(settings):
  settings, images, labels = settings
  assert data.dataset_info(settings).class_names == ["x", "y", "z"]
  mesh = sharding.make_mesh((("data", -1), ("model", 1)))
  batch = next(iter(data.eval_iterator(settings, mesh)))
  # The split's fixed order is the arrays' own; at the crop size the resize keeps them.
  np.testing.assert_allclose(np.asarray(batch["image"]), (images[:8] - 127.5) / 127.5, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(batch["label"]).argmax(-1), labels[:8])


def test_an_iterable_of_batches_is_gathered_into_arrays_in_order():
  images, labels = _arrays()
  one_hot = np.eye(CLASSES, dtype=np.float32)
  batches = ((images[i : i + 8], labels[i : i + 8]) for i in range(0, 16, 8))
  dicts = [{"image": images[16:] / 255.0, "label": one_hot[labels[16:]]}]
  got_images, got_labels = arrays.gather_batches(itertools.chain(batches, dicts))
  np.testing.assert_array_equal(got_images, images)
  np.testing.assert_array_equal(got_labels, labels)
  with pytest.raises(errors.ConfigError, match="yielded none"):
    arrays.gather_batches(iter(()))


def test_bad_arrays_get_one_error_naming_the_fix(tmp_path):
  images, labels = _arrays()
  with pytest.raises(errors.ConfigError, match=r"float in \[0, 1\]"):
    arrays.save_arrays(tmp_path / "a.npz", images * 2.0, labels)
  with pytest.raises(errors.ConfigError, match="24 integer class indices"):
    arrays.save_arrays(tmp_path / "a.npz", images, labels[:5])
  with pytest.raises(errors.MissingError, match="save_arrays"):
    arrays.ArrayDataset(str(tmp_path / "none.npz"))


def test_fine_tune_on_arrays_learns_a_colour_task_and_leaves_a_run(tmp_path):
  """Three classes, each one flat colour: 20 steps of the run learn them."""
  labels = np.arange(30) % CLASSES
  colours = np.array([[230, 20, 20], [20, 230, 20], [20, 20, 230]], np.uint8)
  images = np.broadcast_to(colours[labels][:, None, None], (30, 12, 12, 3)).copy()
  model = vit_jax.create("testing", num_classes=5, image_size=SIZE)
  tuned, history = model.fine_tune(
    images,
    labels,
    steps=20,
    workdir=tmp_path / "run",
    class_names=["red", "green", "blue"],
    overrides={"optim.name": "adamw", "lr.base": 0.01, "pp.flip": False},
  )
  assert tuned.num_classes == CLASSES and tuned.class_names == ["red", "green", "blue"]
  assert history.final["eval/accuracy"] == 1.0
  assert (tmp_path / "run" / "checkpoints").is_dir()  # a run as the command leaves one
  top = [p[0][0] for p in tuned.predict(colours[:, None, None].repeat(SIZE, 1).repeat(SIZE, 2))]
  assert top == ["red", "green", "blue"]
  with pytest.raises(errors.ConfigError, match="'optim.nam'"):
    model.fine_tune(images, labels, workdir=tmp_path / "bad", overrides={"optim.nam": "sgd"})


def test_a_bare_config_dict_names_the_keys_it_lacks():
  import ml_collections

  from vit_jax import run

  with pytest.raises(errors.ConfigError, match=r"lacks \d+ keys: .*mesh.*vit_jax.run.defaults"):
    run.build(ml_collections.ConfigDict({"seed": 0}))
