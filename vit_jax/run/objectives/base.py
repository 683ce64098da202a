"""What the run reads of an objective: the members every one has, and its optional
capabilities, declared here with their defaults so the step, loop, planner and evaluators
use them as plain attributes; an objective overrides the ones it has."""

from __future__ import annotations

import abc
import types
from typing import Any, Callable, Mapping, Optional

import jax

from vit_jax.infra.aliases import Batch
from vit_jax.models import VisionTransformer

# A batch entry: (per-example shape, dtype); None in `Objective.train_fields` drops one.
Field = tuple[tuple[int, ...], Any]
# (params, micro-batches [A, B/A, ...], rngs [A]) -> (loss, grads) over the whole batch.
ValueAndGrad = Callable[[Any, Batch, jax.Array], tuple[jax.Array, Any]]


class Objective(abc.ABC):
  """A run's objective: ``model``, ``encoder`` (the `VisionTransformer` whose parameters it
  trains and fine-tuning reads), ``init``, ``loss`` (the mean over the batch, for
  `steps.train_step`) and ``eval_step`` (sums for `evaluators.accuracy`)."""

  model: Any
  encoder: VisionTransformer

  # Batch entries besides 'image' and 'label' (e.g. 'text': int32 [B, L]).
  batch_fields: Mapping[str, Field] = types.MappingProxyType({})
  # Top-level parameter subtrees with no update and no optimizer state (LiT's image tower).
  frozen: tuple[str, ...] = ()
  # The subtree ``config.pretrained`` initialises (None: the whole tree).
  pretrained_key: Optional[str] = None
  # The name under ``eval/`` of what the eval sums' 'correct' / 'count' measure.
  accuracy_metric: str = "accuracy"
  # Whether ``model``'s outputs are the dataset's classes (their top-1 is a class: ReaL).
  classifies: bool = False
  # Tokens per text of a text tower (None: none; zero-shot and retrieval need one).
  text_len: Optional[int] = None
  # (image_size, global batch) -> analytic FLOPs of one example of a train step, where the
  # model family's count is not it (None: `step_cost.vit_flops_per_image`).
  train_flops_per_example: Optional[Callable[[int, int], Optional[float]]] = None
  # The loss and gradient over the whole batch from ``config.accum_steps`` micro-batches,
  # for a loss that couples the batch's examples (None: the mean of the micro-batches').
  accumulated_value_and_grad: Optional[ValueAndGrad] = None

  @abc.abstractmethod
  def init(self, rng: jax.Array, images: jax.Array) -> Any:
    """Boxed parameters (with their logical axis names)."""

  @abc.abstractmethod
  def loss(self, params: Any, batch: Batch, rng: jax.Array) -> jax.Array:
    """The mean loss over a (micro-)batch."""

  @abc.abstractmethod
  def eval_step(self, params: Any, batch: Batch) -> dict[str, jax.Array]:
    """Sums of 'loss_sum', 'correct' and 'count' over a batch's real examples."""

  def train_fields(self, crop: int) -> dict[str, Optional[Field]]:
    """How the train batch differs from the eval batch (none by default)."""
    del crop
    return {}

  def feature_cache(self, params: Any, num_examples: int) -> Optional[Any]:
    """The train batches' transform (None by default: the batches as the pipeline makes
    them)."""
    del params, num_examples
    return None
