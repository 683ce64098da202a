"""The Python face: one `Model` object for a loaded or a new model, as timm and
transformers users expect one.

    model = vit_jax.load("path/or/hf-hub:org/name")        # any weights source
    model = vit_jax.create("vit_tiny_patch16_224", num_classes=10)   # ours or timm's names
    x = model.prepare(["cat.jpg"])                  # [B, H, W, 3] as the checkpoint expects
    logits = model(x)                               # [B, K]
    model.predict(["cat.jpg"], top_k=5)             # [[(name, probability), ...], ...]
    model.features(x)                               # [B, D] pre-logits; pool=False: [B, N, D]
    model.features(["doc.png"], seq_len=576)        # NaFlex: each image at its own aspect
    model.rollout(x)                                # [B, gh, gw] attention rollout
    model.text_probabilities(["cat.jpg"], ["a cat", "a dog"])   # an image-text model's [B, T]
    model.with_head(5).at_resolution(384).save("out", format="timm")

A `Model` is a JAX value: a pytree whose leaves are its parameters (the config,
preprocessing and class names are static, compared by value, `vit_jax.api.model_facts`: two
loads of one architecture average with `jax.tree.map` and share a jitted function), so
`jax.jit`, `jax.grad`, `jax.vmap` and optax take it whole, and `model(x)`, `features` and
`logits` trace inside them; `model.replace(params=new)` is the model with other parameters
(it saves and exports).
Outside a transformation every array method runs one jitted function over fixed-size
batches (``batch_size``), so a long list compiles once. The names of the ecosystem are
aliases: `from_pretrained` / `create_model` (module level, `vit_jax`), `forward_features`
and `save_pretrained`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Callable, Iterator, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import models
from vit_jax.api import analysis, model_checks, model_facts
from vit_jax.data.data_config import DataConfig
from vit_jax.infra import errors
from vit_jax.infra.aliases import Params
from vit_jax.models.naflex import NaFlexPatches
from vit_jax.weights import fit, sources, writers
from vit_jax.weights.timm import create as timm_create

DEFAULT_BATCH = 32  # images per jitted call
DEFAULT_IMAGE_SIZE = 224  # `create`'s input size for a name that does not say one
DEFAULT_NUM_CLASSES = 1000  # `create`'s head, timm's default


@jax.tree_util.register_pytree_with_keys_class
class Model:
  """A model with its parameters and what is known of them (`weights.LoadedModel`):
  ``config``, ``params``, ``num_classes`` (None: no head), ``image_size``,
  ``class_names``, ``source``. Inputs of `__call__`, `features` and `attention` are model
  inputs, float32 [B, H, W, 3] as `prepare` makes them (`NaFlexPatches` with its
  ``seq_len``); `predict` takes images. A pytree
  (module docstring): its leaves are ``params``; change them with `replace`."""

  _facts: model_facts.Facts
  _params: Params

  def __init__(self, loaded: sources.LoadedModel, *, batch_size: int = DEFAULT_BATCH):
    if batch_size < 1:
      raise errors.ConfigError(f"batch_size={batch_size} must be at least 1 (images per call).")
    self._facts = model_facts.Facts(loaded, batch_size)
    self._params = loaded.params

  @classmethod
  def _of(cls, facts: model_facts.Facts, params: Any) -> "Model":
    """A model of ``facts`` holding ``params`` as they are (tracers, abstract values or
    optax's placeholders alike: JAX rebuilds pytrees from any leaves)."""
    model = object.__new__(cls)
    model._facts, model._params = facts, params
    return model

  def tree_flatten_with_keys(self) -> tuple[tuple[tuple[Any, Params], ...], model_facts.Facts]:
    return ((jax.tree_util.GetAttrKey("params"), self._params),), self._facts

  @classmethod
  def tree_unflatten(cls, facts: model_facts.Facts, children: tuple[Params]) -> "Model":
    return cls._of(facts, children[0])

  @property
  def params(self) -> Params:
    """The parameter tree (per layer, as `module.apply` takes it)."""
    return self._params

  @params.setter
  def params(self, value: Params) -> None:
    raise AttributeError("A Model is immutable (a JAX value): model = model.replace(params=new).")

  def replace(self, *, params: Params) -> "Model":
    """This model with ``params`` (a tree of this one's structure and shapes, e.g. what
    optax or `jax.grad` made of it): a new model that runs, saves and exports as any
    other. Also inside `jax.jit`."""
    want, got = model_checks.shapes(self._params), model_checks.shapes(params)
    if got != want:
      wrong = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
      said = ", ".join(f"{k}: {got.get(k)} for {want.get(k)}" for k in wrong[:3])
      raise errors.ConfigError(
        f"model.replace(params=...) needs this model's tree of {len(want)} arrays; got "
        f"{len(got)}, {said}: pass what model.params became (with_head(K) or "
        "at_resolution(R) make other shapes)."
      )
    return Model._of(self._facts, params)

  batch_size = property(lambda self: self._facts.batch_size)
  loaded = property(lambda self: dataclasses.replace(self._facts.loaded, params=self._params))
  config = property(lambda self: self._facts.loaded.config)
  num_classes = property(lambda self: self._facts.loaded.num_classes)
  image_size = property(lambda self: self._facts.loaded.image_size)
  class_names = property(lambda self: self._facts.loaded.class_names)
  source = property(lambda self: self._facts.loaded.source)

  def __repr__(self) -> str:
    return (
      f"Model({self.config.get('name', 'custom')!r}, num_classes={self.num_classes}, "
      f"image_size={self.image_size}, source={self.source!r})"
    )

  @property
  def module(self) -> Any:
    """The Flax module of these parameters (``apply({'params': model.params}, x)``)."""
    return self._facts.loaded.module()

  def to_nnx(self) -> Any:
    """This model as a Flax NNX module holding its parameters as ``nnx.Param`` (train it
    with ``nnx.Optimizer``; `vit_jax.api.nnx_view.NNXModel.to_model` is the way back)."""
    from vit_jax.api import nnx_view  # pylint: disable=g-import-not-at-top  (flax.nnx: on use)

    return nnx_view.NNXModel(self)

  # ------------------------------------------------------------------ running the model

  def _apply(self, kind: str) -> Callable[[Params, jax.Array], jax.Array]:
    """``kind`` ('logits', 'pooled', 'tokens') of [B, H, W, 3] inputs, as a pure function."""
    module = self._facts.loaded.module(num_classes=None if kind != "logits" else self.num_classes)
    unpooled = {"pool": False} if kind == "tokens" else {}  # a ViT's; other families pool
    if unpooled:
      self._vit("features(pool=False)")
    return lambda p, x: module.apply({"params": p}, x, **unpooled)

  def _run(self, kind: str, images: Any) -> np.ndarray | jax.Array:
    """``kind`` of model inputs: traced (a tracer among the inputs or the parameters, as
    in `jax.jit` or `jax.grad`) in one call, else on the host batch by batch."""
    if models.is_two_tower(self.config):  # before anything is traced or compiled
      raise errors.ConfigError(
        f"{self!r} is an image-text model: score images against texts with "
        "text_probabilities(images, texts), or export its image tower (save(format='timm'))."
      )
    patches = isinstance(images, NaFlexPatches)
    if model_checks.traced((self._params, images)):
      if patches:
        return self._apply(kind)(self._params, images)
      model_checks.check_inputs(images, self.image_size)
      with self._built_size(images):
        return self._apply(kind)(self._params, jnp.asarray(images, jnp.float32))
    compiled = self._facts.compiled
    if kind not in compiled:
      compiled[kind] = jax.jit(self._apply(kind))
    if patches:
      x = jax.tree.map(np.asarray, images)
    else:
      x = model_checks.host_inputs(images, self.image_size)
    with self._built_size(x):
      return self._batched(lambda batch: compiled[kind](self._params, batch), x)

  def _batched(self, fn: Callable[[Any], Any], x: Any) -> np.ndarray:
    """``fn`` over host inputs ``x`` (an array [N, ...] or NaFlex patches of N images) in
    full batches of ``batch_size`` (the last padded with zeros: one compilation)."""
    n = len(jax.tree.leaves(x)[0])
    batch = min(self.batch_size, n)
    pad = -n % batch
    x = jax.tree.map(lambda a: np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)]), x)
    out = [fn(jax.tree.map(lambda a: a[i : i + batch], x)) for i in range(0, n + pad, batch)]
    return np.asarray(jnp.concatenate(out))[:n]

  @contextlib.contextmanager
  def _built_size(self, images: Any) -> Iterator[None]:
    """Flax's parameter-shape error of inputs of another size, as the fix: the trace fails
    there, before anything compiles."""
    try:
      yield
    except flax.errors.ScopeParamShapeError:
      hw, size = tuple(np.shape(images)[1:3]), self.image_size
      if size is None or hw == tuple(size):
        raise
      r = hw[0] if hw[0] == hw[1] else hw
      raise errors.ConfigError(
        f"{self!r} was built for {size[0]}x{size[1]} inputs, got {hw[0]}x{hw[1]}: use "
        f"model.at_resolution({r}) for a model of that size, or model.prepare(images) for "
        f"inputs of {size[0]}x{size[1]}."
      ) from None

  def __call__(self, images: Any) -> np.ndarray | jax.Array:
    """`logits`."""
    return self.logits(images)

  def logits(self, images: Any, seq_len: Optional[int] = None) -> np.ndarray | jax.Array:
    """Logits [B, K] of model inputs [B, H, W, 3] or `NaFlexPatches` (no head: the
    pre-logits [B, D]); with ``seq_len``, of images as `prepare` takes them."""
    return self._run("logits", self._inputs(images, seq_len))

  def features(
    self, images: Any, pool: bool = True, seq_len: Optional[int] = None
  ) -> np.ndarray | jax.Array:
    """Pre-logits [B, D] (what the head reads: pooled, ``fc_norm`` and representation
    layer applied); ``pool=False``: every token after the encoder, [B, N, D] (timm's
    `forward_features`). Inputs as `logits` takes them."""
    return self._run("pooled" if pool else "tokens", self._inputs(images, seq_len))

  def _inputs(self, images: Any, seq_len: Optional[int]) -> Any:
    return images if seq_len is None else self.prepare(images, seq_len=seq_len)

  def forward_features(self, images: Any) -> np.ndarray | jax.Array:
    """timm's name: every token after the encoder, [B, N, D]."""
    return self.features(images, pool=False)

  def _vit(self, what: str) -> Any:
    module = self.module
    if not isinstance(module, models.VisionTransformer) or module.config.axial:
      raise errors.ConfigError(f"{what} needs a plain or hybrid ViT; {self!r} is not one.")
    return module

  def attention(self, images: Any) -> np.ndarray:
    """Every layer's and head's attention probabilities, [L, B, H, N, N] (the prefix
    tokens first: `vit_jax.api.analysis.attention_weights`)."""
    x = model_checks.host_inputs(images, self.image_size)
    return analysis.attention_weights(self._vit("attention"), self.params, x)

  def rollout(self, images: Any) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema, 2020) of the output token over the patches,
    [B, gh, gw] (`vit_jax.api.analysis.attention_rollout`; `analysis.resize_map` draws it)."""
    module, x = self._vit("rollout"), model_checks.host_inputs(images, self.image_size)
    return analysis.attention_rollout(
      self.attention(x),
      num_prefix=module.num_prefix_tokens,
      grid_hw=module.grid_hw(x.shape[1:3]),
    )

  # ------------------------------------------------------------------- images in

  def prepare(self, images: Any, seq_len: Optional[int] = None) -> np.ndarray | NaFlexPatches:
    """Images (file paths, encoded bytes, PIL images, uint8 arrays [H, W, 3] or [N, H, W,
    3]) -> model inputs float32 [N, H, W, 3], prepared as this checkpoint expects: its own
    data config (`vit_jax.data.data_config`: resize, crop, interpolation, mean and std) at
    this model's image size. With ``seq_len``: NaFlex inputs, each image resized to the
    largest patch grid of its aspect ratio within ``seq_len`` patches, padded to it
    (`vit_jax.data.naflex_images`), with this checkpoint's mean and std."""
    from vit_jax.data import host_images, naflex_images  # pylint: disable=g-import-not-at-top

    model_checks.check_channels_last(images, channels=(3, 4))  # RGBA is read as RGB
    if seq_len is None:
      return host_images.prepare(images, self.data_config)
    (patch, other), source = models.image_settings(self.config).patches.size, self._facts.loaded
    if patch != other:
      raise errors.ConfigError(f"seq_len takes square patches; {self!r} has {patch}x{other}.")
    stats = source.data_config.mean, source.data_config.std
    return NaFlexPatches(*naflex_images.prepare(images, patch, seq_len, *stats))

  @property
  def data_config(self) -> DataConfig:
    """The checkpoint's eval preprocessing at this model's image size."""
    return self._facts.loaded.data_config.at_size(self._input_size())

  def predict(
    self, images: Any, top_k: int = 5, labels: Optional[str] = None, seq_len: Optional[int] = None
  ) -> list[list[tuple[str, float]]]:
    """The ``top_k`` (class name, probability) of each image (anything `prepare` takes,
    with its ``seq_len``), most probable first; all the classes when the model has fewer.
    The names are ``labels``' ('imagenet2012' or a file, one name a line) or the model's own
    (`weights.LoadedModel.class_names_for`: ImageNet-1k's for an unnamed 1,000-class
    head, else the indices)."""
    if not self.num_classes:
      raise errors.ConfigError(f"{self!r} has no head: give it one with with_head(K).")
    if top_k < 1:
      raise errors.ConfigError(f"top_k={top_k} must be at least 1 (classes per image).")
    names = self._facts.loaded.class_names_for(labels)
    probs = np.asarray(jax.nn.softmax(self.logits(self.prepare(images, seq_len)), axis=-1))
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
    # A new head has no class names, and is no longer the head of the run it came from
    # (whose saved config made `predict` warn about names the run never saved).
    same_head = num_classes == self.num_classes
    loaded = dataclasses.replace(
      self.loaded,
      params=params,
      num_classes=num_classes,
      image_size=image_size,
      class_names=self.class_names if same_head else None,
      run_config=self.loaded.run_config if same_head else None,
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

  def text_probabilities(
    self, images: Any, texts: list[str], seq_len: Optional[int] = None
  ) -> np.ndarray:
    """An image-text model's probability of each text for each image (anything `prepare`
    takes, with its ``seq_len``), [B, T]: with a logit bias (SigLIP) each text's sigmoid,
    without (CLIP, LiT) the softmax over the texts (`vit_jax.api.text_scores`, as ``predict
    --texts``)."""
    from vit_jax.api import text_scores  # pylint: disable=g-import-not-at-top

    scores = text_scores.TextScores(self.loaded, texts)
    model_checks.warn_truncated(self._facts.loaded.tokenizer, texts, self.config.text_len)
    return self._batched(scores, self.prepare(images, seq_len))

  def save(self, directory: str | os.PathLike, format: str = "npz") -> str:  # noqa: A002
    """Writes the model into the new (or empty) folder ``directory`` (local or gs://) as
    ``format`` (`vit_jax.weights.exports.NAMES`: 'npz', reloaded bitwise by `vit_jax.load`,
    with its model config beside it; 'timm', 'hf', 'saved_model', 'stablehlo'); returns its
    path."""
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

  def fine_tune(self, images: Any, labels: Any = None, **kwargs: Any) -> tuple["Model", Any]:
    """``(tuned, history)``: a fine-tuned copy, trained on arrays by the run of ``python -m
    vit_jax.main`` (`vit_jax.api.fine_tune.train_on_arrays`: its arguments; a progress bar
    with loss, img/s and ETA, then the evaluation) and loaded from its folder, with this
    model's preprocessing; and the run's `vit_jax.run.progress.History` (``history.train``
    per report, ``history.final`` the evaluation). A ``workdir`` holding a run started
    with other arguments is refused, naming them."""
    from vit_jax.api import fine_tune  # pylint: disable=g-import-not-at-top  (the run: heavier)

    workdir, history = fine_tune.train_on_arrays(self, images, labels, **kwargs)
    return load(workdir, batch_size=self.batch_size), history


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
  name) or a folder `Model.save` wrote as npz, local or on a bucket (gs://), found as every
  command finds it (`weights.formats.locate`);
  ``model_name`` overrides an `.npz`'s architecture; ``kwargs``: `Model`'s (``batch_size``)."""
  model_checks.check_name(os.fspath(source))
  return Model(sources.load(source, model_name), **kwargs)


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
    if not official:
      timm_create.check_name(name_or_config)
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
