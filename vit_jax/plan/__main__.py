"""`python -m vit_jax.plan`: see `vit_jax.plan.cli`."""

import sys

from vit_jax import cli as cli_lib
from vit_jax.plan import cli

if __name__ == "__main__":
  cli_lib.exit_with(cli.main(sys.argv))
