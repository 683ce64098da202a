"""Where a two-tower run's captions come from and the tokenizer that reads them, stated once.

`CaptionSettings.from_config(config)` is the rule: with ``config.text.tokenizer`` set, the
data's own captions (`free_text`), read with that tokenizer and ``config.text.eos``,
``lower`` and ``pad_id`` (big_vision's options, for a text tower trained by it);
otherwise captions made from the class names in ``config.contrastive.templates``
(`captions`), read with the word tokenizer built from them. Both have
``config.model.text_len`` tokens. The input pipeline (through the objective's data needs,
`settings.Needs`) and the loader of a finished run (`weights.sources`) both call it, so a
run is read back with the tokenizer it trained with.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import TYPE_CHECKING, Any, Optional, Sequence

if TYPE_CHECKING:
  from vit_jax.data.text_tokenizer import Tokenizer

# config.text.eos of `vit_jax.run.defaults` (and of a config.json written before the key):
# a SentencePiece model's encoder adds no end token.
DEFAULT_EOS = "none"
# config.text.lower: captions are not lower-cased (big_vision's SigLIP and LiT lower-case:
# set it to continue their text towers); config.text.pad_id None: the model's pad piece.
DEFAULT_LOWER = False
DEFAULT_IMAGE_FEATURE = "image"  # config.text.image_feature: a tfds dataset's image feature


@dataclasses.dataclass(frozen=True)
class CaptionSettings:
  """The captions of a run's batches ('text': int32 [B, text_len])."""

  text_len: int  # tokens per caption (config.model.text_len)
  templates: Optional[str] = None  # captions from the labels; None: the data's own
  tokenizer: Optional[str] = None  # the data's own captions' tokenizer (a path)
  eos: str = DEFAULT_EOS  # a SentencePiece model's end-token mode
  lower: bool = DEFAULT_LOWER  # a SentencePiece model's input lower-cased (ASCII letters)
  pad_id: Optional[int] = None  # a SentencePiece model's pad id (None: its pad piece)
  image_feature: str = DEFAULT_IMAGE_FEATURE  # a tfds dataset's features (text None: its
  text_feature: Optional[str] = None  # one text feature, `tfds_source`)

  @classmethod
  def from_config(cls, config: Any) -> "CaptionSettings":
    """The captions of a run config (a ConfigDict, or a run's saved config.json)."""
    text_len = int(config["model"]["text_len"])
    free = config.get("text") or {}  # absent from the config.json of older runs
    if not free.get("tokenizer"):
      return cls(text_len, templates=str(config["contrastive"]["templates"]))
    return cls(
      text_len,
      tokenizer=str(free["tokenizer"]),
      eos=str(free.get("eos", DEFAULT_EOS)),
      lower=bool(free.get("lower", DEFAULT_LOWER)),
      pad_id=None if free.get("pad_id") is None else int(free["pad_id"]),
      image_feature=str(free.get("image_feature", DEFAULT_IMAGE_FEATURE)),
      text_feature=free.get("text_feature"),
    )

  def identity(self) -> str:
    """The tokenizer as a resumed run must find it: a hash of its files' names and bytes
    (not their path: a moved copy is the same tokenizer) with ``text_len``, ``eos`` and the
    options set away from their defaults (so a run made before they existed keeps its
    identity); captions made from labels by their templates (the class names are the
    dataset's)."""
    options = f"text_len={self.text_len}"
    if self.tokenizer is None:
      return f"templates={self.templates} {options}"
    from vit_jax.data import tokenizer_kinds  # pylint: disable=g-import-not-at-top

    digest = hashlib.sha256()
    for file in tokenizer_kinds.files(self.tokenizer):
      digest.update(os.path.basename(file).encode() + b"\0")
      with open(file, "rb") as f:
        digest.update(f.read())
    options += f" eos={self.eos}"
    options += " lower=True" if self.lower != DEFAULT_LOWER else ""
    options += f" pad_id={self.pad_id}" if self.pad_id is not None else ""
    return f"sha256:{digest.hexdigest()[:16]} {options}"

  def load_tokenizer(self, class_names: Optional[Sequence[str]]) -> Optional[Tokenizer]:
    """The tokenizer of these captions: the data's own captions' (`free_text.load_tokenizer`),
    else the word tokenizer of ``class_names`` in the templates, built as the run built it
    (None without class names)."""
    # pylint: disable=g-import-not-at-top  (a tokenizer library, only where one is read)
    if self.tokenizer is not None:
      from vit_jax.data import free_text

      return free_text.load_tokenizer(
        self.tokenizer, self.eos, lower=self.lower, pad_id=self.pad_id
      )
    if not class_names:
      return None
    from vit_jax.data import captions

    return captions.Captions(class_names, self.templates, self.text_len).tokenizer
