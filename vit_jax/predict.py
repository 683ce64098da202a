r"""Classifies image files with a trained model, or scores them against texts.

    python -m vit_jax.predict --checkpoint=PATH [--model=NAME] [--labels=imagenet2012|FILE] \
        [--top_k=5] [--resolution=R | --seq_len=N] [--json] IMAGE_OR_FOLDER...
    python -m vit_jax.predict --checkpoint=TWO_TOWER --texts="a dog,a cat" [--texts_file=F] ...

With texts, an image-text checkpoint (a contrastive run, a transformers SigLIP, SigLIP 2
or CLIP folder) prints every text's probability for each image, most probable first, as
transformers' zero-shot pipeline reports them (`vit_jax.api.text_scores`: SigLIP's sigmoid per
text, CLIP's softmax over the texts).

PATH: an official-layout `.npz`, a training run (workdir, `checkpoints/` or a step
folder), a Hugging Face or timm checkpoint, `hf-hub:<org>/<name>` or an official name
such as `ViT-B_16` (`vit_jax.weights.sources`); PATH and the images may be on a bucket
(gs://, no TensorFlow needed). Images are prepared
as the checkpoint says (`vit_jax.data.host_images.prepare` with its data config: timm's
crop fraction and interpolation, a transformers image processor's resize and crop, or
the official recipe of the eval pipeline, the whole image resized bilinearly to [-1, 1])
and classified in jitted batches. Every file is checked before it is opened
(`vit_jax.infra.input_files`): a named path that does not exist or is no regular file (a FIFO,
a device) is an error (`vit_jax.cli`: one line, exit status 2); inside a folder such a
file, one larger than `input_files.MAX_IMAGE_BYTES`, one that `image_header.decodable`
refuses (more than `image_header.MAX_DECODED_BYTES` decoded bytes by its header, read
before anything is decoded; only a GIF's first frame is decoded) or one that does not
decode is skipped, and one warning at the end names the files skipped. When no file
at all is readable, that is the error.
With ``--seq_len``, a ViT whose learned position table can be resized (a NaFlex tower, or
any plain ViT) reads each image at its own aspect ratio, resized to the largest patch
grid within that many patches (`vit_jax.data.naflex_images`) instead of a square crop.
Output: one line per image, ``FILE<TAB>label:probability ...``, or JSON lines; names and
labels with control characters are printed escaped (`vit_jax.infra.printable`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Iterable, Iterator, Optional, Sequence

from vit_jax import cli  # isort: skip  (first: it sets TensorFlow's log level before it loads)
import jax
import numpy as np
from absl import flags, logging

from vit_jax import models
from vit_jax.api import model as model_lib
from vit_jax.api import text_scores
from vit_jax.data import filesystems, image_header
from vit_jax.infra import errors, input_files, storage
from vit_jax.infra.printable import printable
from vit_jax.weights import sources

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")  # what decode_rgb reads
DEFAULT_BATCH = 32
MAX_BATCH = 4096  # images per jitted batch: [4096, 224, 224, 3] float32 is 2.3 GiB
_LISTED_SKIPS = 5  # files named in the one warning (or error) about skipped files


@dataclasses.dataclass(frozen=True)
class Prediction:
  path: str
  top: list[tuple[str, float]]  # (label, probability), most probable first

  def line(self) -> str:
    top = " ".join(f"{printable(label)}:{p:.4f}" for label, p in self.top)
    return printable(self.path) + "\t" + top

  def json(self) -> str:
    return json.dumps(
      {
        "file": self.path,
        "top_k": [{"label": label, "probability": round(p, 6)} for label, p in self.top],
      }
    )


def image_files(paths: Iterable[str]) -> list[str]:
  """The files named, and the image files under each folder named (sorted, recursive); a
  `MissingError` for a path that does not exist, or when there is no image at all, an
  `InputFileError` for a path named that is neither a folder nor a regular file. A file
  found in a folder is checked when it is read (`Classifier.prepare`). A path may be on a
  bucket (gs://: `vit_jax.data.filesystems`)."""
  paths = list(paths)
  missing = [path for path in paths if not filesystems.exists(path)]
  if missing:
    raise errors.MissingError(
      f"{printable(', '.join(missing))}: no such file or folder (name image files or folders)."
    )
  files = []
  for path in paths:
    if not filesystems.isdir(path):
      if input_files.is_local(path):
        input_files.regular_file(path, None, what="image")
      files.append(path)
    elif not input_files.is_local(path):
      files.extend(_bucket_images(path))
    else:
      for root, dirs, names in os.walk(path):
        dirs.sort()
        files.extend(
          os.path.join(root, n) for n in sorted(names) if n.lower().endswith(IMAGE_EXTENSIONS)
        )
  if not files:
    raise errors.MissingError(
      f"No image files in {printable(str(paths))} (extensions {', '.join(IMAGE_EXTENSIONS)})."
    )
  return files


def _bucket_images(folder: str) -> list[str]:
  """The image files under the bucket's ``folder`` (recursive), sorted: gs:// URLs."""
  fs = storage.filesystem(folder)
  with storage.errors_as_one_line(folder, "Listing"):
    found = fs.find(folder)
  return sorted(fs.unstrip_protocol(p) for p in found if p.lower().endswith(IMAGE_EXTENSIONS))


def read_image(path: str) -> bytes:
  """The bytes of image file ``path``, ready to decode (`image_header.decodable`: the first
  frame only, its decoded bytes bounded from the header); a ValueError saying why when it
  is no regular file, larger than `input_files.MAX_IMAGE_BYTES` or no image to decode.
  On a bucket: the object's bytes, within the same bound."""
  if not input_files.is_local(path):
    data = filesystems.read_head(path, input_files.MAX_IMAGE_BYTES + 1)
    if len(data) > input_files.MAX_IMAGE_BYTES:
      raise ValueError(f"more than {input_files.MAX_IMAGE_BYTES:,} bytes")
    return image_header.decodable(data)
  why = input_files.not_regular(path)
  if why:
    raise ValueError(why)
  size = os.stat(path).st_size
  if size > input_files.MAX_IMAGE_BYTES:
    raise ValueError(f"{size:,} bytes, more than {input_files.MAX_IMAGE_BYTES:,}")
  with open(path, "rb") as f:
    return image_header.decodable(f.read(input_files.MAX_IMAGE_BYTES))


class Classifier:
  """A loaded model's probabilities for batches of files: a `vit_jax.Model` (one jitted
  function over full batches) and its `prepare`, with the files skipped and why."""

  def __init__(
    self,
    model: sources.LoadedModel,
    image_size: tuple[int, int],
    batch: int = DEFAULT_BATCH,
    seq_len: Optional[int] = None,
  ):
    self.skipped: list[tuple[str, str]] = []  # (path, why) of the files not classified
    self.seq_len = seq_len  # NaFlex inputs of that many patches (`Model.prepare`)
    if image_size[0] != image_size[1]:
      raise errors.CommandLineError(
        f"Image size {image_size} is not square; the eval pipeline resizes to "
        "a square: pass --resolution."
      )
    self.image_size = image_size
    self.batch = batch
    module = model.module()  # a size the model cannot take fails here, with the fix
    getattr(module, "img", module).grid_hw(image_size)  # a two-tower model: its image tower
    loaded = dataclasses.replace(model, params=jax.device_put(model.params), image_size=image_size)
    self._model = model_lib.Model(loaded, batch_size=batch)

  def prepare(self, path: str) -> Optional[Any]:
    """float32 [H, W, 3] normalised for the model, or its NaFlex patches (`Model.prepare`),
    or None (added to `skipped`) when the file is not an image to decode (`read_image`)
    or cannot be decoded."""
    try:
      return jax.tree.map(lambda a: a[0], self._model.prepare(read_image(path), self.seq_len))
    except (ValueError, OSError) as e:
      why = str(e).strip().splitlines()[0]
    self.skipped.append((path, why))
    return None

  def skipped_message(self) -> str:
    """The files skipped and why (the first few), for one warning or error."""
    listed = "; ".join(f"{printable(path)} ({why})" for path, why in self.skipped[:_LISTED_SKIPS])
    more = len(self.skipped) - _LISTED_SKIPS
    return listed + (f"; and {more} more" if more > 0 else "")

  def full_batch(self, images: Any) -> Any:
    """[N, ...] inputs (an array or NaFlex patches) padded with zeros to the batch size:
    every call runs full batches (one compilation)."""
    return jax.tree.map(
      lambda a: np.concatenate([a, np.zeros((-len(a) % self.batch, *a.shape[1:]), a.dtype)]),
      images,
    )

  def probabilities(self, images: Any) -> np.ndarray:
    """[N, H, W, 3] (or NaFlex patches of N images) -> [N, K]."""
    n = len(jax.tree.leaves(images)[0])
    return np.asarray(jax.nn.softmax(self._model(self.full_batch(images)), axis=-1))[:n]

  def classify(self, paths: Sequence[str]) -> Iterator[tuple[str, np.ndarray]]:
    """(path, probabilities [K]) of every readable file, in order, batch by batch."""
    for start in range(0, len(paths), self.batch):
      chunk = [(p, self.prepare(p)) for p in paths[start : start + self.batch]]
      chunk = [(p, x) for p, x in chunk if x is not None]
      if chunk:
        probs = self.probabilities(jax.tree.map(lambda *a: np.stack(a), *[x for _, x in chunk]))
        yield from zip([p for p, _ in chunk], probs)


class TextClassifier(Classifier):
  """An image-text model's probabilities of ``texts`` (`text_scores.TextScores`) for
  batches of files."""

  def __init__(
    self, model: sources.LoadedModel, image_size: tuple[int, int], texts: Sequence[str],
    batch: int = DEFAULT_BATCH, seq_len: Optional[int] = None,
  ):  # fmt: skip
    super().__init__(model, image_size, batch, seq_len)
    self._scores = text_scores.TextScores(model, texts)

  def probabilities(self, images: Any) -> np.ndarray:
    """[N, H, W, 3] (or NaFlex patches of N images) -> [N, T]."""
    n = len(jax.tree.leaves(images)[0])
    return self._scores(self.full_batch(images))[:n]


def top_k(probs: np.ndarray, names: Sequence[str], k: int) -> list[tuple[str, float]]:
  order = np.argsort(-probs, kind="stable")[:k]
  return [(names[i], float(probs[i])) for i in order]


def predict(
  checkpoint: str,
  inputs: Sequence[str],
  *,
  model_name: Optional[str] = None,
  labels: Optional[str] = None,
  k: int = 5,
  resolution: Optional[int] = None,
  batch: int = DEFAULT_BATCH,
  texts: Optional[Sequence[str]] = None,
  seq_len: Optional[int] = None,
) -> Iterator[Prediction]:
  """Top-``k`` predictions for every readable image among ``inputs`` (files, folders),
  or with ``texts`` every text's probability; the files skipped get one warning at the
  end, and none readable is an error. ``seq_len``: each image at its own aspect ratio in
  that many patches (NaFlex inputs) instead of the square crop."""
  check_counts(k=k, batch=batch, seq_len=seq_len)
  files = image_files(inputs)  # before the model: a wrong path fails at once
  model = sources.load(checkpoint, model_name)
  if texts or models.is_two_tower(model.config):
    if not texts:
      raise errors.CommandLineError(
        f"{checkpoint!r} is an image-text model: pass --texts='a dog,a cat' (or "
        "--texts_file) to score images against them."
      )
    size = model.image_size_for(resolution, argument="--resolution")
    classifier = TextClassifier(model, size, texts, min(batch, len(files)), seq_len)
    yield from _predictions(classifier, files, list(texts), len(texts))
    return
  if not model.num_classes:
    raise errors.CheckpointError(f"{checkpoint!r} has no classification head: nothing to predict.")
  if k > model.num_classes:
    raise errors.CommandLineError(
      f"--top_k={k} is more than the {model.num_classes} classes of {checkpoint!r}: use "
      f"--top_k={model.num_classes} or fewer."
    )
  names = model.class_names_for(labels, argument="--labels")
  size = model.image_size_for(resolution, argument="--resolution")
  classifier = Classifier(model, size, min(batch, len(files)), seq_len)
  yield from _predictions(classifier, files, names, k)


def _predictions(
  classifier: Classifier, files: Sequence[str], names: Sequence[str], k: int
) -> Iterator[Prediction]:
  """The top-``k`` of ``names`` for every readable file; the skipped ones warned of."""
  printed = 0
  for path, probs in classifier.classify(files):
    printed += 1
    yield Prediction(path, top_k(probs, names, k))
  if not printed:
    raise errors.InputFileError(
      f"None of the {len(files)} image files is readable: {classifier.skipped_message()}."
    )
  if classifier.skipped:
    logging.warning(
      "Skipped %d of %d files, not readable images: %s.",
      len(classifier.skipped),
      len(files),
      classifier.skipped_message(),
    )


def check_counts(*, k: int, batch: int, seq_len: Optional[int] = None) -> None:
  """--top_k, --batch and --seq_len within their bounds (the class count is checked with
  the model)."""
  if k < 1:
    raise errors.CommandLineError(f"--top_k={k} must be at least 1 (classes printed per image).")
  if seq_len is not None and seq_len < 1:
    raise errors.CommandLineError(
      f"--seq_len={seq_len} must be at least 1 (patches per image, e.g. 256 or 576)."
    )
  if not 1 <= batch <= MAX_BATCH:
    raise errors.CommandLineError(
      f"--batch={batch} must be between 1 and {MAX_BATCH} (images per jitted batch)."
    )


def _parse(argv: Sequence[str]) -> dict[str, Any]:
  """The flag values and the images named; a `CommandLineError` for a bad command line."""
  flag_values = cli.new_flag_values()
  holders = dict(
    **cli.define_model_flags(flag_values),
    top_k=flags.DEFINE_integer("top_k", 5, "Classes printed per image.", flag_values=flag_values),
    batch=flags.DEFINE_integer(
      "batch", DEFAULT_BATCH, "Images per jitted batch.", flag_values=flag_values
    ),
    json=flags.DEFINE_bool(
      "json", False, "JSON lines instead of text lines.", flag_values=flag_values
    ),
    texts=flags.DEFINE_string(
      "texts", None, "Comma-separated texts to score each image against (an image-text "
      "checkpoint); every text is printed, most probable first.", flag_values=flag_values,
    ),
    texts_file=flags.DEFINE_string(
      "texts_file", None, "A file of texts, one per line (with or instead of --texts).",
      flag_values=flag_values,
    ),
    seq_len=flags.DEFINE_integer(
      "seq_len", None, "NaFlex: each image at its own aspect ratio in at most this many "
      "patches (e.g. 256, 576) instead of the square crop.", flag_values=flag_values,
    ),
  )  # fmt: skip
  values = cli.parse_command_flags(
    flag_values, argv, holders, ("checkpoint",), __doc__, positional="inputs"
  )
  if not values["inputs"]:
    raise errors.CommandLineError("Name at least one image file or folder.")
  return values


def _print_predictions(values: dict[str, Any]) -> None:
  """Prints a line per image for the parsed command line."""
  for prediction in predict(
    values["checkpoint"],
    values["inputs"],
    model_name=values["model"],
    labels=values["labels"],
    k=values["top_k"],
    resolution=values["resolution"],
    batch=values["batch"],
    texts=text_scores.texts_from(values["texts"], values["texts_file"]),
    seq_len=values["seq_len"],
  ):
    print(prediction.json() if values["json"] else prediction.line(), file=sys.stdout, flush=True)


def main(argv: Sequence[str]) -> int:
  """The command, callable in-process (`vit_jax.cli`): parses ``argv`` (argv[0]: the
  program), prints a line per image; the exit status."""
  return cli.run_command(argv, _parse, _print_predictions)


if __name__ == "__main__":
  cli.exit_with(main(sys.argv))
