"""Image-text contrastive training of a two-tower model (SigLIP, CLIP, LiT).

``config.contrastive``: ``loss`` ('sigmoid': SigLIP's, 'softmax': CLIP's; `run.contrastive`)
and ``lock_image`` (LiT: the image tower gets no gradient and no optimizer state, so it ends
the run exactly as it started; `frozen` names its subtree for `steps.build_steps`);
``cache_image_features`` (LiT: the train batches carry the locked tower's features,
computed once per example, `run.feature_cache`, in place of images).

The sigmoid loss is computed in the chunked ring form over the mesh's 'data' axis when
the batch is split over several devices there, so no device holds the global batch of
logits; the global batch (and so the loss) is the same whatever the process count.
Batches hold 'image' and 'text' (int32 [B, text_len], `data.captions`). With
``config.accum_steps`` > 1 the loss is still over the whole batch's negatives
(`Contrastive.accumulated_value_and_grad`): the same loss and gradient as one big batch.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.data.caption_settings import CaptionSettings
from vit_jax.data.dataset import DatasetInfo
from vit_jax.data.settings import Needs
from vit_jax.data.settings import Settings as DataSettings
from vit_jax.infra import errors, sharding
from vit_jax.infra.aliases import Batch
from vit_jax.models import create_model, family_of, image_text, is_two_tower, model_settings
from vit_jax.models.image_text import IMAGE
from vit_jax.models.two_tower import LOSS_INIT
from vit_jax.run import contrastive as losses
from vit_jax.run import feature_cache
from vit_jax.run.objectives.base import Field, Objective

LOSSES = tuple(LOSS_INIT)


def check_options(options: Any) -> None:
  """``config.contrastive``'s loss, by name."""
  if options.loss not in LOSSES:
    raise errors.ConfigError(
      f"Unknown config.contrastive.loss={options.loss!r}; choose one of {LOSSES}."
    )


def _check_model(model: Any) -> None:
  """The model (a config or settings) is a two-tower one."""
  if not is_two_tower(model):
    raise errors.ConfigError(
      "config.objective='contrastive' trains a two-tower model: set config.model to "
      "vit_jax.models.two_tower_config(...) (configs/siglip.py)."
    )


def check(config: ml_collections.ConfigDict) -> None:
  """A run config when it is resolved: a two-tower model, ``config.contrastive``'s loss,
  and a locked image tower that starts from weights."""
  _check_model(config.model)
  check_options(config.contrastive)
  if config.contrastive.lock_image and not config.pretrained:
    raise errors.ConfigError(
      "config.contrastive.lock_image=True keeps the image tower as it starts, but "
      "config.pretrained names no weights for it: set config.pretrained (LiT) or "
      "config.contrastive.lock_image=False."
    )


def data_needs(config: ml_collections.ConfigDict) -> Needs:
  """Captions (`CaptionSettings.from_config`: the data's own or made from the labels), and
  images prepared as the image tower expects."""
  return Needs(text=CaptionSettings.from_config(config), image_model=config.model.image)


def check_data(
  config: ml_collections.ConfigDict,
  model: Any,
  data: DataSettings,
  info: Optional[DatasetInfo],
) -> None:
  """The captions' tokenizer fits the text tower's vocabulary (once the data is read), and
  cached image features have one image per example."""
  text = data.text
  tokenizer = text.load_tokenizer(info.class_names) if info is not None else None
  if tokenizer is not None and tokenizer.vocab_size > model.text.vocab_size:
    size, have = tokenizer.vocab_size, model.text.vocab_size
    if text.tokenizer is not None:  # free text (`data.free_text`)
      raise errors.ConfigError(
        f"config.text.tokenizer={text.tokenizer!r} has {size} tokens, more than "
        f"config.model.text.vocab_size={have}: set it to {size} or more."
      )
    raise errors.ConfigError(
      f"config.model.text.vocab_size={have} is smaller than the {size} words of "
      f"{data.dataset!r}'s captions: set config.model.text.vocab_size={size} or more."
    )
  feature_cache.check(config.contrastive, data)


class Contrastive(Objective):
  """The contrastive objective of a two-tower model (`models.is_two_tower`); ``mesh``: the
  run's (None: the loss over the whole batch at once). Of `Objective`'s optional
  capabilities it has them all: a 'text' batch field, a locked tower (``frozen``), an image
  tower ``config.pretrained`` initialises, its own accuracy name and FLOPs count, cached
  features and the loss over the whole batch with accumulation."""

  # The evaluation's 'correct' / 'count' is in-batch image-to-text top-1, not a class
  # accuracy: logged under its own name (`evaluators.accuracy`), beside zero-shot's.
  accuracy_metric = "in_batch_top1"

  def __init__(
    self,
    model_config: Any,
    options: ml_collections.FrozenConfigDict,
    mesh: Optional[jax.sharding.Mesh] = None,
  ):
    settings = model_settings(model_config)
    _check_model(settings)
    check_options(options)
    if options.loss == "sigmoid" and settings.bias_init is None:
      raise errors.ConfigError(
        "config.contrastive.loss='sigmoid' needs the model's bias, but "
        "config.model.bias_init=None: set config.model.bias_init=-10.0 (SigLIP's) or "
        "config.contrastive.loss='softmax'."
      )
    self.settings = settings
    self.model = create_model(settings, num_classes=None)
    self.encoder = self.model.img  # the image tower (what fine-tuning and LiT read)
    self.text_len = settings.text_len
    self.loss_kind = options.loss
    self.frozen: tuple[str, ...] = (IMAGE,) if options.lock_image else ()
    self.pretrained_key = IMAGE  # config.pretrained initialises the image tower
    self.mesh = mesh
    self.batch_fields = {"text": ((self.text_len,), jnp.int32)}  # besides 'image', 'label'
    self.cache_features = bool(options.get("cache_image_features", False))

  def train_fields(self, crop: int) -> dict[str, Optional[Field]]:
    """With cached features, the train batch's 'image_features' [B, D] replace 'image'."""
    if not self.cache_features:
      return {}
    images = jax.ShapeDtypeStruct((1, crop, crop, 3), jnp.float32)
    out = jax.eval_shape(
      lambda x: self.model.img.init_with_output(jax.random.key(0), x)[0], images
    )  # [1, D]
    return {"image": None, "image_features": (out.shape[1:], jnp.float32)}

  def feature_cache(self, params: Any, num_examples: int) -> Optional[Any]:
    """The train batches' transform that caches the locked tower's features (None: the
    batches keep their images)."""
    if not self.cache_features:
      return None
    return feature_cache.FeatureCache(self.model.img, params[IMAGE], num_examples)

  def init(self, rng: jax.Array, images: jax.Array) -> Any:
    """Boxed parameters (with their logical axis names)."""
    inputs = family_of(self.settings).inputs(self.settings, images)  # images, zero ids
    return self.model.init({"params": rng}, *inputs)["params"]

  def train_flops_per_example(self, image_size: int, batch: int) -> Optional[float]:
    """The analytic FLOPs of one image-text pair in a train step of global ``batch``: both
    towers (a locked image tower forward only) and the loss (`image_text.flops_per_image`)."""
    return image_text.flops_per_image(
      self.settings,
      image_size,
      None,
      train=True,
      image_family=family_of(self.settings.image),
      batch=batch,
      lock_image=IMAGE in self.frozen,
    )

  def embed(
    self, params: Any, images: Optional[jax.Array], ids: Optional[jax.Array]
  ) -> tuple[Optional[jax.Array], Optional[jax.Array], dict[str, jax.Array]]:
    """Evaluation embeddings: ([B, E] images, [B, E] texts, {'t', 'b'})."""
    return self.model.apply({"params": params}, images, ids, train=False)

  def _batch_loss(self, zimg: jax.Array, ztxt: jax.Array, out: dict) -> jax.Array:
    if self.loss_kind == "softmax":
      return losses.softmax_loss(zimg, ztxt, out["t"])
    devices = self.mesh.shape[sharding.DATA_AXIS] if self.mesh is not None else 1
    if devices > 1 and zimg.shape[0] % devices == 0:
      return losses.sigmoid_loss_chunked(zimg, ztxt, out["t"], out["b"], self.mesh)
    return losses.sigmoid_loss(zimg, ztxt, out["t"], out["b"])

  def _towers(
    self, params: Any, batch: Batch, rng: jax.Array
  ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """Training embeddings of a (micro-)batch: ([b, E] images, [b, E] texts, {'t', 'b'})."""
    if self.frozen:  # no gradient flows into the locked tower (its update is zero too)
      params = {k: jax.lax.stop_gradient(v) if k in self.frozen else v for k, v in params.items()}
    images, features = batch.get("image"), batch.get("image_features")  # one of them
    return self.model.apply(
      {"params": params},
      images,
      batch["text"],
      train=True,
      image_features=features,
      rngs={"dropout": rng},
    )

  def loss(self, params: Any, batch: Batch, rng: jax.Array) -> jax.Array:
    return self._batch_loss(*self._towers(params, batch, rng))

  def accumulated_value_and_grad(
    self, params: Any, micro: Batch, rngs: jax.Array
  ) -> tuple[jax.Array, Any]:
    """The loss over the whole batch and its gradient, from ``micro``: the batch as A
    micro-batches (every field [A, B/A, ...], micro-batch j holding rows j, j + A, ...,
    as `steps.train_step` splits it) and ``rngs`` [A] their dropout keys.

    Every pair is scored against the whole batch's negatives, as in one big batch: the
    GradCache scheme (Gao et al., 2021, "Scaling Deep Contrastive Learning Batch Size
    under Memory Limited Setup"). First each micro-batch is embedded with no gradient
    kept; the loss over all B embeddings gives its gradient with respect to each
    embedding (and to t, b); then each micro-batch is embedded again, with the same
    dropout key, and its parameter gradient is that of <embeddings, their gradients>,
    summed over micro-batches. Memory is one micro-batch's activations plus [B, E]
    embeddings; the cost is a second forward pass of both towers.
    """

    def embed(_, xs):  # one micro-batch: its [b, E] embeddings and {'t', 'b'}
      return None, self._towers(params, *xs)

    _, (zimgs, ztxts, outs) = jax.lax.scan(embed, None, (micro, rngs))  # [A, b, E]
    accum, rows = zimgs.shape[:2]

    def merge(z):  # [A, b, E] -> [B, E] in the batch's row order
      return jnp.swapaxes(z, 0, 1).reshape(accum * rows, *z.shape[2:])

    def unmerge(z):  # [B, E] -> [A, b, E]
      return jnp.swapaxes(z.reshape(rows, accum, *z.shape[1:]), 0, 1)

    out = jax.tree.map(lambda x: x[0], outs)  # t, b: the same in every micro-batch
    loss, (g_zimg, g_ztxt, g_out) = jax.value_and_grad(self._batch_loss, argnums=(0, 1, 2))(
      merge(zimgs), merge(ztxts), out
    )

    def backward(grad_sum, xs):
      batch, rng, g_img, g_txt, first = xs

      def surrogate(p):  # its gradient is this micro-batch's share of the batch's
        zimg, ztxt, o = self._towers(p, batch, rng)
        scalars = sum(jnp.sum(o[k] * g_out[k]) for k in g_out)  # t, b: counted once
        return jnp.sum(zimg * g_img) + jnp.sum(ztxt * g_txt) + first * scalars

      return jax.tree.map(jnp.add, grad_sum, jax.grad(surrogate)(params)), None

    firsts = (jnp.arange(accum) == 0).astype(jnp.float32)
    zeros = jax.tree.map(jnp.zeros_like, params)
    grads, _ = jax.lax.scan(
      backward, zeros, (micro, rngs, unmerge(g_zimg), unmerge(g_ztxt), firsts)
    )
    return loss, grads

  def eval_step(self, params: Any, batch: Batch) -> dict[str, jax.Array]:
    """Sums over the real examples of a batch, each image scored against the batch's real
    texts: the loss of its row (the training loss's kind) and whether its own text scores
    highest ('correct': in-batch image-to-text top-1)."""
    zimg, ztxt, out = self.embed(params, batch["image"], batch["text"])
    mask = batch["mask"]  # [B]
    logits = out["t"] * zimg @ ztxt.T  # [B, B]
    own = jnp.eye(logits.shape[0], dtype=bool)
    if self.loss_kind == "sigmoid":
      signs = jnp.where(own, 1.0, -1.0)
      per_pair = -jax.nn.log_sigmoid(signs * (logits + out["b"]))
      per_example = jnp.sum(per_pair * mask[None, :], axis=1)  # [B]
    else:
      masked = jnp.where(mask[None, :] > 0, logits, -jnp.inf)
      per_example = -jnp.sum(jnp.where(own, jax.nn.log_softmax(masked, axis=1), 0.0), axis=1)
    scores = jnp.where(mask[None, :] > 0, logits, -jnp.inf)
    correct = jnp.argmax(scores, axis=1) == jnp.arange(logits.shape[0])
    return {
      "loss_sum": jnp.sum(jnp.where(mask > 0, per_example, 0.0)),
      "correct": jnp.sum(correct * mask),
      "count": jnp.sum(mask),
    }
