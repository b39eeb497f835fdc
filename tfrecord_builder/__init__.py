"""Offline builder: raw text -> WordPiece/SentencePiece ids -> packed, sharded TFRecords.

The output (features `input_ids`, `input_mask`, `segment_ids`, int64[max_seq_length])
is the official ELECTRA pre-training format, plus a `manifest.json` the trainer checks.
"""

import sys

from electra_tf.compat import require_supported_versions

__version__ = "0.2.0"


# TensorFlow 2.20 or 2.21 with matching tensorflow-text, or one line and exit.
require_supported_versions()


class BuildError(Exception):
    """A problem with the user's input or flags, reported as one line without a traceback."""


def without_scikit_learn():
    """Before TensorFlow is imported in a builder process (the CLI, its workers): Keras,
    which TensorFlow and tf-text import, then goes without scikit-learn, imported only for
    its optional wrappers (~0.7 CPU s a process). Not at import: a library user's process
    may want it (fine-tuning's metrics do)."""
    sys.modules.setdefault("sklearn", None)


def start_worker(vocab_fields: dict, vocab_data: bytes):
    """A builder worker process's initializer. Here, and with the vocabulary as plain
    fields, so that a spawned worker imports nothing of TensorFlow before it runs."""
    without_scikit_learn()
    from electra_tf.text import VocabInfo
    from tfrecord_builder.build import _init_worker
    _init_worker(VocabInfo(**vocab_fields), vocab_data)
