"""Any weights source -> one `LoadedModel` (config, parameters, classes, image size).

Sources, told apart by what is on disk (hub names are fetched first, `vit_jax.weights.hub`):
  * an official-layout `.npz` (per-layer or scanned): the architecture from ``model_name``
    or inferred from the array shapes (`vit_jax.weights.architecture`); the official LiT
    image-text layout with its vocabulary beside it (`vit_jax.weights.lit_npz`);
  * a training run of this package: its workdir, `<workdir>/checkpoints` or one step
    folder; model, image size and class names come from the run's `config.json`;
  * a Hugging Face `ViTForImageClassification` / `ViTModel` directory (`vit_jax.weights.hf`);
  * a transformers `SiglipModel`, `Siglip2Model` or `CLIPModel` directory, both towers and
    the tokenizer (`vit_jax.weights.hf_two_tower`);
  * a timm checkpoint: a `.safetensors` file, or a folder with `model.safetensors` and
    timm's `config.json` or our export's `timm_model.json` (`vit_jax.weights.timm.folder`);
  * ``hf-hub:<org>/<name>[@revision]`` (a transformers or a timm repository) and the
    official names (``ViT-B_16``, AugReg file stems): the hub copy, through its cache.
Pickles (`.bin`, `.pth`, ...) are refused unread: unpickling runs arbitrary code.

The model config records the GELU the source library computes on the weights (exact for
transformers' ``gelu`` and timm's default), so the loaded model gives the source's logits.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import os
import shlex
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from absl import logging

from vit_jax import errors, input_files, models
from vit_jax.aliases import Params
from vit_jax.data import data_config as data_config_lib
from vit_jax.paths import CONFIG_FILE, RunPaths, as_path
from vit_jax.weights import architecture, hf_two_tower, hub, lit_npz, npz, orbax_steps

_MAX_ERROR_LINES = 20  # of check_tree's list of differences
_PICKLES = (".bin", ".pth", ".pt", ".ckpt", ".pkl", ".pickle")
_SAFETENSORS = ".safetensors"
_UNSIZED_INPUT = (224, 224)  # the data config's input size where a source says none
IMAGENET2012 = "imagenet2012"  # the ``labels`` value of the class names shipped with the package
_IMAGENET2012_FILE = "imagenet2012_labels.txt"  # in vit_jax/data, class-index order


@dataclasses.dataclass
class LoadedModel:
  """A model ready to run: per-layer float parameters and what is known about them."""

  config: ml_collections.ConfigDict  # model config (`vit_jax.models.variants` layout)
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
    if self.data_config is None:
      config = models.with_family_defaults(self.config)
      self.data_config = data_config_lib.official(
        self.image_size or _UNSIZED_INPUT, tuple(config.input_mean), tuple(config.input_std)
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
  """Reads a model from ``path`` (any source of the module docstring); ``model_name`` (an
  official variant) overrides the architecture of an `.npz`. Raises FileNotFoundError when
  there is nothing to read and ValueError when the arrays do not fit the architecture."""
  source = str(path)
  location = _local(path)  # also a file:// URL, an epath.Path, gs://
  path = os.fspath(location)
  if reader := _reader(path):
    config, params, names, image_size = reader(path)
    loaded = LoadedModel(
      config, params, architecture.num_classes(params), image_size, names, source
    )
    if not _official_name(source):  # an official name keeps the official recipe
      loaded.data_config = _folder_data_config(path, config, image_size or _UNSIZED_INPUT)
    if hf_two_tower.model_type(path):
      loaded.tokenizer = hf_two_tower.read_tokenizer(path)
  elif location.is_dir():
    loaded = _load_run(path)
  elif location.is_file():
    loaded = _load_npz(path, model_name)
  else:
    raise errors.MissingError(
      f"No checkpoint at {path!r}: pass an official-layout .npz, a "
      "training run's workdir (or its checkpoints/ or a step folder), "
      "a Hugging Face or timm checkpoint (folder or .safetensors), hf-hub:<org>/<name> "
      "or an official name such as ViT-B_16."
    )
  _check_fits(loaded)
  return loaded


def check_source(source: str, *, fetch: bool) -> None:
  """Fails before a run compiles anything when ``source`` (``config.pretrained``) is not
  there. ``fetch``: a hub source is fetched now (found in the Hugging Face cache or
  downloaded; offline and not cached, one error line), so that a run learns in seconds
  what it would otherwise learn after compiling its steps; without it (a plan, which reads
  no weights) only the name is checked and nothing touches the network."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (gs:// paths)

  if hub.is_hub_source(source):
    if fetch:
      hub.resolve(source)  # the cached folder, reused when the run reads the weights
    return
  if not tf.io.gfile.exists(source):
    hub.resolve(source)  # an official name without a hub copy: that error
    raise errors.MissingError(
      f"config.pretrained={source!r} does not exist: give an official .npz file, a run's "
      "<workdir>/checkpoints folder, a Hugging Face or timm checkpoint, hf-hub:<org>/<name> "
      "or an official name such as ViT-B_16."
    )


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


# A transformers or timm reader: path -> (config, params, class names, image size).
Reader = Callable[
  [str], tuple[ml_collections.ConfigDict, Params, Optional[list[str]], Optional[tuple[int, int]]]
]


def _reader(path: str) -> Optional[Reader]:
  """The reader of a transformers or timm checkpoint at ``path``; None for other sources."""
  from vit_jax.weights import expressible, hf  # pylint: disable=g-import-not-at-top
  from vit_jax.weights.timm import folder as timm_folder  # pylint: disable=g-import-not-at-top

  if path.endswith(_SAFETENSORS) and os.path.isfile(path):
    directory = os.path.dirname(path)
    expressible.check_transformers_dir(directory)
    return (lambda _: hf.read_dir(directory)) if hf.is_hf_dir(directory) else timm_folder.read
  if os.path.isdir(path):
    expressible.check_transformers_dir(path)
    if hf_two_tower.model_type(path):
      return hf_two_tower.read_dir
    if hf.is_hf_dir(path):
      return hf.read_dir
    if timm_folder.is_timm_dir(path):
      return timm_folder.read
  return None


def _official_name(source: str) -> bool:
  """Whether ``source`` names an official checkpoint (read from its hub copy, whose timm
  config states timm's eval crop rather than the paper's whole-image resize)."""
  return not os.path.exists(source) and hub.official_copy(source) is not None


def _folder_data_config(
  path: str, config: ml_collections.ConfigDict, image_size: tuple[int, int]
) -> data_config_lib.DataConfig:
  """The preprocessing a transformers folder's image processor or a timm config states."""
  from vit_jax.weights import hf  # pylint: disable=g-import-not-at-top
  from vit_jax.weights.timm import folder as timm_folder  # pylint: disable=g-import-not-at-top

  directory = path if os.path.isdir(path) else os.path.dirname(path)
  if hf_two_tower.model_type(directory):
    return hf_two_tower.read_data_config(directory, config, image_size)
  if hf.is_hf_dir(directory):
    return hf.read_data_config(directory, config, image_size)
  return timm_folder.read_data_config(directory, config, image_size)


def is_hf_or_timm(path: str | os.PathLike) -> bool:
  """Whether ``path`` is a transformers or timm checkpoint (a folder or `.safetensors`)."""
  return _reader(os.fspath(path)) is not None


def read_params(source: str | os.PathLike) -> tuple[Params, Optional[ml_collections.ConfigDict]]:
  """The parameter tree of any source, for fine-tuning, and its model config where the
  source has one. `.npz` files and Orbax folders are read as stored (either encoder
  layout; an Orbax folder needs no config.json); the rest as `load` reads them."""
  location = _local(source)
  path = os.fspath(location)
  if is_hf_or_timm(path):
    loaded = load(path)
    return loaded.params, loaded.config
  if location.is_dir():
    return orbax_steps.read_params(path), None
  return npz.load_npz(path), None


def _load_npz(path: str, model_name: Optional[str]) -> LoadedModel:
  params = npz.scanned_to_layers(npz.load_npz(path))
  saved = os.path.isfile(npz.config_path(path))  # our export's model config beside it
  if lit_npz.is_lit(params) and not model_name and not saved:  # models_lit's layout
    config, params = lit_npz.read(params, repr(path))
    size = architecture.trained_image_size(params["img"], config.image)
    tokenizer = lit_npz.read_tokenizer(path)
    return LoadedModel(config, params, None, size, None, path, tokenizer=tokenizer)
  saved_data = None
  if model_name:
    config = models.get_model_config(model_name)
    # The registry leaves it out; official ImageNet-21k files have one.
    if "pre_logits" in params:
      config.representation_size = params["pre_logits"]["kernel"].shape[-1]
    config.classifier = "token" if "cls" in params else "gap"
  elif os.path.isfile(npz.config_path(path)):
    config, saved_data = _saved_config(npz.config_path(path))
  else:
    config = architecture.infer_model_config(params)
    logging.info("%s: inferred architecture %s.", path, config.name)
  tokenizer = None
  if models.family_of(config).name == models.image_text.TWO_TOWER:  # our image-text export
    size = architecture.trained_image_size(params["img"], config.image)
    tokenizer = _beside_tokenizer(os.path.dirname(path))
  else:
    size = architecture.trained_image_size(params, config)
  loaded = LoadedModel(
    config, params, architecture.num_classes(params), size, None, path, tokenizer=tokenizer
  )
  if saved_data is not None:
    loaded.data_config = data_config_lib.from_dict(saved_data, repr(npz.config_path(path)))
  return loaded


def _beside_tokenizer(directory: str) -> Any:
  """The transformers tokenizer files an image-text `.npz` export copied beside it, if any."""
  from vit_jax.data import folder_tokenizer  # pylint: disable=g-import-not-at-top

  if not os.path.isfile(os.path.join(directory, folder_tokenizer.CONFIG)):
    return None
  return folder_tokenizer.read_folder_tokenizer(directory)


def _saved_config(path: str) -> tuple[ml_collections.ConfigDict, Optional[dict[str, Any]]]:
  """The model config `npz.save_npz` wrote beside an archive (checked by the fit check)
  and the data config saved in it (None in files written before it was)."""
  try:
    saved = json.loads(input_files.read_text(path, what="model config"))
  except json.JSONDecodeError as e:
    raise errors.CheckpointError(
      f"{path!r} is not JSON ({e.msg}, line {e.lineno}): remove it to infer the model from "
      "the arrays, or write it again with the archive."
    ) from None
  if not isinstance(saved, dict) or not isinstance(saved.get("transformer", {}), dict):
    raise errors.CheckpointError(
      f"{path!r} is not a model config: remove it to infer the model from the arrays."
    )
  saved_data = saved.pop(npz.DATA_CONFIG_KEY, None)
  return ml_collections.ConfigDict(saved), saved_data


def _load_run(path: str) -> LoadedModel:
  run = RunPaths.containing(path)
  if run is None:
    raise errors.MissingError(
      f"{path!r} is a folder but neither a training run (no "
      f"{CONFIG_FILE} in it or up to two levels above) nor a Hugging Face "
      "ViT directory (config.json with model_type 'vit')."
    )
  run_config, crop = run_model_config(run)
  names = run.read_class_names()
  source = run.checkpoint_source(path)
  params = npz.scanned_to_layers(nn.unbox(dict(orbax_steps.read_params(source))))
  config = run_config.model
  config.scan = False  # the parameters are per-layer now
  return LoadedModel(
    config,
    params,
    architecture.num_classes(params),
    (crop, crop),
    names,
    path,
    run_config,
    data_config_lib.from_run_config(run_config),
    _run_tokenizer(run_config, names),
  )


def _run_tokenizer(run_config: ml_collections.ConfigDict, names: Optional[list[str]]) -> Any:
  """The tokenizer of a two-tower run's captions, as the run read them (the one rule,
  `data.caption_settings`): its data's own captions' (``config.text.tokenizer``), else the
  word tokenizer of its class names in its templates; None for an image model."""
  from vit_jax.data import caption_settings  # pylint: disable=g-import-not-at-top

  if not models.is_two_tower(run_config.model):
    return None
  return caption_settings.CaptionSettings.from_config(run_config).load_tokenizer(names)


def run_model_config(run: RunPaths) -> tuple[ml_collections.ConfigDict, int]:
  """A run's saved config and its crop, checked to hold a model (an object) and a
  positive integer ``pp.crop``: what the read-only commands use of it (its data settings
  are never used: nothing is built, written or fetched because of them)."""
  saved = run.read_config()
  pp = saved.get("pp")
  crop = pp.get("crop") if isinstance(pp, dict) else None
  if not isinstance(saved.get("model"), dict) or not isinstance(crop, int) or crop < 1:
    raise errors.CheckpointError(
      f"{run.config_path} is not a run config this package wrote: it needs a 'model' "
      f"object and a positive integer 'pp.crop' (model: {type(saved.get('model')).__name__}, "
      f"pp.crop: {crop!r}). Fix it, or put back the config.json the run wrote."
    )
  return ml_collections.ConfigDict(saved), crop


def _check_fits(loaded: LoadedModel) -> None:
  """One ValueError listing every array that does not fit the architecture."""
  module = loaded.module()
  size = loaded.image_size or module.input_stride
  dummy = jax.ShapeDtypeStruct((1, *size, 3), jnp.float32)
  init = lambda x: module.init(jax.random.PRNGKey(0), x)
  if models.family_of(loaded.config).name == models.image_text.TWO_TOWER:
    ids = jnp.zeros((1, loaded.config.text_len), jnp.int32)
    init = lambda x: module.init(jax.random.PRNGKey(0), x, ids)
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
