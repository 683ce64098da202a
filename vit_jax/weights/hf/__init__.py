"""transformers' checkpoint folders, each class read and written in one module: `vit`
(``ViTForImageClassification`` / ``ViTModel``), `two_tower` (``SiglipModel``,
``Siglip2Model``, ``CLIPModel``: both towers and the tokenizer, through the one table of
`two_tower_table`); `folder` holds what they share (file names, ``model_type``, the
safetensors shards, the image processor)."""
