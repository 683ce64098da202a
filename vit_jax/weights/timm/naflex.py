"""timm's NaFlexViT (naflexvit.py: the SigLIP 2 NaFlex towers, ...) read as the ViT it is,
numpy only: its state dict rewritten as timm's `VisionTransformer`'s (`to_vit_tensors`)
and its arguments as that ViT's (`vit_args`), then read by the ViT's reader
(`vit_config`): the family's `read` and `config_from_name`.

Followed: timm's `NaFlexEmbeds` on an image tensor (a linear patch embedding over
channels-last patches; a learned [1, gh, gw, D] table interpolated with
``pos_embed_interp_mode`` and ``pos_embed_antialias`` as `F.interpolate` does, which
`jax.image.resize` equals; a factorised table's two axes each interpolated linearly and
added). The learned 2-D table is kept at its stored grid and resized to each input's grid
by the model as timm does (`table_resample`): NaFlex inputs (`vit_jax.models.naflex`)
at any budget and aspect ratio. Not supported: the arguments `unsupported` names (a MAP
head beside prefix tokens: timm's NaFlexViT pools the patches only, its ViT every token);
a factorised table, or align_corners, is read at one square grid.

Written (`model_spec`, `to_timm`): a ViT of ours whose learned table is resized to every
input (``posemb_grid``: a NaFlex tower, a run trained on NaFlex inputs) as the NaFlexViT
this reader reads back, through the ViT's own writer (`vit.py`): the convolution's kernel
as the linear patch embedding, the table's patch rows as the [1, gh, gw, D] table, and its
prefix rows (the class token's and registers' positions, which never move) added to those
tokens.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import models
from vit_jax.infra import errors
from vit_jax.infra.aliases import Params
from vit_jax.weights.timm import arguments, eva_config, names, vit, vit_config

MODULE = "naflexvit"  # timm's module of these architectures (`names.module`)
# The name an export is written under: it picks the class; its arguments set every field.
WRITTEN_NAME = "naflexvit_base_patch16_gap"
# NaFlexVitCfg's defaults for the fields read here (timm 1.0.31).
DEFAULTS: dict[str, Any] = dict(
  names.BASE_SHAPES,
  init_values=None,
  class_token=False,
  reg_tokens=0,
  pos_embed="learned",
  pos_embed_grid_size=[16, 16],
  pos_embed_interp_mode="bicubic",
  pos_embed_antialias=True,
  pos_embed_align_corners=False,
  pos_embed_ar_preserving=False,
  final_norm=True,
  fc_norm=None,
  global_pool="map",
  act_layer=None,
)
_METHODS = {"bicubic": "cubic", "bilinear": "linear"}  # torch mode -> jax.image.resize's
# Argument -> the values read at a fixed grid (a callable: a check of the value).
_READ: dict[str, Any] = {
  "pos_embed": ("learned", "factorized"),
  "pos_embed_interp_mode": tuple(_METHODS),
  "pos_embed_antialias": (True, False),  # False: bilinear only (checked below)
  "pos_embed_align_corners": (True, False),  # True: bilinear only (checked below)
  "final_norm": (True, False),
  "global_pool": ("token", "avg", "map"),
  "act_layer": (None, "gelu", "gelu_tanh", "quick_gelu"),
  "pos_embed_ar_preserving": (True, False),  # a square grid either way
  "in_chans": (3,),
}
# Fields that only fix shapes, or that the plain ViT computes as they are.
_SHAPES = {"patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias"}
_SHAPES |= {"init_values", "class_token", "reg_tokens", "pos_embed_grid_size", "fc_norm"}
_SHAPES |= {"num_classes", "img_size"}


def unsupported(args: dict[str, Any]) -> list[str]:
  """``key=value`` of each NaFlexViT argument (``args``: over `DEFAULTS`) not computed at a
  fixed grid."""
  problems = []
  for key, value in args.items():
    accepted = _READ.get(key)
    if key in _SHAPES or (accepted is not None and value in accepted):
      continue
    problems.append(f"{key}={value!r}")
  bicubic = args.get("pos_embed_interp_mode") == "bicubic"
  if args.get("pos_embed_antialias") is False and bicubic:
    problems.append("pos_embed_antialias=False with bicubic resampling")
  if args.get("pos_embed_align_corners") and (bicubic or args.get("pos_embed_antialias")):
    problems.append("pos_embed_align_corners=True other than bilinear without antialiasing")
  prefix = int(bool(args.get("class_token"))) + int(args.get("reg_tokens") or 0)
  if args.get("global_pool") == "map" and prefix:
    problems.append(f"global_pool='map' over the patches beside {prefix} prefix token(s)")
  return problems


def unexpressed(name: str) -> list[str]:
  """`unsupported` of the arguments timm registers for architecture ``name``."""
  return unsupported({**DEFAULTS, **names.model_args(name)})


def vit_args(args: dict[str, Any]) -> dict[str, Any]:
  """timm `VisionTransformer` arguments of the ViT a NaFlexViT is at a fixed grid: its
  table covers the patches only; ``fc_norm`` None is a norm after average pooling."""
  a = {**DEFAULTS, **args}
  out = {k: a[k] for k in ("patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio")}
  fc_norm = a["global_pool"] == "avg" if a["fc_norm"] is None else bool(a["fc_norm"])
  fc_norm = fc_norm and bool(a["final_norm"])  # final_norm False: neither norm
  out.update(
    final_norm=bool(a["final_norm"]),
    qkv_bias=a["qkv_bias"],
    class_token=a["class_token"],
    reg_tokens=a["reg_tokens"],
    global_pool=a["global_pool"],
    fc_norm=fc_norm,
    no_embed_class=True,
    act_layer=a["act_layer"],
  )
  if a["init_values"]:
    out["init_values"] = a["init_values"]
  return out


def stored_grid(args: dict[str, Any]) -> tuple[int, int]:
  """The grid the position table is stored at (``pos_embed_grid_size``)."""
  gh, gw = {**DEFAULTS, **args}["pos_embed_grid_size"]
  return int(gh), int(gw)


def _align_corners(table: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
  """A [h, w, D] table at ``hw`` by bilinear interpolation whose corner samples sit on the
  corner cells (`F.interpolate(..., align_corners=True)`, no antialiasing): separable."""
  out = np.asarray(table, np.float32)
  for axis, n in enumerate(hw):
    m = out.shape[axis]
    src = np.arange(n) * ((m - 1) / (n - 1) if n > 1 else 0.0)  # [n] source positions
    lo = np.clip(np.floor(src).astype(int), 0, m - 1)
    hi = np.minimum(lo + 1, m - 1)
    frac = (src - lo).astype(np.float32).reshape([-1 if i == axis else 1 for i in range(3)])
    out = np.take(out, lo, axis) * (1 - frac) + np.take(out, hi, axis) * frac
  return out


def _resize(
  table: np.ndarray, hw: tuple[int, int], method: str, antialias: bool, corners: bool = False
) -> np.ndarray:
  """A [h, w, D] table at ``hw``, as `F.interpolate` computes (``corners``: align_corners)."""
  if tuple(table.shape[:2]) == tuple(hw):
    return np.asarray(table, np.float32)
  if corners:
    return _align_corners(table, hw)
  out = jax.image.resize(
    jnp.asarray(table, jnp.float32), (*hw, table.shape[-1]), method=method, antialias=antialias
  )
  return np.asarray(out, np.float32)


def position_table(
  tensors: dict[str, np.ndarray], args: dict[str, Any], grid: tuple[int, int], source: str
) -> np.ndarray:
  """The patches' position table [1, gh * gw, D] a NaFlexViT adds at ``grid``."""
  a = {**DEFAULTS, **args}
  if tuple(grid) == stored_grid(args):  # timm adds the stored table as it is
    size = grid
  elif a["pos_embed_ar_preserving"]:  # timm interpolates to the longer side, then crops
    side = max(grid)
    size = (side, side)
  else:
    size = grid
  if "embeds.pos_embed" in tensors:
    table = np.asarray(tensors["embeds.pos_embed"], np.float32)[0]  # [gh, gw, D]
    method = _METHODS[a["pos_embed_interp_mode"]]
    antialias, corners = bool(a["pos_embed_antialias"]), bool(a["pos_embed_align_corners"])
    resized = _resize(table, size, method, antialias, corners)
  elif "embeds.pos_embed_y" in tensors and "embeds.pos_embed_x" in tensors:
    y = np.asarray(tensors["embeds.pos_embed_y"], np.float32)[0]  # [gh, D]
    x = np.asarray(tensors["embeds.pos_embed_x"], np.float32)[0]  # [gw, D]
    y = _resize(y[:, None], (size[0], 1), "linear", False)  # [h, 1, D]
    x = _resize(x[None], (1, size[1]), "linear", False)  # [1, w, D]
    resized = y + x  # [h, w, D]
  else:
    raise errors.CheckpointError(
      f"{source}: a NaFlexViT state dict without embeds.pos_embed (or its factorised "
      "embeds.pos_embed_y and _x): this package reads NaFlexViT with a learned table."
    )
  resized = resized[: grid[0], : grid[1]]
  return resized.reshape(1, -1, resized.shape[-1])


def to_vit_tensors(
  tensors: dict[str, np.ndarray], args: dict[str, Any], grid: tuple[int, int], source: str
) -> dict[str, np.ndarray]:
  """timm `VisionTransformer`'s state dict of a NaFlexViT's at the fixed ``grid``: the
  linear patch embedding over (ph, pw, C) patches as the convolution's kernel, the
  prefix tokens renamed, the table resampled; every other array as it is."""
  patch = {**DEFAULTS, **args}["patch_size"]
  ph, pw = (patch, patch) if isinstance(patch, int) else patch
  out = {}
  for key, value in tensors.items():
    if not key.startswith("embeds."):
      out[key] = value
    elif key == "embeds.proj.weight":
      value = np.asarray(value)
      if value.ndim != 2 or value.shape[1] % (ph * pw):
        raise errors.CheckpointError(
          f"{source}: NaFlexViT embeds.proj.weight {value.shape} is not a linear patch "
          f"embedding of {ph}x{pw} patches."
        )
      kernel = value.reshape(value.shape[0], ph, pw, -1)  # [D, ph, pw, C]
      out["patch_embed.proj.weight"] = kernel.transpose(0, 3, 1, 2)  # [D, C, ph, pw]
    elif key in ("embeds.proj.bias", "embeds.cls_token", "embeds.reg_token"):
      out[{"embeds.proj.bias": "patch_embed.proj.bias"}.get(key, key[len("embeds.") :])] = value
    elif not key.startswith("embeds.pos_embed"):
      raise errors.CheckpointError(f"{source}: NaFlexViT array {key!r} is not read.")
  out["pos_embed"] = position_table(tensors, args, grid, source)
  return out


def table_resample(args: dict[str, Any]) -> Optional[dict[str, Any]]:
  """The model config's ``posemb_*`` fields that resize the stored table to any grid as
  timm does (`vit_jax.models.naflex.TableResample`); None where only a fixed grid is
  read (a factorised table, or align_corners)."""
  a = {**DEFAULTS, **args}
  if a["pos_embed"] != "learned" or a["pos_embed_align_corners"]:
    return None
  return dict(
    posemb_grid=stored_grid(args),
    posemb_resample=str(a["pos_embed_interp_mode"]),
    posemb_antialias=bool(a["pos_embed_antialias"]),
    posemb_keep_aspect=bool(a["pos_embed_ar_preserving"]),
  )


def read(checkpoint: arguments.Checkpoint) -> arguments.Loaded:
  """The family's reader: a NaFlexViT read as the ViT it is, its stored table resized to
  each input's grid as timm does (`table_resample`), at its pretrained square input size
  (else its stored table's grid); a table `table_resample` cannot express is resampled
  once, to that size's grid."""
  c = checkpoint
  problems = unsupported({**DEFAULTS, **c.args})  # the stored arguments too
  if problems:
    raise errors.CheckpointError(
      f"{c.source}: timm NaFlexViT {c.name!r} with {', '.join(problems)}: not computed here."
    )
  stored = stored_grid(c.args)
  patch = vit_args(c.args)["patch_size"]
  size = arguments.input_size(c.pretrained_cfg)
  grid = stored if size is None else (size[0] // patch, size[1] // patch)
  if grid[0] != grid[1]:
    raise errors.CheckpointError(
      f"{c.source}: NaFlexViT at input size {size}: this package reads it at a square grid."
    )
  resample = table_resample(c.args)
  vit = to_vit_tensors(c.tensors, c.args, stored if resample else grid, c.source)
  args = vit_args(c.args)
  settings, params = vit_config.read_vit(vit, c.name, args, c.pretrained_cfg, c.source)
  settings = settings.replace(**(resample or {"posemb_resample": None}))
  return arguments.loaded(settings, params, c.class_names, (grid[0] * patch, grid[1] * patch))


def config_from_name(
  name: str, args: dict[str, Any], source: str
) -> tuple[models.ModelSettings, tuple[int, int]]:
  """The family's settings of an architecture ``name``: the ViT it is at its stored
  table's grid."""
  grid = stored_grid(args)
  resample = table_resample(args)
  args = vit_args(args)
  args["img_size"] = [g * args["patch_size"] for g in grid]
  settings, size = vit_config.config_of(name, args, source)
  return settings.replace(**(resample or {"posemb_resample": None})), size


def unwritable(config: models.Settings) -> list[str]:
  """What of a ViT ``config`` whose table is resized to every input timm's NaFlexViT (as
  this module reads it) does not compute, one phrase each."""
  settings = models.model_settings(config)
  problems = vit.unexportable(config)
  if settings.resnet is not None:
    problems.append("a ResNet stem (NaFlexViT embeds each patch linearly)")
  if settings.norm_pre:
    problems.append("a norm before the blocks (pre_norm)")
  if settings.layer_norm_epsilon != vit.LAYER_NORM_EPS:
    problems.append(f"LayerNorm epsilon {settings.layer_norm_epsilon:g}")
  if settings.classifier == "map" and settings.num_prefix_tokens:
    problems.append("a MAP head beside prefix tokens (NaFlexViT's pools the patches only)")
  if settings.posemb_resample == "bicubic" and not settings.posemb_antialias:
    problems.append("a bicubic table resize without antialiasing")
  return problems


def writes(config: models.Settings) -> bool:
  """Whether a ViT ``config`` is written as timm's NaFlexViT: not an Eva, its table resized
  to every input, nothing NaFlexViT does not compute (`unwritable`)."""
  if eva_config.is_eva(config) or config.get("posemb_grid") is None:
    return False
  return not unwritable(config)


def model_spec(
  config: models.Settings,
  *,
  num_classes: Optional[int],
  image_size: tuple[int, int],
) -> dict[str, Any]:
  """The export's `timm_model.json` (`vit.model_spec`'s keys): the ViT's arguments as
  NaFlexVitCfg's, every field this module reads given (the name's defaults differ)."""
  problems = unwritable(config)
  if problems:
    raise errors.ConfigError(
      "This model cannot be exported to timm's NaFlexViT: " + "; ".join(problems) + "."
    )
  settings = models.model_settings(config)
  spec = vit.model_spec(config, num_classes=num_classes, image_size=image_size)
  kept = ("img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio")
  kept += ("class_token", "global_pool", "fc_norm", "qkv_bias", "final_norm", "act_layer")
  kwargs = {key: spec["kwargs"][key] for key in kept + ("num_classes",)}
  kwargs.update(
    reg_tokens=settings.num_registers,
    init_values=settings.layer_scale_init,
    pos_embed="learned",
    pos_embed_grid_size=list(settings.posemb_grid),
    pos_embed_interp_mode=settings.posemb_resample,
    pos_embed_antialias=settings.posemb_antialias,
    pos_embed_ar_preserving=settings.posemb_keep_aspect,
    pos_embed_align_corners=False,
  )
  architecture = spec["architecture"].replace("ViT:", "NaFlexViT:", 1)
  return {**spec, "architecture": architecture, "model_name": WRITTEN_NAME, "kwargs": kwargs}


def to_timm(params: Params, config: models.Settings) -> dict[str, np.ndarray]:
  """timm NaFlexViT's state dict: timm `VisionTransformer`'s (`vit.to_timm`) with the
  patch embedding linear over (ph, pw, C) patches, the table [1, gh, gw, D] and each
  prefix token's position row added to the token."""
  settings = models.model_settings(config)
  tensors = vit.to_timm(params, config)
  gh, gw = settings.posemb_grid
  table = tensors.pop("pos_embed")[0]  # [P + gh * gw, D], P prefix rows (or none)
  prefix, patches = table[: len(table) - gh * gw], table[len(table) - gh * gw :]
  out = {"embeds.pos_embed": patches.reshape(1, gh, gw, -1)}
  kernel = tensors.pop("patch_embed.proj.weight")  # [D, C, ph, pw]
  out["embeds.proj.weight"] = kernel.transpose(0, 2, 3, 1).reshape(kernel.shape[0], -1)
  out["embeds.proj.bias"] = tensors.pop("patch_embed.proj.bias")
  for key in ("cls_token", "reg_token"):  # timm's order of the prefix rows
    if key in tensors:
      token = tensors.pop(key)  # [1, T, D]
      if len(prefix):  # the table has the prefix tokens' rows
        token, prefix = token + prefix[None, : token.shape[1]], prefix[token.shape[1] :]
      out["embeds." + key] = token
  return {**tensors, **out}
