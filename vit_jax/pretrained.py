"""Fine-tuning from stored weights under its earlier import path: `vit_jax.weights`."""

from vit_jax.weights import check_source, load_pretrained  # noqa: F401
