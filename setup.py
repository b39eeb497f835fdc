"""electra-tf: ELECTRA pre-training in TensorFlow 2 / Keras 3, TPU first."""
from setuptools import find_packages, setup

# The TensorFlow runtime: TensorFlow 2.20 (the newest TPU build, tensorflow-tpu) or 2.21;
# tensorflow-text must match its minor version (electra_tf/compat.py checks both at start).
TENSORFLOW = ["tensorflow>=2.20,<2.22", "tensorflow-text>=2.20,<2.22", "tensorboard>=2.19"]
# The JAX runtime, without TensorFlow: JAX for the CPU (a GPU or TPU machine installs its
# own jaxlib, e.g. jax[cuda13] or jax[tpu]), gs:// through gcsfs, and the file locks that
# let several processes share JAX's compilation cache (training/jax_runtime/compile_cache.py).
JAX = ["jax[cpu]>=0.6", "gcsfs>=2023.6", "filelock>=3.0"]

setup(
    name="electra-tf",
    version="0.1.0",
    description="ELECTRA pre-training (replaced-token detection) in Keras 3 on TensorFlow or JAX",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["electra_tf", "electra_tf.*",
                                    "tfrecord_builder", "tfrecord_builder.*"]),
    # Backend-neutral: the model (Keras 3), the builder's text, checkpoints, logs and
    # files need no TensorFlow. A runtime is an extra: `.[tensorflow]` (the README's main
    # job; `.[gpu]` for NVIDIA GPUs) or `.[jax]` (no TensorFlow at all). A Cloud TPU VM
    # installs through install/tpu.txt (README: Install).
    install_requires=[
        "keras>=3.10",
        "sentencepiece>=0.2,<0.3",
        # WordPiece without tensorflow-text (electra_tf/text.py), the same ids.
        "tokenizers>=0.15",
        "absl-py>=2.1,<3",
        "numpy>=1.26",
        # bfloat16 arrays in checkpoints (electra_tf/bundle.py); Keras needs it too.
        "ml-dtypes>=0.3",
        # gs:// and other remote paths without TensorFlow (electra_tf/fileio.py).
        "fsspec>=2023.6",
        # CRC-32C of TFRecords and checkpoints in C (electra_tf/wire.py).
        "google-crc32c>=1.5",
        # Hugging Face conversion (electra_tf/conversion/formats.py) reads and writes safetensors.
        "safetensors>=0.4",
        # GLUE metrics (electra_tf/finetune/metrics.py), as the official GLUE scripts.
        "scikit-learn>=1.3",
        "scipy>=1.11",
    ],
    extras_require={
        "tensorflow": TENSORFLOW,
        "jax": JAX,
        # CI installs every optional piece so that no test is skipped there.
        "test": TENSORFLOW + JAX + [
            "pytest>=8", "pytest-xdist>=3.5", "torch==2.13.0", "transformers>=4.40",
            "tensorflow-datasets>=4.9,<5", "apache-beam>=2.60", "matplotlib>=3.7",
            # tests/test_gcs_emulator.py: gs:// against a local Cloud Storage emulator.
            "gcp-storage-emulator==2026.7.19", "cryptography>=42",
            "keras-hub==0.32.0"],
        # keras-hub presets (electra_tf/conversion/keras_hub.py); the pin is the release
        # whose ElectraBackbone layer names the converter reads.
        "keras-hub": ["keras-hub==0.32.0"],
        # One NVIDIA GPU node: TensorFlow with its CUDA libraries from PyPI.
        "gpu": ["tensorflow[and-cuda]>=2.20,<2.22"] + TENSORFLOW[1:],
        # Beam resolves protobuf to 6.x, which TensorFlow 2.21 accepts.
        "beam": ["apache-beam>=2.60"] + TENSORFLOW,
        "tfds": ["tensorflow-datasets>=4.9,<5"] + TENSORFLOW,
        # experiments/compute_matched.py's plot.
        "experiments": ["matplotlib>=3.7"],
    },
    entry_points={
        "console_scripts": [
            "electra-tfrecord-builder=tfrecord_builder.cli:run",
        ],
    },
)
