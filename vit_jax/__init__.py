"""The Vision Transformer in JAX/Flax (see README.md).

Importing the package (any module of it) starts quietly, as the commands do
(`platforms.library_defaults`): TensorFlow's C++ lines at errors only and, on a host
with libtpu or JAX's CUDA plugin installed but no TPU or GPU, JAX's CPU backend, unless
the user chose (``JAX_PLATFORMS``, ``jax_platforms``, ``TF_CPP_MIN_LOG_LEVEL``). A
script or notebook that imports vit_jax before its first JAX computation then prints
only its own output.
"""

from vit_jax import platforms as _platforms

_platforms.library_defaults()
