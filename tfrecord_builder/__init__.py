"""Offline builder: raw text -> WordPiece/SentencePiece ids -> packed, sharded TFRecords.

The output (features `input_ids`, `input_mask`, `segment_ids`, int64[max_seq_length])
is the official ELECTRA pre-training format, plus a `manifest.json` the trainer checks.
"""

from electra_tf.compat import require_supported_versions

__version__ = "0.2.0"


# TensorFlow 2.20 or 2.21 with matching tensorflow-text, or one line and exit.
require_supported_versions()


class BuildError(Exception):
    """A problem with the user's input or flags, reported as one line without a traceback."""
