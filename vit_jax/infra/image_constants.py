"""The input normalisations of the weights this package reads, and the NaFlex position
canvas, shared by `data` and `models`.

A leaf: the input pipeline and the model settings both import it, so `data` needs no
import of `vit_jax.models` (which loads every model family) for a constant.
"""

# Pixels in [0, 1] mapped to [-1, 1], per RGB channel.
OFFICIAL_INPUT_MEAN = OFFICIAL_INPUT_STD = (0.5, 0.5, 0.5)
# ImageNet's per-channel statistics on the 0..1 scale: torchvision's, timm's default and
# the normalisation of most PyTorch-trained weights (DeiT, EVA, DINOv2, ...).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# NaFlex: patches along an image side at most. The model resamples its position table into
# a canvas of this side per image (big_vision's `learn_2d(64)` default); a grid side above
# it would read outside, so the pipeline refuses such a grid.
NAFLEX_MAX_SIDE = 64
# NaFlex in a batch (`data.naflex_images.pack`, `models.naflex.NaFlexPatches.unpack`): one
# float32 row per patch, its P * P * 3 pixels then these: its row, its column, and 1.0 for a
# patch of the image or 0.0 for padding; one array, as a square image's, through the pipeline.
NAFLEX_PACKED_FIELDS = 3
