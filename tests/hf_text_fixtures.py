"""Tiny transformers image-text folders written in the test, as ``save_pretrained`` writes
them: ``SiglipModel`` (a SentencePiece tokenizer trained here), ``Siglip2Model``
(transformers' ``Siglip2Tokenizer`` on a BPE trained here) and ``CLIPModel`` (a
``tokenizer.json`` trained here); every array perturbed away from its initialisation."""

from __future__ import annotations

import io
import json
import os
from typing import Any

import numpy as np

CORPUS = [
  "a photo of a cat", "a photo of a dog", "the quick brown fox jumps", "two birds on a wire",
  "a red car",
] * 20  # fmt: skip
TEXTS = ["A photo, of a cat!", "dog", "the quick brown fox jumps over two birds on a wire"]
TEXT_LEN = 12
TEXT = dict(
  vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
  num_attention_heads=2, max_position_embeddings=TEXT_LEN,
)  # fmt: skip
VISION = dict(
  hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
  patch_size=4,
)  # fmt: skip
IMAGE = 16  # pixels; 4x4 patches of 4
SIGLIP2_IMAGES = dict(patch_size=4, max_num_patches=16)  # the processor's defaults are 16, 256


def _perturbed(model: Any, seed: int) -> Any:
  import torch  # pylint: disable=g-import-not-at-top

  torch.manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(torch.randn_like(p) * 0.5)
  return model.eval()


def _sentencepiece(directory: str) -> str:
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  buf = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(CORPUS), model_writer=buf, vocab_size=40, model_type="unigram",
    pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>",
    unk_piece="<unk>", hard_vocab_limit=False, minloglevel=2,
  )  # fmt: skip
  path = os.path.join(directory, "trained.model")
  with open(path, "wb") as f:
    f.write(buf.getvalue())
  return path


def _bpe(special: list[str], lowercase: bool = False) -> Any:
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top

  tokenizer = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
  tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
  if lowercase:
    tokenizer.normalizer = tokenizers.normalizers.Lowercase()
  tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=40, special_tokens=special))
  return tokenizer


def siglip(directory: str) -> None:
  import transformers as tr  # pylint: disable=g-import-not-at-top

  config = tr.SiglipConfig(text_config=TEXT, vision_config=dict(VISION, image_size=IMAGE))
  _perturbed(tr.SiglipModel(config), 0).save_pretrained(directory)
  processor = tr.SiglipProcessor(
    tr.SiglipImageProcessor(size={"height": IMAGE, "width": IMAGE}),
    tr.SiglipTokenizer(_sentencepiece(directory)),
  )
  processor.save_pretrained(directory)
  os.remove(os.path.join(directory, "trained.model"))  # saved as spiece.model


def siglip2(directory: str) -> None:
  import transformers as tr  # pylint: disable=g-import-not-at-top

  state = json.loads(_bpe(["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]).to_str())["model"]
  merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
  tokenizer = tr.Siglip2Tokenizer(vocab=state["vocab"], merges=merges)  # pads left
  vision = dict(VISION, num_patches=(IMAGE // 4) ** 2)
  config = tr.Siglip2Config(text_config=TEXT, vision_config=vision)
  _perturbed(tr.Siglip2Model(config), 1).save_pretrained(directory)
  images = tr.Siglip2ImageProcessor(**SIGLIP2_IMAGES)
  tr.Siglip2Processor(images, tokenizer).save_pretrained(directory)


def clip(directory: str) -> None:
  import transformers as tr  # pylint: disable=g-import-not-at-top
  from tokenizers import processors  # pylint: disable=g-import-not-at-top

  start, end = "<|startoftext|>", "<|endoftext|>"
  bpe = _bpe([start, end, "<unk>"], lowercase=True)
  bpe.post_processor = processors.TemplateProcessing(
    single=f"{start} $A {end}", special_tokens=[(start, 0), (end, 1)]
  )
  tokenizer = tr.PreTrainedTokenizerFast(
    tokenizer_object=bpe, bos_token=start, eos_token=end, pad_token=end, unk_token="<unk>"
  )
  text = dict(TEXT, bos_token_id=0, eos_token_id=1, pad_token_id=1)
  config = tr.CLIPConfig(
    text_config=text, vision_config=dict(VISION, image_size=IMAGE), projection_dim=8
  )
  _perturbed(tr.CLIPModel(config), 2).save_pretrained(directory)
  images = tr.CLIPImageProcessor(
    size={"shortest_edge": IMAGE}, crop_size={"height": IMAGE, "width": IMAGE}
  )
  tr.CLIPProcessor(images, tokenizer).save_pretrained(directory)


WRITERS = {"siglip": siglip, "siglip2": siglip2, "clip": clip}


def images(count: int = 2) -> np.ndarray:
  """uint8 [count, IMAGE, IMAGE, 3]: the size every processor here resizes to (no resize)."""
  return np.random.default_rng(7).integers(0, 256, (count, IMAGE, IMAGE, 3), dtype=np.uint8)


def reference(directory: str, texts: list[str], pixels: np.ndarray) -> np.ndarray:
  """transformers' logits_per_image [B, T] of the folder, through its own processor."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers as tr  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top

  model = tr.AutoModel.from_pretrained(directory).eval()
  processor = tr.AutoProcessor.from_pretrained(directory)
  kind = model.config.model_type
  # The zero-shot pipeline's padding: SigLIP's to the length, CLIP's to the longest.
  padding = dict(padding="max_length" if "siglip" in kind else True, max_length=TEXT_LEN)
  extra = SIGLIP2_IMAGES if kind == "siglip2" else {}
  inputs = processor(
    text=texts, images=[Image.fromarray(p) for p in pixels], return_tensors="pt",
    truncation=True, **padding, **extra,
  )  # fmt: skip
  with torch.no_grad():
    return model(**inputs).logits_per_image.numpy()


def reference_ids(directory: str, texts: list[str]) -> np.ndarray:
  """transformers' token ids of ``texts`` at the model's length."""
  import transformers as tr  # pylint: disable=g-import-not-at-top

  tokenizer = tr.AutoTokenizer.from_pretrained(directory)
  out = tokenizer(texts, padding="max_length", max_length=TEXT_LEN, truncation=True)
  return np.asarray(out["input_ids"])
