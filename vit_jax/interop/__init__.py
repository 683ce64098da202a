"""Moving models in and out: architecture from shapes, any checkpoint to one loaded model,
and the weight mappings to Hugging Face `transformers`, `timm` and serving formats.

Nothing here imports torch: the PyTorch side is only needed to load what is written.
"""
