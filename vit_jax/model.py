"""The Python face: one `Model` object for a loaded or a new model, as timm and
transformers users expect one.

    model = vit_jax.load("path/or/hf-hub:org/name")        # any weights source
    model = vit_jax.create("vit_tiny_patch16_224", num_classes=10)   # ours or timm's names
    x = model.prepare(["cat.jpg"])                  # [B, H, W, 3] as the checkpoint expects
    logits = model(x)                               # [B, K]
    model.predict(["cat.jpg"], top_k=5)             # [[(name, probability), ...], ...]
    model.features(x)                               # [B, D] pre-logits; pool=False: [B, N, D]
    model.rollout(x)                                # [B, gh, gw] attention rollout
    model.text_probabilities(["cat.jpg"], ["a cat", "a dog"])   # an image-text model's [B, T]
    model.with_head(5).at_resolution(384).save("out", format="timm")

Every array method runs one jitted function over fixed-size batches (``batch_size``), so
a long list compiles once. The names of the ecosystem are aliases: `from_pretrained` /
`create_model` (module level, `vit_jax`), `forward_features` and `save_pretrained`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import analysis, errors, models
from vit_jax.aliases import Params
from vit_jax.data.data_config import DataConfig
from vit_jax.weights import fit, npz, sources, writers
from vit_jax.weights.timm import create as timm_create

DEFAULT_BATCH = 32  # images per jitted call
DEFAULT_IMAGE_SIZE = 224  # `create`'s input size for a name that does not say one
DEFAULT_NUM_CLASSES = 1000  # `create`'s head, timm's default


class Model:
  """A model with its parameters and what is known of them (`weights.LoadedModel`):
  ``config``, ``params``, ``num_classes`` (None: no head), ``image_size``,
  ``class_names``, ``source``. Inputs of `__call__`, `features` and `attention` are model
  inputs, float32 [B, H, W, 3] as `prepare` makes them; `predict` takes images."""

  def __init__(self, loaded: sources.LoadedModel, *, batch_size: int = DEFAULT_BATCH):
    if batch_size < 1:
      raise errors.ConfigError(f"batch_size={batch_size} must be at least 1 (images per call).")
    self.loaded = loaded
    self.batch_size = batch_size
    self._compiled: dict[str, Callable[..., jax.Array]] = {}

  config = property(lambda self: self.loaded.config)
  params = property(lambda self: self.loaded.params)
  num_classes = property(lambda self: self.loaded.num_classes)
  image_size = property(lambda self: self.loaded.image_size)
  class_names = property(lambda self: self.loaded.class_names)
  source = property(lambda self: self.loaded.source)

  def __repr__(self) -> str:
    return (
      f"Model({self.config.get('name', 'custom')!r}, num_classes={self.num_classes}, "
      f"image_size={self.image_size}, source={self.source!r})"
    )

  @property
  def module(self) -> Any:
    """The Flax module of these parameters (``apply({'params': model.params}, x)``)."""
    return self.loaded.module()

  # ------------------------------------------------------------------ running the model

  def _run(self, kind: str, images: Any) -> np.ndarray:
    """``kind`` ('logits', 'pooled', 'tokens') of [B, H, W, 3] inputs, batch by batch."""
    if kind not in self._compiled:
      module = self.loaded.module(num_classes=None if kind != "logits" else self.num_classes)
      unpooled = {"pool": False} if kind == "tokens" else {}  # a ViT's; other families pool
      if unpooled:
        self._vit("features(pool=False)")
      self._compiled[kind] = jax.jit(lambda p, x: module.apply({"params": p}, x, **unpooled))
    x = _model_inputs(images)
    batch = min(self.batch_size, len(x))
    pad = -len(x) % batch
    x = np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)])
    out = [
      self._compiled[kind](self.params, jnp.asarray(x[i : i + batch]))
      for i in range(0, len(x), batch)
    ]
    return np.asarray(jnp.concatenate(out))[: len(x) - pad]

  def __call__(self, images: Any) -> np.ndarray:
    """Logits [B, K] of model inputs [B, H, W, 3] (no head: the pre-logits [B, D])."""
    return self._run("logits", images)

  def features(self, images: Any, pool: bool = True) -> np.ndarray:
    """Pre-logits [B, D] (what the head reads: pooled, ``fc_norm`` and representation
    layer applied); ``pool=False``: every token after the encoder, [B, N, D] (timm's
    `forward_features`)."""
    return self._run("pooled" if pool else "tokens", images)

  def forward_features(self, images: Any) -> np.ndarray:
    """timm's name: every token after the encoder, [B, N, D]."""
    return self.features(images, pool=False)

  def _vit(self, what: str) -> Any:
    module = self.module
    if not isinstance(module, models.VisionTransformer) or module.config.axial:
      raise errors.ConfigError(f"{what} needs a plain or hybrid ViT; {self!r} is not one.")
    return module

  def attention(self, images: Any) -> np.ndarray:
    """Every layer's and head's attention probabilities, [L, B, H, N, N] (the prefix
    tokens first: `vit_jax.analysis.attention_weights`)."""
    return analysis.attention_weights(self._vit("attention"), self.params, _model_inputs(images))

  def rollout(self, images: Any) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema, 2020) of the output token over the patches,
    [B, gh, gw] (`vit_jax.analysis.attention_rollout`; `analysis.resize_map` draws it)."""
    module, x = self._vit("rollout"), _model_inputs(images)
    return analysis.attention_rollout(
      self.attention(x),
      num_prefix=module.num_prefix_tokens,
      grid_hw=module.grid_hw(x.shape[1:3]),
    )

  # ------------------------------------------------------------------- images in

  def prepare(self, images: Any) -> np.ndarray:
    """Images (file paths, encoded bytes, PIL images, uint8 arrays [H, W, 3] or [N, H, W,
    3]) -> model inputs float32 [N, H, W, 3], prepared as this checkpoint expects: its own
    data config (`vit_jax.data.data_config`: resize, crop, interpolation, mean and std) at
    this model's image size."""
    from vit_jax.data import host_images  # pylint: disable=g-import-not-at-top

    return host_images.prepare(images, self.data_config)

  @property
  def data_config(self) -> DataConfig:
    """The checkpoint's eval preprocessing at this model's image size."""
    return self.loaded.data_config.at_size(self._input_size())

  def predict(
    self, images: Any, top_k: int = 5, labels: Optional[str] = None
  ) -> list[list[tuple[str, float]]]:
    """The ``top_k`` (class name, probability) of each image (anything `prepare` takes),
    most probable first; all the classes when the model has fewer. The names are
    ``labels``' ('imagenet2012' or a file, one name a line) or the model's own
    (`weights.LoadedModel.class_names_for`: ImageNet-1k's for an unnamed 1,000-class
    head, else the indices)."""
    if not self.num_classes:
      raise errors.ConfigError(f"{self!r} has no head: give it one with with_head(K).")
    if top_k < 1:
      raise errors.ConfigError(f"top_k={top_k} must be at least 1 (classes per image).")
    names = self.loaded.class_names_for(labels)
    probs = np.asarray(jax.nn.softmax(self(self.prepare(images)), axis=-1))
    order = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
    return [[(names[i], float(p[i])) for i in row] for p, row in zip(probs, order)]

  # ------------------------------------------------------------ new models from this one

  def _input_size(self) -> tuple[int, int]:
    if self.image_size is None:
      raise errors.ConfigError(f"{self!r} does not say its image size: call at_resolution(R).")
    return self.image_size

  def _refit(self, num_classes: Optional[int], image_size: tuple[int, int], **kwargs) -> "Model":
    """A model of this config with ``num_classes`` and ``image_size``, its parameters
    these ones fitted as fine-tuning fits them (`weights.fit.fit_params`)."""
    config = self.config
    fresh = _init_params(config, num_classes, image_size, seed=0)
    module = models.create_model(config, num_classes=None)
    stored_grid = module.grid_hw(self.image_size) if self.image_size else None
    params = fit.fit_params(
      self.params,
      config,
      fresh,
      config,
      stored_grid_hw=stored_grid,
      new_grid_hw=module.grid_hw(image_size),
      where=f"the parameters of {self.source!r}",
      **kwargs,
    )
    names = self.class_names if num_classes == self.num_classes else None
    loaded = dataclasses.replace(
      self.loaded, params=params, num_classes=num_classes, image_size=image_size, class_names=names
    )
    return Model(loaded, batch_size=self.batch_size)

  def with_head(self, num_classes: Optional[int]) -> "Model":
    """The model with a fresh zero head of ``num_classes`` (0 or None: no head, a feature
    extractor), as a fine-tuning run starts (`config.reset_head`)."""
    return self._refit(num_classes or None, self._input_size(), reset_head=True)

  def at_resolution(self, size: int | tuple[int, int], method: str = "bilinear") -> "Model":
    """The model for ``size`` inputs: learned position embeddings resized as fine-tuning
    resizes them (``method``: 'bilinear', 'bicubic', 'nearest'; the class token's row kept)."""
    hw = (size, size) if isinstance(size, int) else tuple(size)
    return self._refit(self.num_classes, hw, posemb_resize_method=method)

  # ------------------------------------------------------------------------ saving

  def text_probabilities(self, images: Any, texts: list[str]) -> np.ndarray:
    """An image-text model's probability of each text for each image (anything `prepare`
    takes), [B, T]: with a logit bias (SigLIP) each text's sigmoid, without (CLIP, LiT)
    the softmax over the texts (`vit_jax.text_scores`, as ``predict --texts``)."""
    from vit_jax import text_scores  # pylint: disable=g-import-not-at-top

    scores = text_scores.TextScores(self.loaded, texts)
    x = self.prepare(images)
    batch = min(self.batch_size, len(x))
    pad = -len(x) % batch
    x = np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)])
    out = [scores(x[i : i + batch]) for i in range(0, len(x), batch)]
    return np.concatenate(out)[: len(x) - pad]

  def save(self, directory: str | os.PathLike, format: str = "npz") -> str:  # noqa: A002
    """Writes the model into the new (or empty) folder ``directory`` as ``format``
    (`vit_jax.weights.writers.FORMATS`: 'npz', reloaded bitwise by `vit_jax.load`, with
    its model config beside it; 'timm', 'hf', 'saved_model', 'stablehlo'); returns its path."""
    return writers.save(
      self.loaded,
      format,
      directory,
      class_names=self.class_names,
      image_size=self._input_size(),
    )

  def save_pretrained(self, directory: str | os.PathLike) -> str:
    """transformers' name: `save` as npz, read back by `vit_jax.from_pretrained`."""
    return self.save(directory)

  def fine_tune(self, images: Any, labels: Any = None, **kwargs: Any) -> "Model":
    """A fine-tuned copy, trained on arrays by the run of ``python -m vit_jax.main``
    (`vit_jax.fine_tune.train_on_arrays`: its arguments) and loaded from its folder."""
    from vit_jax import fine_tune  # pylint: disable=g-import-not-at-top  (the run: heavier)

    workdir = fine_tune.train_on_arrays(self, images, labels, **kwargs)
    return load(workdir, batch_size=self.batch_size)


def _model_inputs(images: Any) -> np.ndarray:
  """Model inputs as float32 [B, H, W, 3]; a uint8 batch is an error with the fix."""
  x = np.asarray(images)
  if x.dtype == np.uint8 or x.ndim != 4:
    raise errors.ConfigError(
      f"Model inputs must be float32 [B, H, W, 3] as model.prepare(images) makes them, got "
      f"{x.dtype} {x.shape}: call model.prepare(images) first (or model.predict(images))."
    )
  return x.astype(np.float32)


def _init_params(
  config: ml_collections.ConfigDict, num_classes: Optional[int], size: tuple[int, int], seed: int
) -> Params:
  """Fresh parameters of ``config`` for ``size`` inputs (the family's initialisers)."""
  module = models.create_model(config, num_classes=num_classes)
  init = jax.jit(lambda key: module.init(key, jnp.zeros((1, *size, 3), jnp.float32)))
  return jax.tree.map(np.asarray, nn.unbox(init(jax.random.PRNGKey(seed)))["params"])


def load(source: str | os.PathLike, *, model_name: Optional[str] = None, **kwargs: Any) -> Model:
  """The model of any weights source `vit_jax.weights.load` reads (an official `.npz`, a
  run, a transformers or timm folder or `.safetensors`, ``hf-hub:<org>/<name>``, an official
  name) or a folder `Model.save` wrote as npz; ``model_name`` overrides an `.npz`'s
  architecture; ``kwargs``: `Model`'s (``batch_size``)."""
  saved = os.path.join(os.fspath(source), npz.EXPORT_FILE)
  if os.path.isfile(saved):
    loaded = sources.load(saved, model_name)
    labels = os.path.join(os.fspath(source), writers.LABELS_FILE)
    if os.path.isfile(labels) and loaded.num_classes:
      with open(labels) as f:
        names = f.read().splitlines()
      if len(names) == loaded.num_classes:
        loaded = dataclasses.replace(loaded, class_names=names)
  else:
    loaded = sources.load(source, model_name)
  return Model(loaded, **kwargs)


def create(
  name_or_config: str | ml_collections.ConfigDict,
  num_classes: Optional[int] = DEFAULT_NUM_CLASSES,
  *,
  image_size: Optional[int | tuple[int, int]] = None,
  seed: int = 0,
  pretrained: bool = False,
  **kwargs: Any,
) -> Model:
  """A randomly initialised model (``seed``): one of our variants (`models.MODEL_NAMES`),
  a timm ViT architecture name (``vit_tiny_patch16_224``, as timm registers it) or a model
  config; ``num_classes`` 0 or None: no head. ``image_size``: the input size (default: the
  timm name's, else 224). ``pretrained=True``: the hub's weights instead (`load`)."""
  if pretrained:
    if not isinstance(name_or_config, str):
      raise errors.ConfigError("pretrained=True needs a name: vit_jax.load(source) for files.")
    official = name_or_config in models.MODEL_NAMES
    model = load(name_or_config if official else f"hf-hub:timm/{name_or_config}", **kwargs)
    return model if model.num_classes == (num_classes or None) else model.with_head(num_classes)
  if not isinstance(name_or_config, str):
    config, named_size = name_or_config, None
  elif name_or_config in models.MODEL_NAMES:
    config, named_size = models.get_model_config(name_or_config), None
  else:
    config, named_size = timm_create.config_from_name(name_or_config)
  size = image_size or named_size or DEFAULT_IMAGE_SIZE
  hw = (size, size) if isinstance(size, int) else tuple(size)
  models.create_model(config, num_classes=None).grid_hw(hw)  # a size that fits the patches
  params = _init_params(config, num_classes or None, hw, seed)
  name = config.get("name", "custom") if not isinstance(name_or_config, str) else name_or_config
  loaded = sources.LoadedModel(
    config, params, num_classes or None, hw, None, f"create({name!r}, seed={seed})"
  )
  return Model(loaded, **kwargs)


from_pretrained = load  # transformers' name
create_model = create  # timm's name
