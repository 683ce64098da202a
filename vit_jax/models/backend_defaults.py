"""What a run computes with when its config leaves the attention or the dtype unset: the
configuration that measured fastest on its backend, decided here once.

    choice = backend_defaults.choose(settings, backend_defaults.platform(mesh.devices.flat))
    settings = choice.apply(settings)      # the resolver; the plan and main print choice.describe()

`execution.UNSET` (None) is "unset" for ``config.model.attention_impl`` and
``config.model.dtype``; any other value is the user's and always wins. Per backend
(`BACKEND_DEFAULTS`):

- GPU: cuDNN's fused attention and bfloat16 compute with float32 parameters (timm's
  autocast). An H200 (`docs/performance.md`, "On a GPU", ViT-B/16 train at batch 256,
  bf16) ran 3,412 img/s with cuDNN, 2,847 with the einsum attention, 2,613 with XLA's.
  cuDNN's attention is not taken where it cannot run (`cudnn_refusal`): a float32 compute,
  relative position logits, attention dropout (both need the weights), or a head size
  cuDNN refuses; those get the einsum attention. A text tower's masked attention always
  takes the einsum path (`attention.MultiHeadDotProductAttention`).
- CPU and TPU: the einsum attention in float32, as before (on a CPU it compiled to less
  memory traffic and faster steps than XLA's `dot_product_attention`: README, Performance).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Optional

from vit_jax.models import execution, families, posemb
from vit_jax.models.settings import ModelSettings

GPU = "gpu"
# `jax.Device.platform` names -> the backend they are: a GPU is 'gpu' on a machine that has
# one and 'cuda' among the plan's compile-only devices.
_PLATFORMS = {"cuda": GPU, "gpu": GPU, "cpu": "cpu", "tpu": "tpu"}
# Each backend's choice for an unset (attention, compute dtype).
BACKEND_DEFAULTS: dict[str, tuple[str, str]] = {
  "cpu": (execution.EINSUM, "float32"),
  "tpu": (execution.EINSUM, "float32"),
  GPU: (execution.CUDNN, "bfloat16"),
}
_WHY = {
  "cpu": "the CPU's fastest measured",
  "tpu": "the TPU's default",
  GPU: "the GPU's fastest measured",
}
# What JAX's cuDNN attention takes (`check_is_flash_attention`): a head size that is a
# multiple of 8 and at most 128 (256 from Hopper on; 128 holds on every GPU), in 16 bits.
CUDNN_HEAD_MULTIPLE = 8
CUDNN_HEAD_MAX = 128
CUDNN_DTYPES = ("bfloat16", "float16")


def platform(devices: Iterable[Any]) -> str:
  """The backend of ``devices`` (a mesh's, `jax.devices()`): 'gpu', 'cpu' or 'tpu'."""
  name = next(iter(devices)).platform
  return _PLATFORMS.get(name, name)


def cudnn_refusal(settings: ModelSettings, dtype: str) -> Optional[str]:
  """Why cuDNN's attention cannot run this ViT in ``dtype``; None when it can."""
  head = settings.hidden_size // settings.transformer.num_heads
  if dtype not in CUDNN_DTYPES:
    return f"cuDNN's attention needs a 16-bit compute, not config.model.dtype={dtype!r}"
  if settings.posemb == posemb.RELATIVE:
    return "relative position logits (config.model.posemb='relative') need the einsum path"
  if settings.transformer.attention_dropout_rate > 0:
    return "attention dropout needs the attention weights"
  if head % CUDNN_HEAD_MULTIPLE or head > CUDNN_HEAD_MAX:
    return (
      f"cuDNN's attention takes heads of a multiple of {CUDNN_HEAD_MULTIPLE} up to "
      f"{CUDNN_HEAD_MAX} values, not {head}"
    )
  return None


@dataclasses.dataclass(frozen=True)
class Choice:
  """The attention and compute dtype a run gets, and why, one phrase each."""

  platform: str
  attention_impl: Optional[str]  # None: a model without attention (Mixer, BiT)
  dtype: str
  attention_why: str
  dtype_why: str

  def apply(self, settings: Any) -> Any:
    """``settings`` with its unset fields filled (a two-tower model's: its image tower's)."""
    changes: dict[str, Any] = {"dtype": self.dtype}
    if self.attention_impl is not None:
      changes["attention_impl"] = self.attention_impl
    return settings.replace(**changes)

  def describe(self) -> str:
    """One line for a run's log and the plan."""
    attention = (
      f"attention {self.attention_impl} ({self.attention_why}), "
      if self.attention_impl is not None
      else ""
    )
    return (
      f"Execution on {self.platform.upper()}: {attention}compute {self.dtype} with float32 "
      f"parameters ({self.dtype_why})."
    )


def choose(settings: Any, platform_name: str) -> Choice:
  """The execution of a model's ``settings`` on the ``platform_name`` backend ('gpu',
  'cuda', 'cpu', 'tpu'): each field the config set kept, each unset one at
  `BACKEND_DEFAULTS`' value where it applies."""
  platform_name = _PLATFORMS.get(platform_name, platform_name)
  image = families.image_settings(settings)
  attention_default, dtype_default = BACKEND_DEFAULTS.get(platform_name, BACKEND_DEFAULTS["cpu"])
  why = _WHY.get(platform_name, f"no default measured on {platform_name}: the CPU's")
  if image.dtype is execution.UNSET:
    dtype, dtype_why = dtype_default, f"unset: {why}"
  else:
    dtype, dtype_why = image.dtype, "set by config.model.dtype"
  if not isinstance(image, ModelSettings):
    return Choice(platform_name, None, dtype, "", dtype_why)
  if image.attention_impl is not execution.UNSET:
    return Choice(
      platform_name, image.attention_impl, dtype, "set by config.model.attention_impl", dtype_why
    )
  attention, attention_why = attention_default, f"unset: {why}"
  if attention == execution.CUDNN:
    refusal = cudnn_refusal(image, dtype)
    if refusal:
      attention, attention_why = execution.EINSUM, f"unset: not cuDNN's, as {refusal}"
  return Choice(platform_name, attention, dtype, attention_why, dtype_why)
