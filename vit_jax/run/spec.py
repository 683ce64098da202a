"""A run, resolved: the typed, validated, immutable description every part of a run reads.

`vit_jax.run.resolve` builds a `RunSpec` from a config file's `ml_collections.ConfigDict`
once, checking every value on the way; the modules of the run take the section they own
(`optim.OptimizerSettings`, `mixup.MixupSettings`, `LoopSettings`, `data.Settings`,
`vit_jax.models.ModelSettings`, ...), never the config.
The defaults of every field are `vit_jax.run.defaults`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Union

import ml_collections

from vit_jax.data.settings import Settings as DataSettings
from vit_jax.models.settings import Settings
from vit_jax.run import resume_policy
from vit_jax.run.mixup import MixupSettings
from vit_jax.run.optim import OptimizerSettings


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """How long the loop runs and how often it reports, evaluates and saves."""

  total_steps: int  # 0: only evaluate
  log_every: int
  eval_every: int
  checkpoint_every: int
  keep_checkpoints: int  # the newest steps kept on disk


@dataclasses.dataclass(frozen=True)
class ObjectiveSettings:
  """What is trained (`vit_jax.run.objectives`): its registered name, loss and options."""

  name: str  # a key of objectives.OBJECTIVES
  loss: str  # a key of losses.LOSSES (classification)
  label_smoothing: float  # of the training labels (classification), in [0, 1)
  options: ml_collections.FrozenConfigDict  # the objective's own section (config.mpp)


@dataclasses.dataclass(frozen=True)
class PretrainedSettings:
  """Where the initial weights come from, and how they are fitted to the new model."""

  source: Optional[str]  # None: random initialization
  reset_head: bool
  posemb_resize: str  # `vit_jax.models.posemb.POSEMB_RESIZE_METHODS`


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """Everything a run is, checked. ``accum_steps`` is an int once `resolve` has run."""

  model: Settings  # `ModelSettings`, or `MixerSettings` for an MLP-Mixer
  num_classes: int
  num_train: Optional[int]  # None where the data was not opened (planning)
  data: DataSettings
  objective: ObjectiveSettings
  optimizer: OptimizerSettings
  mixup: MixupSettings
  loop: LoopSettings
  pretrained: PretrainedSettings
  # Each evaluator's settings, read from the config section of its name
  # (`evaluators.read_settings`): e.g. ``evaluators['fewshot']`` from ``config.fewshot``.
  evaluators: Mapping[str, Any]
  mesh_axes: tuple[tuple[str, int], ...]
  partitioning: str
  accum_steps: Union[int, str]
  seed: int
  allowed_changes: frozenset[str]  # the `resume_policy.SWITCHES` that are on
  config_json: dict[str, Any] = dataclasses.field(repr=False, compare=False)  # config.json
  # The dataset's class names (saved beside config.json); None where the data does not
  # name them or was not opened (planning).
  class_names: Optional[tuple[str, ...]] = dataclasses.field(default=None, repr=False)

  @property
  def batch(self) -> int:
    return self.data.batch

  @property
  def crop(self) -> int:
    return self.data.crop

  def data_identity(self) -> dict[str, Any]:
    """What the run trains on, stored with every checkpoint and compared on resume: the
    keys `resume_policy` records there."""
    values = {**dataclasses.asdict(self.data), "num_train": self.num_train, "seed": self.seed}
    keys = {rule.key: values[rule.key] for rule in resume_policy.rules(resume_policy.CHECKPOINT)}
    text = self.data.text
    return {**keys, resume_policy.TOKENIZER: text.identity()} if text is not None else keys

  def with_model(self, **changes: Any) -> "RunSpec":
    """This run with model fields changed (e.g. ``remat=True``)."""
    return dataclasses.replace(self, model=self.model.replace(**changes))
