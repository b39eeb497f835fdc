"""Offline builder: raw text -> WordPiece/SentencePiece ids -> packed, sharded TFRecords.

The output (features `input_ids`, `input_mask`, `segment_ids`, int64[max_seq_length])
is the official ELECTRA pre-training format, plus a `manifest.json` the trainer checks.
"""

import os

from electra_tf.compat import require_supported_versions

__version__ = "0.2.0"

# The bundled sample (a fresh clone's defaults): data/ beside the package.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))  # repo-internal, not a user path
REPO_DATA = os.path.join(os.path.dirname(_PACKAGE_DIR), "data")
DEFAULT_CORPUS = os.path.join(REPO_DATA, "corpus", "enwiki_sample.txt")
DEFAULT_VOCAB = os.path.join(REPO_DATA, "vocab", "bert_uncased_vocab.txt")


# TensorFlow 2.20 or 2.21 with matching tensorflow-text, or one line and exit.
require_supported_versions()


class BuildError(Exception):
    """A problem with the user's input or flags, reported as one line without a traceback."""
