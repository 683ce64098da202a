"""The two-tower (image-text) family: its settings read from ``config.model``, its builder,
its cost and what its parameter shapes say.

A two-tower config holds an image model config of any family and a text tower:

    config.model.model_type = 'two_tower'
    config.model.image = models.get_model_config('ViT-B_16')   # any family's config
    config.model.text = dict(size='B', vocab_size=32_000, pool='last')   # or width/depth/...
    config.model.text_len = 16          # the tokens of a text (fixes the position table)
    config.model.embed_dim = 768        # the shared width of both projections
    config.model.temperature_init = 10.0, config.model.bias_init = -10.0   # SigLIP's
    # CLIP: temperature_init=1 / 0.07, bias_init=None (no bias parameter)
    config.model.image_head = 'dense'   # or 'linear' (no bias), 'none' (`two_tower.IMAGE_HEADS`)

`two_tower_config` writes one, `two_tower_settings` its settings. The model
(`two_tower.TwoTower`) keeps the image model's tree under ``img`` and the text tower's
under ``txt``; the image model is built as a feature extractor (no head) and its run
options (remat, dtype) are the image config's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import ml_collections

from vit_jax.infra import errors
from vit_jax.models import cost
from vit_jax.models.execution import ExecutionOptions
from vit_jax.models.text import SIZES, TextSettings, TextTransformer
from vit_jax.models.two_tower import IMAGE_HEADS, LOSS_INIT, ContrastiveInit, TwoTower

TWO_TOWER = "two_tower"
TEXT_KEY = "txt/Embed_0/embedding"  # a path only a two-tower tree has
IMAGE, TEXT = "img", "txt"  # the towers' subtrees
_TEXT_FIELDS = ("width", "depth", "mlp_dim", "num_heads", "vocab_size", "pool")
# The text tower's options beside its sizes (`text.TextSettings`: transformers' towers).
_TEXT_OPTIONS = (
  "gelu_approximate", "layer_norm_epsilon", "activation", "causal", "pad_id", "eos_id",
  "head_bias",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class TwoTowerSettings:
  """A two-tower model: ``image`` (any family's settings), ``text``, the shared width and
  the contrastive temperature and bias to start from (``bias_init`` None: no bias)."""

  name: str
  image: Any  # `families.Settings` of the image model
  text: TextSettings
  text_len: int
  embed_dim: int
  temperature_init: float
  bias_init: Optional[float]
  image_head: str = "dense"  # `two_tower.IMAGE_HEADS`
  model_type: str = TWO_TOWER
  resnet: None = None  # read by the run's checks of a hybrid ViT

  def __post_init__(self):
    for key in ("text_len", "embed_dim"):
      value = getattr(self, key)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise errors.ConfigError(f"config.model.{key}={value!r} must be a positive integer.")
    if not self.temperature_init > 0:
      raise errors.ConfigError(
        f"config.model.temperature_init={self.temperature_init!r} must be positive "
        "(SigLIP: 10, CLIP: 1 / 0.07 = 14.3)."
      )
    if self.image_head not in IMAGE_HEADS:
      raise errors.ConfigError(
        f"config.model.image_head={self.image_head!r}; choose one of {IMAGE_HEADS}."
      )
    if isinstance(self.image, TwoTowerSettings):
      raise errors.ConfigError("config.model.image must be an image model, not a two-tower one.")

  @classmethod
  def from_config(cls, config: Any, image: Any) -> "TwoTowerSettings":
    """``image``: the image model's settings, read from ``config.image`` by its family
    (`families.model_settings`, which calls this)."""
    if isinstance(config, TwoTowerSettings):
      return config
    for key in ("name", "image", "text", "text_len", "embed_dim", "temperature_init"):
      if config.get(key) is None:
        raise errors.ConfigError(
          f"config.model.{key} is required by a two-tower model: build the config with "
          "vit_jax.models.image_text.two_tower_config (configs/siglip.py does)."
        )
    bias = config.get("bias_init")
    return cls(
      name=str(config.name),
      image=image,
      text=_text_settings(config.text),
      text_len=config.text_len,
      embed_dim=config.embed_dim,
      temperature_init=float(config.temperature_init),
      bias_init=None if bias is None else float(bias),
      image_head=config.get("image_head", "dense"),
    )

  # The run's options are the image model's: it is the tower that sets the compute.
  @property
  def remat(self) -> bool:
    return self.image.remat

  @property
  def dtype(self) -> str:
    return self.image.dtype

  @property
  def input_mean(self) -> tuple[float, ...]:
    return self.image.input_mean

  @property
  def input_std(self) -> tuple[float, ...]:
    return self.image.input_std

  def execution_options(self) -> ExecutionOptions:
    return self.image.execution_options()

  def get(self, key: str, default: Any = None) -> Any:
    return getattr(self, key, default)

  def replace(self, **changes: Any) -> "TwoTowerSettings":
    """Own fields changed; any other (``remat=True``, ``dtype``) is the image model's."""
    own = {k: changes.pop(k) for k in list(changes) if k in self.__dataclass_fields__}
    image = own.pop("image", self.image)
    image = image.replace(**changes) if changes else image
    return dataclasses.replace(self, image=image, **own)


def _two_tower_fields(
  *,
  text: Mapping[str, Any],
  text_len: int,
  embed_dim: int,
  loss: str = "sigmoid",
  name: str = "two-tower",
  image_head: str = "dense",
) -> dict[str, Any]:
  """The fields of a two-tower model beside its image model, with SigLIP's
  (``loss='sigmoid'``) or CLIP's (``'softmax'``) initial temperature and bias."""
  init = LOSS_INIT[loss]
  return dict(
    name=name, text=dict(text), text_len=text_len, embed_dim=embed_dim,
    temperature_init=init.temperature, bias_init=init.bias, image_head=image_head,
  )  # fmt: skip


def two_tower_config(image: ml_collections.ConfigDict, **options: Any) -> ml_collections.ConfigDict:
  """``config.model`` of a two-tower model: ``image`` an image model's config, ``options``
  those of `_two_tower_fields` (the text tower, its length, the shared width, the loss,
  the name and the image head)."""
  fields = _two_tower_fields(**options)
  config = ml_collections.ConfigDict(dict(model_type=TWO_TOWER, image=image, **fields))
  config.bias_init = ml_collections.FieldReference(fields["bias_init"], field_type=float)
  return config


def two_tower_settings(image: Any, **options: Any) -> TwoTowerSettings:
  """`two_tower_config`'s model as settings, ``image`` an image model's settings: what a
  checkpoint's reader builds."""
  fields = _two_tower_fields(**options)
  return TwoTowerSettings(image=image, **{**fields, "text": _text_settings(fields["text"])})


def _text_settings(text: Mapping[str, Any]) -> TextSettings:
  """The text tower of ``config.model.text``: a named ``size`` or its sizes, and options."""
  text = dict(text)
  size = text.pop("size", None)
  unknown = sorted(set(text) - set(_TEXT_FIELDS) - set(_TEXT_OPTIONS))
  if unknown:
    raise errors.ConfigError(
      f"config.model.text has unknown keys {unknown}; it takes 'size' (one of "
      f"{tuple(SIZES)}) or {_TEXT_FIELDS}, and {_TEXT_OPTIONS}."
    )
  return TextSettings.named(size, **text) if size else TextSettings(**text)


# The functions below take the image model's family record (``image_family``: a
# `families.Family`), which `families.TWO_TOWER` passes them: this module cannot import the
# registry that imports it.


def create_two_tower(
  settings: TwoTowerSettings,
  *,
  num_classes: Optional[int],
  execution: ExecutionOptions,
  image_family: Any,
  **overrides: Any,
) -> TwoTower:
  """The `TwoTower` of ``settings``; ``num_classes`` is ignored (the embedding width is the
  model's own), ``overrides`` go to the image model."""
  del num_classes
  img = image_family.build(settings.image, num_classes=None, execution=execution, **overrides)
  text_execution = ExecutionOptions(dtype=execution.dtype, remat=execution.remat)
  txt = TextTransformer(settings.text, num_classes=settings.embed_dim, execution=text_execution)
  init = ContrastiveInit(settings.temperature_init, settings.bias_init)
  return TwoTower(
    img=img, txt=txt, embed_dim=settings.embed_dim, contrastive_init=init,
    image_head=settings.image_head,
  )  # fmt: skip


def text_flops(settings: TwoTowerSettings, *, train: bool) -> float:
  """FLOPs of one text: the encoder blocks over ``text_len`` tokens, a MAP pooling's head
  and the projection (the token embedding is a gather: no products)."""
  n, s = settings.text_len, settings.text
  macs = s.depth * cost.encoder_block_macs(n, s.width, s.mlp_dim)
  if s.pool == "map":
    macs += cost.map_head_macs(n, s.width, s.mlp_dim)
  macs += s.width * settings.embed_dim
  return 2.0 * macs * (3 if train else 1)


def loss_flops(settings: TwoTowerSettings, batch: int, *, train: bool) -> float:
  """FLOPs per pair of the contrastive loss over a global ``batch``: each pair's image
  against every text, B x E multiply-adds of the [B, B] logits (the chunked sigmoid loss
  computes the same blocks around the ring; its recomputation in the backward pass is
  not counted, as remat is not). Elementwise work (log-sigmoid, softmax) is not counted."""
  return 2.0 * batch * settings.embed_dim * (3 if train else 1)


def flops_per_image(
  settings: TwoTowerSettings,
  image_size: int,
  num_classes: Optional[int],
  *,
  train: bool,
  image_family: Any,
  batch: int = 0,
  lock_image: bool = False,
) -> Optional[float]:
  """FLOPs of one image-text pair: the image model without head and its projection to
  the shared width, `text_flops`, and with a global ``batch`` the `loss_flops`. A train
  step of a locked image tower (``lock_image``, LiT) runs that tower forward only; its
  projection is trained."""
  del num_classes
  image = image_family.flops_per_image(settings.image, image_size, None, train=False)
  projected = image_family.flops_per_image(
    settings.image, image_size, settings.embed_dim, train=False
  )
  if image is None or projected is None:
    return None
  factor = 3 if train else 1
  image_factor = 1 if lock_image else factor
  total = image * image_factor + (projected - image) * factor + text_flops(settings, train=train)
  return total + (loss_flops(settings, batch, train=train) if batch else 0.0)


def activation_bytes(
  settings: TwoTowerSettings,
  image_size: int,
  images: int,
  compiler_rematerializes: bool = False,
  *,
  image_family: Any,
) -> Optional[int]:
  """The image model's bound (a lower bound of the two towers' together)."""
  bound = image_family.activation_bytes
  return bound(settings.image, image_size, images, compiler_rematerializes)


def describe_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
  """What a two-tower tree's shapes say of its text tower and shared width."""
  vocab, width = shapes[TEXT_KEY]
  depth = len({p.split("/")[2] for p in shapes if p.startswith("txt/Encoder_0/encoderblock_")})
  mlp = shapes.get("txt/Encoder_0/encoderblock_0/MlpBlock_3/Dense_0/kernel", (None, None))[1]
  return {
    "text width": width,
    "text depth": depth,
    "text mlp_dim": mlp,
    "vocab size": vocab,
    "text length": shapes.get("txt/pos_embedding", (None, None))[1],
    "embed dim": shapes.get("txt/head/kernel", (None, None))[1],
    "bias": "b" in shapes,
  }


def settings_from_shapes(shapes: Mapping[str, tuple[int, ...]], settings: Any) -> Any:
  """Refused: the image tower's family and the text tower's heads are not in the shapes."""
  del shapes, settings
  raise errors.CheckpointError(
    "A two-tower checkpoint's config cannot be read from its arrays alone (the image "
    "model's family and the heads are not in them): load it with the run's config.json."
  )


def trained_grid(
  shapes: Mapping[str, tuple[int, ...]], config: Any, *, image_family: Any
) -> Optional[tuple]:
  """The grid the image tower fixes (its family's reader, on the ``img/`` subtree)."""
  image = {k[len(IMAGE) + 1 :]: v for k, v in shapes.items() if k.startswith(IMAGE + "/")}
  return image_family.trained_grid(image, config.image)


def architecture_key(config: Any, settings: TwoTowerSettings, *, image_family: Any) -> tuple:
  """What the parameter shapes fix: the image model's key, the text tower's sizes, the
  text length, the shared width and whether there is a bias."""
  s = settings
  image = image_family.architecture_key(config.image)
  text = tuple(getattr(s.text, f) for f in _TEXT_FIELDS) + (s.text.head_bias,)
  return (image, text, s.text_len, s.embed_dim, s.bias_init is None, s.image_head)
