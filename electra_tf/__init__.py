"""electra_tf: ELECTRA pre-training (replaced-token detection) in TensorFlow 2 / Keras 3.

TPU first; the data stage lives in `tfrecord_builder`, the trainer side in this package.
"""

import os

from electra_tf import backend, quiet
from electra_tf.compat import configure_tpu_library, require_supported_versions

# TensorFlow's C++ start-up lines off the console, wherever it is first imported (quiet.py).
quiet.install()
# Keras on TensorFlow by default, on JAX where only JAX is installed (backend.default).
backend.set_default()

# The bundled sample (a fresh clone's defaults): data/ beside the package.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))  # repo-internal, not a user path
REPO_DATA = os.path.join(os.path.dirname(_PACKAGE_DIR), "data")
DEFAULT_CORPUS = os.path.join(REPO_DATA, "corpus", "enwiki_sample.txt")
DEFAULT_VOCAB = os.path.join(REPO_DATA, "vocab", "bert_uncased_vocab.txt")

# TensorFlow 2.20 or 2.21 with matching tensorflow-text and Keras 3, or one line and exit
# (from package metadata; TensorFlow itself is not imported here).
require_supported_versions()
# The TPU build of TensorFlow on a host without TPU chips: leave its TPU runtime unloaded.
configure_tpu_library()
