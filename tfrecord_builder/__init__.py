"""Offline builder: raw text -> WordPiece/SentencePiece ids -> packed, sharded TFRecords.

The output (features `input_ids`, `input_mask`, `segment_ids`, int64[max_seq_length])
is the official ELECTRA pre-training format, plus a `manifest.json` the trainer checks.
"""

__version__ = "0.1.0"


class BuildError(Exception):
    """A problem with the user's input or flags, reported as one line without a traceback."""
