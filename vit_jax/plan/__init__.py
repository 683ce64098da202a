"""Planning a TPU pod run from any machine: `python -m vit_jax.plan` (see `vit_jax.plan.cli`)."""
