"""timm's `Eva` (eva.py: DINOv3, EVA-02, PE, RoPE-ViT) <-> our parameters, numpy only: one
table of arrays (`eva_table`) read both ways, the reader of an Eva state dict with the
arguments of its architecture name (`read_eva`, `read`), and the export's `timm_model.json`
(`model_spec`); what the arguments mean for our settings is `eva_config.py`.

What an Eva computes and the arrays do not show is in its constructor arguments: the
rotary embedding (``rope_type`` 'cat' is our 'eva' kind, 'dinov3' DINOv3's, 'mixed' the
learned frequencies of Naver's RoPE-Mixed, ``rope.freqs`` [2, depth, H, Dh / 2] split into
each layer's ``rope_freqs``; ``rope_grid_indexing``), pooling (``'map'``: Perception
Encoder's attention pooling over every token, ``attn_pool_*`` its heads and MLP), LayerNorm
epsilon, LayerScale init. timm's ``EvaAttention`` has no key bias (``q_bias``/``v_bias``,
our ``qkv_bias='qv'``); its ``AttentionRope`` (``attn_type='rope'``: PE, RoPE-ViT) computes
the same with a key bias in ``qkv.bias`` (our ``'all'``). Either fuses ``qkv`` or keeps
``q_proj``/``k_proj``/``v_proj`` apart (both read), and builds its MLP from ``swiglu_mlp``,
``scale_mlp`` (EVA-02's inner norm) and ``swiglu_align_to`` (a split SwiGLU). The export
fixes each of those by keyword, under a name whose registered LayerNorm has the model's
epsilon.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import numpy as np
from flax import traverse_util

from vit_jax import models
from vit_jax.infra import errors
from vit_jax.infra.aliases import Params
from vit_jax.models import attention, options, vit_shapes
from vit_jax.weights import tensor_table
from vit_jax.weights.tensor_table import Row, rows
from vit_jax.weights.timm import arguments, eva_config, names, shared_rows

TIMM_FREQS = "rope.freqs"  # timm's mixed frequencies, [2, depth, H, Dh / 2]


def _one_layer() -> tensor_table.Layout:
  """One layer's [2, H, Dh / 2] mixed frequencies <-> its [1, 2, H, Dh / 2] part of timm's
  ``rope.freqs`` held depth first (`_depth_first`), so that parts split the first axis."""
  return tensor_table.Layout(lambda f: f[None], lambda f: f[0])


def _depth_first(tensors: dict[str, Any], axes: tuple[int, ...]) -> dict[str, Any]:
  """``tensors`` with ``rope.freqs`` transposed by ``axes`` (its layer axis moved)."""
  if TIMM_FREQS not in tensors:
    return tensors
  return {**tensors, TIMM_FREQS: np.ascontiguousarray(np.transpose(tensors[TIMM_FREQS], axes))}


def eva_table(
  depth: int,
  num_heads: int,
  *,
  fused_qkv: bool,
  mlp: str,
  key_bias: bool = False,
  mixed: bool = False,
  map_heads: Optional[int] = None,
) -> list[Row]:
  """Every array of a timm Eva of this layout, ours <-> timm's (the optional ones where a
  model may lack them): ``fused_qkv``, one ``qkv`` or ``q/k/v_proj``; ``mlp`` our kind;
  ``key_bias``, AttentionRope's biases (``qkv.bias``, a ``k_proj.bias``); ``mixed``, a layer's
  part of ``rope.freqs`` (held depth first); ``map_heads``, the heads of an attention pool."""
  optional = dict(required=False)
  heads_in, heads_bias = tensor_table.heads_in(num_heads), tensor_table.heads_bias(num_heads)
  table = [
    Row("embedding/kernel", "patch_embed.proj.weight", tensor_table.CONV),
    Row("embedding/bias", "patch_embed.proj.bias", **optional),  # none with norm_pre
    Row(vit_shapes.POSEMB, "pos_embed", **optional),
    Row("cls", "cls_token", **optional),
    Row("registers", "reg_token", **optional),
    *rows("Transformer/norm_pre", "norm_pre", **optional),
    *rows("Transformer/encoder_norm", "norm", **optional),
    *rows("fc_norm", "fc_norm", **optional),
    *rows("head", "head", tensor_table.DENSE, **optional),
  ]
  for i in range(depth):
    ours, theirs = f"Transformer/encoderblock_{i}/", f"blocks.{i}."
    att, attn = ours + "MultiHeadDotProductAttention_1/", theirs + "attn."
    for j, (name, short) in enumerate((("query", "q"), ("key", "k"), ("value", "v"))):
      part = (j, 3) if fused_qkv else None
      if fused_qkv:
        table.append(Row(f"{att}{name}/kernel", attn + "qkv.weight", heads_in, part))
        bias = attn + "qkv.bias" if key_bias else f"{attn}{short}_bias"
      else:
        table.append(Row(f"{att}{name}/kernel", f"{attn}{short}_proj.weight", heads_in))
        bias = f"{attn}{short}_proj.bias"
      if key_bias:  # AttentionRope: every projection biased (or none)
        table.append(Row(f"{att}{name}/bias", bias, heads_bias, part, required=False))
      elif name != "key":  # EvaAttention has no key bias
        table.append(Row(f"{att}{name}/bias", bias, heads_bias, **optional))
    if mixed:
      table.append(Row(att + attention.MIXED_FREQS, TIMM_FREQS, _one_layer(), (i, depth)))
    table.append(Row(att + "out/kernel", attn + "proj.weight", tensor_table.heads_out(num_heads)))
    table.append(Row(att + "out/bias", attn + "proj.bias"))
    table += rows(att + "norm", attn + "norm", **optional)  # scale_attn_inner
    table += rows(ours + "LayerNorm_0", theirs + "norm1")
    table += rows(ours + "LayerNorm_2", theirs + "norm2")
    table.append(Row(ours + "LayerScale_attention/scale", theirs + "gamma_1", **optional))
    table.append(Row(ours + "LayerScale_mlp/scale", theirs + "gamma_2", **optional))
    mlp_ours, mlp_theirs = ours + "MlpBlock_3/", theirs + "mlp."
    if mlp == options.MLP:
      layers = (("Dense_0", "fc1"), ("Dense_1", "fc2"))
    elif mlp == options.SWIGLU:
      layers = (("fc1_g", "fc1_g"), ("fc1_x", "fc1_x"), ("fc2", "fc2"))
      table += rows(mlp_ours + "norm", mlp_theirs + "norm", **optional)
    else:
      layers = (("fc1", "fc1"), ("fc2", "fc2"))
    for a, b in layers:
      table += rows(mlp_ours + a, mlp_theirs + b, tensor_table.DENSE)
  if map_heads:
    table += shared_rows.map_head_rows(map_heads)
  return table


_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def from_timm(
  tensors: dict[str, np.ndarray], num_heads: int, source: str, map_heads: Optional[int] = None
) -> Params:
  """Our per-layer parameter tree of a timm Eva state dict (its MLP told by its arrays:
  ``fc1_g`` split SwiGLU; ``fc1`` twice ``fc2``'s input, a fused one; else the GELU MLP;
  AttentionRope's key bias and mixed RoPE's frequencies by theirs); ``map_heads``: the
  heads of its attention pool (``global_pool='map'``)."""
  depth = 1 + max((int(m[1]) for k in tensors if (m := _BLOCK.match(k))), default=-1)
  fc1, fc2 = tensors.get("blocks.0.mlp.fc1.weight"), tensors.get("blocks.0.mlp.fc2.weight")
  mlp = options.SWIGLU if "blocks.0.mlp.fc1_g.weight" in tensors else options.MLP
  if fc1 is not None and fc2 is not None and fc1.shape[0] == 2 * fc2.shape[1]:
    mlp = options.SWIGLU_FUSED
  fused_qkv = "blocks.0.attn.qkv.weight" in tensors
  key_bias = "blocks.0.attn.qkv.bias" in tensors or "blocks.0.attn.k_proj.bias" in tensors
  table = eva_table(
    depth,
    num_heads,
    fused_qkv=fused_qkv,
    mlp=mlp,
    key_bias=key_bias,
    mixed=TIMM_FREQS in tensors,
    map_heads=map_heads,
  )
  tensors = _depth_first(tensors, (1, 0, 2, 3))  # [depth, 2, H, Dh / 2]
  return tensor_table.from_torch(table, tensors, source, "Eva")


def _shapes(params: Params) -> dict[str, tuple[int, ...]]:
  return {k: np.shape(v) for k, v in traverse_util.flatten_dict(params, sep="/").items()}


def read_eva(
  tensors: dict[str, Any], timm_name: str, args: dict[str, Any], source: str
) -> tuple[models.ModelSettings, Params]:
  """(model settings, per-layer params) of a timm Eva state dict; ``args``: its registered
  arguments updated with the stored ones (the input statistics are the caller's)."""
  args = {**eva_config.DEFAULTS, **args}
  problems = eva_config.unsupported(args)
  if problems:
    raise errors.CheckpointError(
      f"{source}: timm's {timm_name!r} has {', '.join(problems)}, which this ViT does not compute."
    )
  if not args.get("num_heads"):
    raise errors.CheckpointError(
      f"{source}: no head count for timm Eva {timm_name!r}: put timm's config.json "
      "(architecture, model_args with num_heads) next to the .safetensors file."
    )
  heads = int(args["num_heads"])
  map_heads = (args["attn_pool_num_heads"] or heads) if args["global_pool"] == "map" else None
  params = from_timm(tensors, heads, source, map_heads)
  shapes = _shapes(params)
  template = models.variant_settings("testing")
  settings = vit_shapes.settings_from_shapes(shapes, template, "none")
  return eva_config.apply_args(settings, args, "cls" in shapes, source), params


def read(checkpoint: arguments.Checkpoint) -> arguments.Loaded:
  """The family's reader: `read_eva` with the input statistics and, for RoPE without a
  table (DINOv3), the size of the pretrained config (as a ResNet's)."""
  c = checkpoint
  settings, params = read_eva(c.tensors, c.name, c.args, c.source)
  settings = settings.replace(**arguments.input_stats(c.pretrained_cfg, c.source))
  return arguments.loaded(settings, params, c.class_names, arguments.input_size(c.pretrained_cfg))


def check_exportable(config: models.Settings) -> None:
  """One ConfigError listing what timm's Eva cannot represent of ``config``."""
  problems = []
  if config.classifier not in ("token", "gap", "map"):
    problems.append(f"classifier {config.classifier!r} (timm's Eva: 'token', 'gap' or 'map')")
  if config.classifier == "map" and not config.map_include_prefix and config.num_prefix_tokens:
    problems.append("a map head over the patches only (timm's Eva's sees every token)")
  if config.posemb not in ("learn", "none"):
    problems.append(f"position embeddings {config.posemb!r} (timm's Eva: 'learn' or 'none')")
  if config.layer_norm_epsilon not in eva_config.EPSILONS:
    problems.append(f"LayerNorm epsilon {config.layer_norm_epsilon:g} (timm's Eva: 1e-5, 1e-6)")
  if (config.activation, config.gelu_approximate) != ("gelu", False):
    problems.append("an activation other than the exact GELU")
  if config.rope == "dinov3" and config.rope_normalize_coords != "separate":
    problems.append("DINOv3 coordinates normalised other than per axis")
  if config.representation_size is not None or config.resnet is not None or config.axial:
    problems.append("a representation layer, ResNet stem or Axial-ViT blocks")
  if config.norm_pre and config.posemb != "learn":
    problems.append("a norm before the blocks without a table (timm's Eva has no patch bias)")
  if problems:
    raise errors.ConfigError(
      "This model cannot be exported to timm's Eva: " + "; ".join(problems) + "."
    )


def _registered_name(epsilon: float, kwargs: dict[str, Any]) -> str:
  """An Eva architecture registered with LayerNorm ``epsilon``, every argument one this
  ViT computes, that leaves unset those ``kwargs`` sets to None (timm's create_model drops
  None keywords: a registered LayerScale or reference grid would stay)."""
  unset = [k for k, v in kwargs.items() if v is None]
  for name in sorted(names.names()):
    args = {**eva_config.DEFAULTS, **names.model_args(name)}
    if names.module(name) == eva_config.MODULE and args["layer_norm_eps"] == epsilon:
      if not eva_config.unsupported(args) and all(args.get(k) is None for k in unset):
        return name
  raise errors.ConfigError(
    f"This model cannot be exported to timm's Eva: no architecture timm registers with "
    f"LayerNorm epsilon {epsilon:g} leaves {', '.join(unset)} unset."
  )


def _mlp_ratio(hidden: int, width: int) -> float:
  """timm's hidden width is int(width * ratio): a ratio that truncates to ``hidden``."""
  return hidden / width if int(width * (hidden / width)) == hidden else (hidden + 0.5) / width


def model_spec(
  config: models.Settings, *, num_classes: Optional[int], image_size: tuple[int, int]
) -> dict[str, Any]:
  """{'model_name', 'kwargs', 'pretrained_cfg_overlay'} for `timm.create_model`: a name
  registered with the model's LayerNorm epsilon, every other choice by keyword; no head is
  timm's ``num_classes=0``."""
  config = models.model_settings(config)
  check_exportable(config)
  num_classes = num_classes or 0
  t, d, patch = config.transformer, config.hidden_size, tuple(config.patches.size)
  module = models.create_model(config, num_classes=num_classes)
  rope = {v: k for k, v in eva_config.ROPE_KINDS.items()}
  pool = config.classifier == "map"
  side = config.rope_ref_grid
  kwargs = dict(
    img_size=list(image_size),
    patch_size=patch[0] if patch[0] == patch[1] else list(patch),
    embed_dim=d,
    depth=t.num_layers,
    num_heads=t.num_heads,
    mlp_ratio=_mlp_ratio(t.mlp_dim, d),
    attn_type="rope" if config.qkv_bias == options.QKV_BIAS_ALL else "eva",
    qkv_bias=config.qkv_bias != options.QKV_BIAS_NONE,
    qkv_fused=True,
    swiglu_mlp=config.mlp != options.MLP,
    scale_mlp=bool(config.mlp_norm),
    scale_attn_inner=bool(config.attention_norm),
    swiglu_align_to=1 if config.mlp == options.SWIGLU else 0,  # 1: split, width kept
    class_token=module.has_class_token,
    num_reg_tokens=config.num_registers,
    global_pool={v: k for k, v in eva_config.POOLS.items()}[config.classifier],
    use_fc_norm=config.fc_norm,
    use_post_transformer_norm=config.final_norm and not config.fc_norm,
    use_abs_pos_emb=config.posemb == "learn",
    no_embed_class=config.posemb_patches_only,
    init_values=config.layer_scale_init,
    use_rot_pos_emb=config.rope is not None,
    rope_type=rope.get(config.rope, "cat"),
    rope_temperature=config.rope_temperature,
    rope_rotate_half=config.rope_rotate_half,
    rope_grid_offset=config.rope_grid_offset,
    rope_grid_indexing=config.rope_grid_indexing,
    use_pre_transformer_norm=config.norm_pre,
    ref_feat_shape=None if side is None else [side, side],
    num_classes=num_classes,
  )
  if pool:
    kwargs["attn_pool_num_heads"] = config.map_num_heads or t.num_heads
    kwargs["attn_pool_mlp_ratio"] = _mlp_ratio(config.map_mlp_dim or t.mlp_dim, d)
  return {
    "architecture": (
      f"Eva: patch {'x'.join(map(str, patch))}, width {d}, depth {t.num_layers}, "
      f"{t.num_heads} heads, MLP {t.mlp_dim} ({config.mlp}), RoPE {config.rope}, "
      f"{num_classes} classes (model_name only picks timm's class and LayerNorm; kwargs set "
      "the rest)"
    ),
    "model_name": _registered_name(config.layer_norm_epsilon, kwargs),
    "kwargs": kwargs,
    "pretrained_cfg_overlay": {
      "num_classes": num_classes,
      "input_size": [3, *image_size],  # without a table, what says the size
      "mean": list(config.input_mean),
      "std": list(config.input_std),
    },
  }


def to_timm(params: Params, config: models.Settings) -> dict[str, np.ndarray]:
  """timm's Eva state dict (numpy, float32, fused ``qkv``) of a per-layer parameter tree."""
  config = models.model_settings(config)
  flat = shared_rows.fold_patch_bias(tensor_table.flat_float32(params), config)
  t = config.transformer
  pool = config.classifier == "map"
  table = eva_table(
    t.num_layers,
    t.num_heads,
    fused_qkv=True,
    mlp=config.mlp,
    key_bias=config.qkv_bias == options.QKV_BIAS_ALL,
    mixed=config.rope == "mixed",
    map_heads=(config.map_num_heads or t.num_heads) if pool else None,
  )
  return _depth_first(tensor_table.to_torch(table, flat), (1, 0, 2, 3))  # [2, depth, H, Dh / 2]
