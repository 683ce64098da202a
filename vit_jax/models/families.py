"""Every model family as one typed record, and the lookups that pick one.

A `Family` holds what the rest of the package needs of a family: its settings class, its
builder, its analytic FLOPs and activation bound, and the reader of its parameter shapes.
The run, the plan, the weights readers and the export ask `family_of` (a config or
settings), `family_of_shapes` (a parameter tree) or `is_mixer`, `is_bit`, `is_two_tower`
instead of testing for a family by hand; `image_settings` and `image_params` find the
image model inside any family's settings and tree. A new family is a module of its own and
one record in `FAMILIES`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.infra import errors
from vit_jax.models import bit, cost, image_text, mixer, variants, vit, vit_shapes
from vit_jax.models.image_text import TwoTowerSettings
from vit_jax.models.settings import BitSettings, MixerSettings, ModelSettings, Settings

Shapes = Mapping[str, tuple[int, ...]]  # a parameter tree's shapes by 'a/b/c' path


@dataclasses.dataclass(frozen=True, eq=False)
class Family:
  """One model family: how its configs and parameter trees are told apart and read, how
  it is built, and what it costs."""

  name: str  # its configs' ``model_type`` (a ViT config has none)
  settings: type[ModelSettings] | type[MixerSettings] | type[BitSettings] | type[TwoTowerSettings]
  # (settings, *, num_classes, execution, **module attribute overrides) -> the module
  build: Callable[..., nn.Module]
  # (settings, image_size, num_classes, *, train) -> FLOPs of one image (None: unknown)
  flops_per_image: Callable[..., Optional[float]]
  # (settings, image_size, images, compiler_rematerializes) -> a lower bound (None: none)
  activation_bytes: Callable[..., Optional[int]]
  tree_key: Optional[str]  # a parameter path only its trees have (None: the ViT, the rest)
  describe_shapes: Callable[[Shapes], dict[str, Any]]  # what the shapes say, by name
  template: str  # the registered variant a config read from shapes starts from
  # (shapes, the template's settings) -> those settings changed to what the shapes say
  settings_from_shapes: Callable[[Shapes, Any], Any]
  trained_grid: Callable[[Shapes, Any], Optional[tuple[int, int]]]  # the grid it fixes
  architecture_key: Callable[[Any], tuple]  # what its parameter shapes fix of a config
  patch_kernel: Optional[str]  # its patch embedding's kernel (resampled by a fit)
  fit_advice: str  # the last line of a fit error
  hf_refusal: Optional[str]  # why transformers' ViT cannot hold it (None: it can)
  example: str = "image"  # one training example, in words (the plan's)
  # (settings, images [B, H, W, 3]) -> the module's inputs (`init`, `apply`): the images
  # alone, or beside zero token ids [B, text_len] (a two-tower model)
  inputs: Callable[[Any, Any], tuple] = lambda settings, images: (images,)
  # the subtree of its parameters (and field ``image`` of its settings) that holds an
  # image model of another family; None: the whole model is the image model
  image_tree: Optional[str] = None


VIT = Family(
  name="vit",
  settings=ModelSettings,
  build=vit.create_vit,
  flops_per_image=cost.vit_flops_per_image,
  activation_bytes=cost.vit_activation_bytes,
  tree_key=None,
  describe_shapes=vit_shapes.describe_shapes,
  template="testing",
  settings_from_shapes=vit_shapes.settings_from_shapes,
  trained_grid=vit_shapes.trained_grid,
  architecture_key=vit_shapes.architecture_key,
  patch_kernel=vit_shapes.EMBEDDING,
  fit_advice=vit_shapes.FIT_ADVICE,
  hf_refusal=None,
)
MIXER = Family(
  name=mixer.MIXER,
  settings=MixerSettings,
  build=mixer.create_mixer,
  flops_per_image=mixer.flops_per_image,
  activation_bytes=mixer.activation_bytes,
  tree_key=mixer.STEM_KERNEL,
  describe_shapes=mixer.describe_shapes,
  template="Mixer-B_16",
  settings_from_shapes=mixer.settings_from_shapes,
  trained_grid=mixer.trained_grid,
  architecture_key=mixer.architecture_key,
  patch_kernel=mixer.STEM_KERNEL,
  fit_advice=mixer.FIT_ADVICE,
  hf_refusal="transformers has no MLP-Mixer",
)
BIT = Family(
  name=bit.BIT,
  settings=BitSettings,
  build=bit.create_bit,
  flops_per_image=cost.bit_flops_per_image,
  activation_bytes=cost.bit_activation_bytes,
  tree_key=bit.ROOT_KERNEL,
  describe_shapes=bit.describe_shapes,
  template="BiT-R50x1",
  settings_from_shapes=bit.settings_from_shapes,
  trained_grid=bit.trained_grid,
  architecture_key=bit.architecture_key,
  patch_kernel=None,
  fit_advice=bit.FIT_ADVICE,
  hf_refusal="--format=hf writes ViTs only",
)


def _image_family(settings: TwoTowerSettings) -> Family:
  return family_of(settings.image)


# The two-tower functions take their image model's family, looked up here at each call.
TWO_TOWER = Family(
  name=image_text.TWO_TOWER,
  settings=TwoTowerSettings,
  build=lambda s, **kw: image_text.create_two_tower(s, image_family=_image_family(s), **kw),
  flops_per_image=lambda s, *a, **kw: image_text.flops_per_image(
    s, *a, image_family=_image_family(s), **kw
  ),
  activation_bytes=lambda s, *a: image_text.activation_bytes(s, *a, image_family=_image_family(s)),
  tree_key=image_text.TEXT_KEY,
  describe_shapes=image_text.describe_shapes,
  template="testing",
  settings_from_shapes=image_text.settings_from_shapes,
  trained_grid=lambda shapes, config: image_text.trained_grid(
    shapes, model_settings(config), image_family=_image_family(model_settings(config))
  ),
  architecture_key=lambda config: image_text.architecture_key(
    config, model_settings(config), image_family=_image_family(model_settings(config))
  ),
  patch_kernel=None,
  fit_advice="Fit the image tower alone: name its weights in config.pretrained.",
  hf_refusal="--format=hf writes ViTs only",
  example="image-text pair",
  inputs=lambda s, images: (images, jnp.zeros((images.shape[0], s.text_len), jnp.int32)),
  image_tree=image_text.IMAGE,
)
FAMILIES: tuple[Family, ...] = (VIT, MIXER, BIT, TWO_TOWER)


def family_of(config: Any) -> Family:
  """The family of a model config (its ``model_type``; none: the ViT) or settings."""
  for family in FAMILIES:
    if isinstance(config, family.settings):
      return family
  model_type = config.get("model_type") or VIT.name
  for family in FAMILIES:
    if family.name == model_type:
      return family
  names = ", ".join(repr(f.name) for f in FAMILIES)
  raise errors.ConfigError(
    f"Unknown config.model.model_type={model_type!r}; choose one of {names}."
  )


def family_of_shapes(shapes: Shapes) -> Family:
  """The family whose parameter trees have one of ``shapes``' paths (else the ViT)."""
  return next((f for f in FAMILIES if f.tree_key is not None and f.tree_key in shapes), VIT)


def model_settings(config: Any) -> Settings:
  """The checked settings of a model config, by its family (settings as they are)."""
  family = family_of(config)
  if isinstance(config, family.settings):
    return config
  if family is TWO_TOWER:  # its image model is read by the image model's family
    return TwoTowerSettings.from_config(config, image=model_settings(config.image))
  return family.settings.from_config(config)


def variant_settings(name: str) -> Settings:
  """The settings of the registered variant ``name`` (`variants.get_model_config`): what a
  reader starts from and changes with one ``replace``."""
  return model_settings(variants.get_model_config(name))


def image_settings(config: Any) -> Settings:
  """The image model's settings of a model config: a two-tower model's image tower, any
  other model itself."""
  settings = model_settings(config)
  return settings.image if family_of(settings).image_tree else settings


def image_params(params: Any, config: Any) -> Any:
  """The image model's parameters in ``params`` of a model config: a two-tower model's
  image tower (`Family.image_tree`), any other model's whole tree."""
  tree = family_of(config).image_tree
  return params[tree] if tree else params


def is_mixer(config: Any) -> bool:
  """Whether a model config (or settings) describes an MLP-Mixer."""
  return family_of(config) is MIXER


def is_bit(config: Any) -> bool:
  """Whether a model config (or settings) describes a BiT ResNet."""
  return family_of(config) is BIT


def is_two_tower(config: Any) -> bool:
  """Whether a model config (or settings) describes a two-tower image-text model (a text
  tower beside the image model: contrastive runs, SigLIP, CLIP, LiT)."""
  return family_of(config) is TWO_TOWER
