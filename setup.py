"""electra-tf: ELECTRA pre-training in TensorFlow 2 / Keras 3, TPU first."""
from setuptools import find_packages, setup

setup(
    name="electra-tf",
    version="0.1.0",
    description="ELECTRA pre-training (replaced-token detection) in TensorFlow 2 / Keras 3",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["electra_tf", "electra_tf.*",
                                    "tfrecord_builder", "tfrecord_builder.*"]),
    install_requires=[
        # TensorFlow 2.20 (the newest TPU build, tensorflow-tpu) and 2.21; tensorflow-text
        # must match TensorFlow's minor version (electra_tf/compat.py checks both at start).
        # A Cloud TPU VM installs through install/tpu.txt instead (README: Install).
        "tensorflow>=2.20,<2.22",
        "tensorflow-text>=2.20,<2.22",
        "sentencepiece>=0.2,<0.3",
        "absl-py>=2.1,<3",
        "tensorboard>=2.19",
        "numpy>=1.26",
        # Hugging Face conversion (electra_tf/conversion/formats.py) reads and writes safetensors.
        "safetensors>=0.4",
        # GLUE metrics (electra_tf/finetune/metrics.py), as the official GLUE scripts.
        "scikit-learn>=1.3",
        "scipy>=1.11",
    ],
    extras_require={
        # CI installs every optional piece so that no test is skipped there.
        "test": ["pytest>=8", "pytest-xdist>=3.5", "torch==2.13.0", "transformers>=4.40",
                 "tensorflow-datasets>=4.9,<5", "apache-beam>=2.60", "google-crc32c>=1.5",
                 "matplotlib>=3.7",
                 # tests/test_gcs_emulator.py: gs:// against a local Cloud Storage emulator.
                 "gcp-storage-emulator==2026.7.19", "cryptography>=42",
                 "keras-hub==0.32.0",
                 # tests/test_backends.py: the model on the JAX backend beside TensorFlow.
                 "jax[cpu]>=0.6"],
        # keras-hub presets (electra_tf/conversion/keras_hub.py); the pin is the release
        # whose ElectraBackbone layer names the converter reads.
        "keras-hub": ["keras-hub==0.32.0"],
        # The model, heads and objectives on Keras' JAX backend (KERAS_BACKEND=jax; CPU
        # wheels here: a GPU or TPU machine installs its own jaxlib, e.g. jax[cuda13]).
        "jax": ["jax[cpu]>=0.6"],
        # One NVIDIA GPU node: TensorFlow with its CUDA libraries from PyPI.
        "gpu": ["tensorflow[and-cuda]>=2.20,<2.22"],
        # Beam resolves protobuf to 6.x, which TensorFlow 2.21 accepts.
        "beam": ["apache-beam>=2.60", "google-crc32c>=1.5"],
        "tfds": ["tensorflow-datasets>=4.9,<5"],
        # experiments/compute_matched.py's plot.
        "experiments": ["matplotlib>=3.7"],
    },
    entry_points={
        "console_scripts": [
            "electra-tfrecord-builder=tfrecord_builder.cli:run",
        ],
    },
)
