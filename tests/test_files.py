"""electra_tf.data.files: globs and build directories to shards, and the checks against
the manifest and the run config, on a small build of the bundled Wikipedia sample."""

import os
import shutil

import pytest

from conftest import SMALL_SEQ as SEQ, SMALL_SHARDS as NUM_SHARDS
from electra_tf.data.dataset import InputConfig, make_dataset
from electra_tf.data.files import (InputDataError, check_data, peek_sequence_length,
                                   resolve_files)
from electra_tf.data.manifest import ManifestError

VOCAB_SIZE = 30522


def _cfg(data_dir, **kw):
    kw.setdefault("max_seq_length", SEQ)
    kw.setdefault("batch_size", 16)
    return InputConfig(file_pattern=kw.pop("file_pattern", data_dir), **kw)


def test_directory_with_manifest_resolves_to_its_shards(data_dir, manifest):
    expected = sorted(os.path.join(data_dir, s["name"]) for s in manifest["shards"])
    assert len(expected) == NUM_SHARDS
    assert resolve_files(data_dir) == expected
    # A glob over the directory skips manifest.json, token_counts.txt and vocab.txt.
    assert os.path.exists(os.path.join(data_dir, "vocab.txt"))
    assert resolve_files(os.path.join(data_dir, "*")) == expected
    # Comma-separated parts are merged without duplicates.
    assert resolve_files(f"{expected[0]}, {data_dir}/*-0000[01]-*") == expected[:2]


def test_manifest_shard_missing_is_named(data_dir, manifest, tmp_path):
    shutil.copy(os.path.join(data_dir, "manifest.json"), tmp_path / "manifest.json")
    for s in manifest["shards"][:-1]:
        shutil.copy(os.path.join(data_dir, s["name"]), tmp_path / s["name"])
    with pytest.raises(InputDataError, match=manifest["shards"][-1]["name"]):
        resolve_files(str(tmp_path))


def test_missing_pattern_is_a_clear_error(tmp_path):
    pattern = str(tmp_path / "nothing-here" / "pretrain_data.tfrecord-*")
    with pytest.raises(InputDataError) as e:
        resolve_files(pattern)
    assert isinstance(e.value, ValueError)
    assert pattern in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(InputDataError, match="nothing-here"):
        make_dataset(InputConfig(file_pattern=pattern))


def test_official_dir_without_manifest(official_dir, data_dir, records):
    files = resolve_files(official_dir)
    assert [os.path.basename(f) for f in files] == sorted(os.path.basename(f) for f in records)
    assert check_data(official_dir, vocab_size=VOCAB_SIZE, max_seq_length=SEQ) is None
    assert peek_sequence_length(files[0]) == SEQ
    batch = next(iter(make_dataset(_cfg(official_dir))))
    assert batch["input_ids"].shape == (16, SEQ)


def test_sequence_length_mismatch_without_manifest_names_file_and_lengths(official_dir):
    with pytest.raises(InputDataError) as e:
        make_dataset(_cfg(official_dir, max_seq_length=64))
    msg = str(e.value)
    assert "pretrain_data.tfrecord-00000" in msg and "128" in msg and "64" in msg


@pytest.mark.parametrize("kw,numbers", [
    ({"vocab_size": 30000, "max_seq_length": SEQ}, ("30522", "30000")),
    ({"vocab_size": VOCAB_SIZE, "max_seq_length": 256}, ("128", "256")),
])
def test_manifest_mismatch_raises_with_both_numbers(data_dir, kw, numbers):
    for pattern in (data_dir, os.path.join(data_dir, "pretrain_data.tfrecord-*")):
        with pytest.raises(ManifestError) as e:
            check_data(pattern, **kw)
        assert all(n in str(e.value) for n in numbers), str(e.value)
        assert "\n" not in str(e.value)
    with pytest.raises(ManifestError):
        make_dataset(_cfg(data_dir, **kw))


def test_check_data_returns_manifest(data_dir, manifest):
    got = check_data(data_dir, vocab_size=VOCAB_SIZE, max_seq_length=SEQ)
    assert got["examples"] == manifest["examples"] == sum(s["examples"] for s in manifest["shards"])
