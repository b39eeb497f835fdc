"""`manifest.json`: what a finished build holds, and the trainer-side checks against it.
Written last, its presence marks a complete build; the trainer compares vocabulary size and
sequence length with its config before reading a record. Any filesystem (local, gs://...)."""

import json
from typing import Optional

from electra_tf import fileio

MANIFEST_NAME = "manifest.json"
FORMAT = "electra-tf/pretraining-tfrecords"
FORMAT_VERSION = 1


class ManifestError(ValueError):
    """The data and the model config disagree, or the manifest is unreadable."""


def write_manifest(output_dir: str, manifest: dict):
    """Atomically writes the manifest (fsync'ed when local), the build's last step: on a
    bucket, where a rename is a copy, it still lands after every file it names."""
    fileio.write_json_atomic(fileio.join(output_dir, MANIFEST_NAME), manifest, sync=True)


def read_manifest(path: str) -> dict:
    """Reads a manifest from a file or from a build directory (any filesystem)."""
    try:
        if fileio.isdir(path):
            path = fileio.join(path, MANIFEST_NAME)
        manifest = json.loads(fileio.read_text(path))
    except FileNotFoundError:
        raise ManifestError(f"{path}: no manifest (the build is incomplete or was not made "
                            "by tfrecord_builder)") from None
    except (OSError, ValueError) as e:
        reason = fileio.error_reason(e) if isinstance(e, OSError) else e
        raise ManifestError(f"{path}: unreadable manifest ({reason})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ManifestError(f"{path}: not a tfrecord_builder manifest")
    if manifest.get("format_version", 0) > FORMAT_VERSION:
        raise ManifestError(f"{path}: format_version {manifest['format_version']} is newer "
                            f"than this code understands ({FORMAT_VERSION})")
    return manifest


def validate_manifest(manifest: dict, *, vocab_size: Optional[int] = None,
                      max_seq_length: Optional[int] = None, where: str = "manifest"):
    """Raises ManifestError naming both values when the data does not fit the config."""
    data_vocab = manifest["tokenizer"]["vocab_size"]
    if vocab_size is not None and data_vocab != vocab_size:
        raise ManifestError(
            f"{where}: the data was tokenized with a vocabulary of {data_vocab} tokens "
            f"({manifest['tokenizer'].get('vocab_file')}) but the model config has "
            f"vocab_size={vocab_size}")
    data_len = manifest["max_seq_length"]
    if max_seq_length is not None and data_len != max_seq_length:
        raise ManifestError(
            f"{where}: the data holds sequences of length {data_len} but the run uses "
            f"max_seq_length={max_seq_length}; rebuild with --max_seq_length={max_seq_length} "
            f"or change the flag")
