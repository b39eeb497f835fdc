"""electra_tf.data.manifest: writing, reading and checking a build's manifest.json."""

import json
import uuid

import pytest

from electra_tf import fileio
from electra_tf.data import manifest as manifest_lib
from electra_tf.data.manifest import ManifestError, read_manifest, validate_manifest

MANIFEST = {"format": manifest_lib.FORMAT, "format_version": 1, "max_seq_length": 128,
            "examples": 7, "tokenizer": {"vocab_size": 30522, "vocab_file": "vocab.txt"},
            "shards": [{"name": "pretrain_data.tfrecord-00000-of-00001", "examples": 7}]}


@pytest.fixture(params=["local", "ram"])
def directory(request, tmp_path):
    if request.param == "local":
        return str(tmp_path)
    root = f"ram://manifest_{uuid.uuid4().hex}"
    fileio.makedirs(root)
    return root


def test_write_then_read(directory):
    manifest_lib.write_manifest(directory, MANIFEST)
    path = fileio.join(directory, "manifest.json")
    # Indented JSON in the given key order plus a newline, and no temp file left.
    assert fileio.read_text(path) == json.dumps(MANIFEST, indent=2) + "\n"
    assert fileio.listdir(directory) == ["manifest.json"]
    assert read_manifest(path) == MANIFEST
    assert read_manifest(directory) == MANIFEST  # the build directory works too
    replaced = dict(MANIFEST, examples=8)
    manifest_lib.write_manifest(directory, replaced)
    assert read_manifest(directory)["examples"] == 8
    assert fileio.listdir(directory) == ["manifest.json"]


def test_read_errors_are_one_line(directory):
    path = fileio.join(directory, "manifest.json")
    with pytest.raises(ManifestError) as e:
        read_manifest(directory)
    assert str(e.value) == (f"{path}: no manifest (the build is incomplete or was not made "
                            "by tfrecord_builder)")
    cases = [("{not json", f"{path}: unreadable manifest (Expecting property name enclosed "
                           "in double quotes: line 1 column 2 (char 1))"),
             ("[1, 2]", f"{path}: not a tfrecord_builder manifest"),
             (json.dumps({"format": "other"}), f"{path}: not a tfrecord_builder manifest"),
             (json.dumps(dict(MANIFEST, format_version=2)),
              f"{path}: format_version 2 is newer than this code understands (1)")]
    for text, message in cases:
        fileio.write_atomic(path, text)
        with pytest.raises(ManifestError) as e:
            read_manifest(path)
        assert str(e.value) == message
    # Version 0 (before versions were written) and the current one are read.
    fileio.write_atomic(path, json.dumps({k: v for k, v in MANIFEST.items()
                                          if k != "format_version"}))
    assert read_manifest(path)["examples"] == 7


def test_validate_names_both_values():
    validate_manifest(MANIFEST, vocab_size=30522, max_seq_length=128)
    validate_manifest(MANIFEST)  # nothing to compare
    with pytest.raises(ManifestError) as e:
        validate_manifest(MANIFEST, vocab_size=8000, where="data/manifest.json")
    assert str(e.value) == ("data/manifest.json: the data was tokenized with a vocabulary of "
                            "30522 tokens (vocab.txt) but the model config has vocab_size=8000")
    with pytest.raises(ManifestError) as e:
        validate_manifest(MANIFEST, vocab_size=30522, max_seq_length=512)
    assert str(e.value) == ("manifest: the data holds sequences of length 128 but the run "
                            "uses max_seq_length=512; rebuild with --max_seq_length=512 or "
                            "change the flag")
