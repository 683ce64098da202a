"""COCO-style retrieval with several captions per image, on a hand-built case whose
recalls are worked out below, and the rows of the eval batches mapped back to the split."""

from __future__ import annotations

import numpy as np
import pytest

from vit_jax.run.evaluators import retrieval

# Three images (the unit vectors) and two captions each; score = caption[image].
IMAGES = np.eye(3, dtype=np.float32)
CAPTIONS = np.array(
  [
    [0.9, 0.5, 0.0],  # image 0's
    [0.1, 0.8, 0.0],  # image 0's
    [0.2, 0.7, 0.1],  # image 1's
    [0.0, 0.1, 0.3],  # image 1's
    [0.4, 0.0, 0.6],  # image 2's
    [0.0, 0.0, 0.2],  # image 2's
  ],
  np.float32,
)
OWNER = np.array([0, 0, 1, 1, 2, 2])


def test_an_image_is_a_hit_when_any_of_its_captions_ranks_in_the_top_k():
  metrics = retrieval.retrieval_metrics(IMAGES, CAPTIONS, OWNER)
  # image -> text. Image 0: best own 0.9, nothing higher (rank 0). Image 1: scores
  # [.5 .8 .7 .1 0 0], best own .7, image 0's .8 above it (rank 1). Image 2: best own .6,
  # nothing higher (rank 0).
  assert metrics["retrieval/image_to_text_recall@1"] == pytest.approx(2 / 3)
  assert metrics["retrieval/image_to_text_recall@5"] == 1.0
  # text -> image, every caption a query. Caption 1 [.1 .8 0] ranks image 0 second and
  # caption 3 [0 .1 .3] ranks image 1 second; the other four rank their image first.
  assert metrics["retrieval/text_to_image_recall@1"] == pytest.approx(4 / 6)
  assert metrics["retrieval/text_to_image_recall@5"] == 1.0
  assert metrics["retrieval/text_to_image_recall@10"] == 1.0


def test_the_first_caption_alone_scores_otherwise_and_blocks_do_not_change_it(monkeypatch):
  # With only each image's first caption image 1 finds its own (.7 over .5 and 0): the
  # protocol, not the data, changes the number.
  first = retrieval.retrieval_metrics(IMAGES, CAPTIONS[::2])
  assert first["retrieval/image_to_text_recall@1"] == 1.0
  whole = retrieval.retrieval_metrics(IMAGES, CAPTIONS, OWNER)
  monkeypatch.setattr(retrieval, "_BLOCK", 2)  # queries scored two at a time
  assert retrieval.retrieval_metrics(IMAGES, CAPTIONS, OWNER) == whole


def test_an_image_without_a_caption_is_refused():
  with pytest.raises(ValueError, match="at least one caption"):
    retrieval.retrieval_metrics(IMAGES, CAPTIONS[:4], OWNER[:4])


def test_eval_rows_map_to_split_indices_for_any_process_count():
  # 5 examples, global batch 4: one process fills rows 0-3 with examples 0..7 (5.. padded);
  # two processes split the examples [0, 2) and [2, 5), each filling 2 rows of a batch.
  one = retrieval.eval_indices(5, 4, 1, 2)
  np.testing.assert_array_equal(one, [[0, 1, 2, 3], [4, -1, -1, -1]])
  two = retrieval.eval_indices(5, 4, 2, 2)
  np.testing.assert_array_equal(two, [[0, 1, 2, 3], [-1, -1, 4, -1]])
