"""The run defaults, kept in the package (`vit_jax.run.defaults`: importable after
``pip install``); each experiment file here overrides only what differs."""

from vit_jax.run.defaults import get_config

__all__ = ["get_config"]
