"""Any weights source -> one `LoadedModel` (config, parameters, classes, image size).

A source's format is found once (`vit_jax.weights.formats.locate`, the lookup every
command shares; hub names are fetched first, `vit_jax.weights.hub`), and its record reads it:
  * an official-layout `.npz` (per-layer or scanned): the architecture from ``model_name``,
    our export's config beside it, or the array shapes (`vit_jax.weights.npz`); the
    official LiT image-text layout with its vocabulary beside it (`vit_jax.weights.lit_npz`);
  * big_vision's `.npz` (SigLIP, SigLIP 2, its LiT and ViTs, released under ``params/``)
    with its SentencePiece model beside it (`vit_jax.weights.big_vision`);
  * a folder an npz or big_vision export wrote (`vit_jax.Model.save`, ``vit_jax.export``):
    its ``model.npz``, with the class names of its ``labels.txt``;
  * a training run of this package: its workdir, `<workdir>/checkpoints` or one step
    folder; model, image size and class names come from the run's `config.json`
    (`vit_jax.weights.run_checkpoint`);
  * a Hugging Face `ViTForImageClassification` / `ViTModel` directory (`vit_jax.weights.hf.vit`);
  * a transformers `SiglipModel`, `Siglip2Model` or `CLIPModel` directory, both towers and
    the tokenizer (`vit_jax.weights.hf.two_tower`);
  * a timm checkpoint: a `.safetensors` file, or a folder with `model.safetensors` and
    timm's `config.json` or our export's `timm_model.json` (`vit_jax.weights.timm.folder`);
  * ``hf-hub:<org>/<name>[@revision]`` (a transformers or a timm repository) and the
    official names (``ViT-B_16``, AugReg file stems): the hub copy, through its cache.
Pickles (`.bin`, `.pth`, ...) are refused unread: unpickling runs arbitrary code. Any of
these may be on a bucket (gs://): a run is read there, the others from a local copy
(`vit_jax.weights.remote`).

The model config records the GELU the source library computes on the weights (exact for
transformers' ``gelu`` and timm's default), so the loaded model gives the source's logits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.resources
import os
import shlex
from typing import Any, Iterator, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from absl import logging

from vit_jax import models
from vit_jax.data import data_config as data_config_lib
from vit_jax.data import filesystems
from vit_jax.infra import errors, input_files
from vit_jax.infra.aliases import Params
from vit_jax.infra.paths import as_path
from vit_jax.weights import architecture, formats, hub, npz, remote

_MAX_ERROR_LINES = 20  # of check_tree's list of differences
_PICKLES = (".bin", ".pth", ".pt", ".ckpt", ".pkl", ".pickle")
IMAGENET2012 = "imagenet2012"  # the ``labels`` value of the class names shipped with the package
_IMAGENET2012_FILE = "imagenet2012_labels.txt"  # in vit_jax/data, class-index order


@dataclasses.dataclass
class LoadedModel:
  """A model ready to run: per-layer float parameters and what is known about them."""

  # The model's typed settings (`models.model_settings`; a config in `variants.py`'s layout
  # is read into them here, once). `models.to_config` writes them back as config fields.
  config: models.Settings
  params: Params
  num_classes: Optional[int]  # None: no head, the output is the representation
  image_size: Optional[tuple[int, int]]  # what the position embeddings were trained for
  class_names: Optional[list[str]]  # None when the source does not name its classes
  source: str
  run_config: Optional[ml_collections.ConfigDict] = None  # a training run's saved config
  # How the source prepares its inputs; None: the official recipe at image_size with the
  # model config's mean and std (what every source meant before it was read).
  data_config: Optional[data_config_lib.DataConfig] = None
  # An image-text model's tokenizer (`vit_jax.data.text_tokenizer.Tokenizer`): texts -> the ids
  # its text tower reads; None for image models.
  tokenizer: Optional[Any] = None

  def __post_init__(self) -> None:
    self.config = models.model_settings(self.config)
    if self.data_config is None:
      self.data_config = data_config_lib.official(
        self.image_size or formats.UNSIZED_INPUT, self.config.input_mean, self.config.input_std
      )

  def module(self, **overrides: Any) -> models.VisionTransformer:
    """The Flax module of these parameters; ``overrides`` are `create_model`'s arguments:
    ``num_classes=5`` a new head (train it: the parameters have none of that size),
    ``num_classes=0`` or None no head (the pre-logits features, as timm's 0)."""
    kwargs = {"num_classes": self.num_classes, **overrides}
    kwargs["num_classes"] = kwargs["num_classes"] or None
    return models.create_model(self.config, **kwargs)

  # The two facts a command asks of a loaded model given its --labels and --resolution;
  # ``argument`` is how an error names the value: a command passes its flag.

  def class_names_for(self, labels: Optional[str] = None, *, argument: str = "labels") -> list[str]:
    """A name per class of the head: ``labels`` (`IMAGENET2012` or a file of one name per
    line), else the source's own names (a training run's: its dataset's), else ImageNet-1k's
    for a 1,000-class head, else the class indices."""
    k = self.num_classes or 0
    if labels == IMAGENET2012:
      names = imagenet2012_class_names()
    elif labels:
      if not os.path.isfile(labels):
        raise errors.MissingError(
          f"{argument}={labels!r} is neither {IMAGENET2012!r} nor a file of class names "
          "(one per line)."
        )
      text = input_files.read_text(labels, what=f"{argument} file")
      names = [line.rstrip("\r") for line in text.split("\n") if line.strip()]
    elif self.class_names:
      names = list(self.class_names)
    elif self.run_config is not None:
      # A run that saved no class names (it predates them): its dataset is not opened (a
      # read-only caller never builds or fetches data).
      logging.warning(
        "The run %s saved no class names (made before runs saved them): using class "
        "indices; pass %s=FILE to name them.",
        self.source,
        argument,
      )
      return [str(i) for i in range(k)]
    elif k == 1000:
      names = imagenet2012_class_names()
    else:
      return [str(i) for i in range(k)]
    if len(names) != k:
      raise errors.ConfigError(
        f"{len(names)} class names for a head of {k} classes: pass {argument} "
        "with one name per class of the model."
      )
    return names

  def image_size_for(
    self, resolution: Optional[int] = None, *, argument: str = "resolution"
  ) -> tuple[int, int]:
    """The input size: ``resolution`` (square), else the size the model was trained for;
    a resolution that learned position embeddings were not trained for is an error."""
    trained = self.image_size
    if resolution is not None and resolution < 1:
      raise errors.ConfigError(f"{argument}={resolution} must be a positive image size.")
    if resolution:
      learned = self.config.get("posemb", "learn") in ("learn", "learn_2d")
      if learned and trained and trained != (resolution, resolution):
        raise errors.ConfigError(
          f"{argument}={resolution}, but {self.source!r} has position embeddings for "
          f"{trained[0]}x{trained[1]}: leave {argument} out, or fine-tune at the new size "
          "first (config.pretrained resizes them)."
        )
      return resolution, resolution
    if trained is None:
      raise errors.ConfigError(
        f"{self.source!r} does not say its image size (no learned position embeddings): "
        f"pass {argument}."
      )
    return trained


def imagenet2012_class_names() -> list[str]:
  """The 1,000 ImageNet-1k class names shipped with the package, in class-index order."""
  text = importlib.resources.files("vit_jax.data").joinpath(_IMAGENET2012_FILE).read_text()
  return text.splitlines()


def load(path: str | os.PathLike, model_name: Optional[str] = None) -> LoadedModel:
  """Reads a model from ``path`` (any source of the module docstring) through its format's
  record (`formats.of`: found once); ``model_name`` (an official variant) overrides the
  architecture of an `.npz`. Raises FileNotFoundError when there is nothing to read and
  ValueError when the arrays do not fit the architecture."""
  source = str(path)
  with readable(path) as path:  # also a file:// URL, an epath.Path, gs://
    found = formats.of(path)
    fmt, path = found.format, found.path
    loaded, read = _loaded(fmt, path, source, model_name)
    if not _official_name(source):  # an official name keeps the official recipe
      loaded.data_config = fmt.data_config(path, read) or loaded.data_config
    loaded.tokenizer = fmt.tokenizer(path, read)
    if found.labels and loaded.num_classes and not loaded.class_names:
      loaded.class_names = _export_labels(found.labels, loaded.num_classes)
  _check_fits(loaded)
  return loaded


def _export_labels(path: str, num_classes: int) -> Optional[list[str]]:
  """The class names an export wrote beside its archive (one a line); None when they do
  not name every class of the head (a file edited since)."""
  names = input_files.read_text(path, what="class names file").splitlines()
  return names if len(names) == num_classes else None


def check_source(source: str, *, fetch: bool) -> None:
  """Fails before a run compiles anything when ``source`` (``config.pretrained``) is not
  there. ``fetch``: a hub source is fetched now (found in the Hugging Face cache or
  downloaded; offline and not cached, one error line), so that a run learns in seconds
  what it would otherwise learn after compiling its steps; without it (a plan, which reads
  no weights) only the name is checked and nothing touches the network. A local path needs
  no TensorFlow, nor does a gs:// path (fsspec: `vit_jax.infra.storage`)."""
  if hub.is_hub_source(source):
    if fetch:
      hub.resolve(source)  # the cached folder, reused when the run reads the weights
    return
  if not filesystems.exists(source):
    hub.resolve(source)  # an official name without a hub copy: that error
    raise errors.MissingError(
      f"config.pretrained={source!r} does not exist: give an official .npz file, a run's "
      "<workdir>/checkpoints folder, a Hugging Face or timm checkpoint, hf-hub:<org>/<name> "
      "or an official name such as ViT-B_16."
    )


@contextlib.contextmanager
def readable(source: str | os.PathLike) -> Iterator[str]:
  """The local path to read for ``source`` (`_local`), a bucket's checkpoint copied for the
  block and a run's folder on a bucket as it is (`vit_jax.weights.remote.local_copy`)."""
  with remote.local_copy(_local(source)) as path:
    yield path


def _local(source: str | os.PathLike) -> Any:
  """The path to read: a hub source fetched (`vit_jax.weights.hub`), pickles refused."""
  if isinstance(source, str):
    source = hub.resolve(source)
  location = as_path(source)
  if os.fspath(location).lower().endswith(_PICKLES):
    code = (
      "import torch, safetensors.torch as st; "
      f"st.save_file(torch.load({os.fspath(location)!r}, weights_only=True), 'model.safetensors')"
    )
    raise errors.CheckpointError(
      f"{os.fspath(location)!r} is a pickle, which is not read (unpickling runs arbitrary "
      f"code): convert it to safetensors first, e.g. python -c {shlex.quote(code)}."
    )
  return location


def _loaded(
  fmt: formats.Format, path: str, source: str, model_name: Optional[str]
) -> tuple[LoadedModel, formats.Read]:
  """The model ``fmt`` reads at ``path`` (its preprocessing and tokenizer not read yet)."""
  read = fmt.read(path, model_name)
  num_classes = architecture.num_classes(read.params)
  loaded = LoadedModel(
    read.config, read.params, num_classes, read.image_size, read.class_names, source,
    read.run_config,
  )  # fmt: skip
  return loaded, read


def _official_name(source: str) -> bool:
  """Whether ``source`` names an official checkpoint (read from its hub copy, whose timm
  config states timm's eval crop rather than the paper's whole-image resize)."""
  return not os.path.exists(source) and hub.official_copy(source) is not None


def read_params(source: str | os.PathLike) -> tuple[Params, Optional[models.Settings]]:
  """The parameter tree of any source, for fine-tuning, and its model config where the
  source has one. `.npz` files and Orbax folders are read as stored (either encoder
  layout; an Orbax folder needs no config.json); the rest as `load` reads them."""
  with readable(source) as path:
    found = formats.of(path)
    fmt, path = found.format, found.path
    if fmt.read_tree is not None:
      return fmt.read_tree(path)
    loaded, _ = _loaded(fmt, path, str(source), None)
  _check_fits(loaded)
  return loaded.params, loaded.config


def _check_fits(loaded: LoadedModel) -> None:
  """One ValueError listing every array that does not fit the architecture."""
  module = loaded.module()
  size = loaded.image_size or module.input_stride
  dummy = jax.ShapeDtypeStruct((1, *size, 3), jnp.float32)
  inputs = models.family_of(loaded.config).inputs
  init = lambda x: module.init(jax.random.PRNGKey(0), *inputs(loaded.config, x))
  expected = jax.eval_shape(init, dummy)
  try:
    npz.check_tree(
      loaded.params, nn.unbox(expected["params"]), source=f"checkpoint {loaded.source!r}"
    )
  except ValueError as e:
    lines = str(e).splitlines()
    if len(lines) > _MAX_ERROR_LINES:
      lines = lines[:_MAX_ERROR_LINES] + [f"  ... and {len(lines) - _MAX_ERROR_LINES} more"]
    raise errors.CheckpointError(
      "\n".join(lines) + "\n  Fix: pass the checkpoint's model (--model=NAME) "
      "or leave it out to infer it from the array shapes."
    ) from None
