"""What a resumed run may change: one table, read by both resume checks, shown in the docs.

A resumed run is compared with what the run recorded, in one of two places:

* `config.json`, written once by the run that started the folder: what the checkpoints
  were built for (model, classes, preprocessing) and the schedule
  (`vit_jax.run.folder.RunFolder.check_config`);
* each checkpoint step's meta (`RunSpec.data_identity`): the data and its order, stored
  per step, so that a change a switch allowed holds from the step it was made at
  (`vit_jax.run.checkpoints.check_resume`).

A changed key is an error (both values named, nothing written), a warning, or allowed by
its ``config.allow_changed_*`` switch (an error without it). Other keys may change; every
change is appended to `config_history.jsonl`. docs/architecture.md shows `markdown()`
(tests/test_run_spec.py keeps the two equal).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Collection, Literal, Mapping, Optional

from vit_jax.infra import errors, paths

ERROR, WARNING, SWITCH = "error", "warning", "switch"
CONFIG_JSON, CHECKPOINT = paths.CONFIG_FILE, "checkpoint"

OnChange = Literal["error", "warning", "switch"]
RecordedIn = Literal["config.json", "checkpoint"]


@dataclasses.dataclass(frozen=True)
class Rule:
  """What a resume with another value of ``key`` does, and why."""

  key: str  # a config key; `num_train` is the size of config.train_split
  on_change: OnChange
  recorded_in: RecordedIn
  why: str
  switch: Optional[str] = None  # the config switch that allows the change (SWITCH only)


_ORDER = "the data order from the resumed step on"
RULES: tuple[Rule, ...] = (
  Rule("model", ERROR, CONFIG_JSON, "the checkpoints hold this model's arrays"),
  Rule("num_classes", ERROR, CONFIG_JSON, "the head's shape"),
  Rule("pp", ERROR, CONFIG_JSON, "the crop and augmentation the model was trained at"),
  Rule("dataset", ERROR, CHECKPOINT, "another dataset is another run"),
  Rule("train_split", ERROR, CHECKPOINT, "other training examples"),
  Rule("test_split", ERROR, CHECKPOINT, "evaluations would not compare"),
  Rule("label_key", ERROR, CHECKPOINT, "another label is another task (VTAB's CLEVR, dSprites)"),
  Rule("num_train", ERROR, CHECKPOINT, "the train split changed size: other examples"),
  Rule("seed", SWITCH, CHECKPOINT, _ORDER, "allow_changed_seed"),
  Rule("batch", SWITCH, CHECKPOINT, _ORDER, "allow_changed_batch"),
  Rule("shuffle_buffer", SWITCH, CHECKPOINT, _ORDER, "allow_changed_batch"),
  Rule("total_steps", WARNING, CONFIG_JSON, "the schedule"),
  Rule("lr", WARNING, CONFIG_JSON, "the schedule"),
  Rule(
    "optim",
    WARNING,
    CONFIG_JSON,
    "the update rule (one with other state arrays, e.g. sgd -> adam, fails the checkpoint's "
    "array check: an error)",
  ),
  Rule("accum_steps", WARNING, CONFIG_JSON, "the same update in other micro-batches"),
  Rule("mixup", WARNING, CONFIG_JSON, "the regularization of the steps still to run"),
  Rule("label_smoothing", WARNING, CONFIG_JSON, "the regularization of the steps still to run"),
)

SWITCHES: tuple[str, ...] = tuple(sorted({r.switch for r in RULES if r.switch}))


def rules(recorded_in: RecordedIn) -> tuple[Rule, ...]:
  """The rules whose key is compared with what ``recorded_in`` stores."""
  return tuple(r for r in RULES if r.recorded_in == recorded_in)


def is_error(rule: Rule, allowed: Collection[str]) -> bool:
  """Whether changing ``rule.key`` stops the resume, with the switches ``allowed`` on."""
  return rule.on_change == ERROR or (rule.on_change == SWITCH and rule.switch not in allowed)


def markdown() -> str:
  """The table as docs/architecture.md shows it."""
  verdict = {
    ERROR: "error",
    WARNING: "warning",
    SWITCH: "error, unless `config.{switch}=True`",
  }
  lines = [
    "| key | changed on resume | compared with | why |",
    "|---|---|---|---|",
    *(
      f"| `{r.key}` | {verdict[r.on_change].format(switch=r.switch)} | {r.recorded_in} | {r.why} |"
      for r in RULES
    ),
  ]
  return "\n".join(lines) + "\n"


# The captions' tokenizer (`data.CaptionSettings.identity`), stored with each checkpoint
# beside the keys of `RULES` and checked on its own: the text tower's embedding rows are
# the ids of the tokenizer it trained with, so another tokenizer (or text_len, or end
# token) is another run.
TOKENIZER = "tokenizer"


def check_tokenizer(stored: Mapping[str, Any], current: Mapping[str, Any], run: str) -> None:
  """Refuses, in one line, a resume whose tokenizer identity differs from the one the
  checkpoint of ``run`` (its folder and step) recorded; a checkpoint without one passes."""
  before, after = stored.get(TOKENIZER), current.get(TOKENIZER)
  if before is not None and after is not None and before != after:
    raise errors.ResumeError(
      f"The run in {run} trained with another tokenizer ({before} -> {after}): the text "
      "tower's ids would change meaning. Put config.text.tokenizer and config.model.text_len "
      "back as they were, or use a new --workdir; nothing was changed."
    )
