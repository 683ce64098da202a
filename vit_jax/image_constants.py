"""The input normalisation the official weights expect, shared by `data` and `models`.

A leaf: the input pipeline and the model settings both import it, so `data` needs no
import of `vit_jax.models` (which loads every model family) for a constant.
"""

# Pixels in [0, 1] mapped to [-1, 1], per RGB channel.
OFFICIAL_INPUT_MEAN = OFFICIAL_INPUT_STD = (0.5, 0.5, 0.5)
