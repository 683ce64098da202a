"""`python -m vit_jax.plan`: see `vit_jax.plan.cli`."""

from vit_jax.plan import cli

if __name__ == "__main__":
  cli.main()
