"""electra_tf.data.records (TFRecords and Examples without TensorFlow) against TensorFlow's
writer, reader and `tf.io.parse_example`: the same bytes, the same records, the same ids;
truncated and corrupted files named with the record and its offset."""

import io
import os
import struct

import numpy as np
import pytest
import tensorflow as tf

from electra_tf import wire
from electra_tf.data import records
from electra_tf.data.records import RecordError

PAYLOADS = [b"", b"a", bytes(range(256)) * 4, os.urandom(70_000)]


def test_crc32c_known_value_and_both_implementations(monkeypatch):
    assert records.crc32c(b"123456789") == 0xE3069283  # the standard check value
    data = os.urandom(3000)
    fast = records.crc32c(data)
    monkeypatch.setattr(wire, "_crc32c_c", None)  # the Python loop
    assert records.crc32c(data) == fast
    assert records.crc32c(b"") == 0


def test_framing_is_tensorflows_byte_for_byte(tmp_path):
    theirs = str(tmp_path / "theirs.tfrecord")
    with tf.io.TFRecordWriter(theirs) as writer:
        for data in PAYLOADS:
            writer.write(data)
    mine = io.BytesIO()
    written = records.write_records(mine, PAYLOADS)
    with open(theirs, "rb") as f:
        assert mine.getvalue() == f.read()
    assert written == sum(len(p) + 16 for p in PAYLOADS)
    with open(theirs, "rb") as f:
        assert list(records.read_records(f, theirs)) == PAYLOADS
    ours = tmp_path / "ours.tfrecord"
    ours.write_bytes(mine.getvalue())
    assert list(tf.data.TFRecordDataset(str(ours)).as_numpy_iterator()) == PAYLOADS


def _file(tmp_path, data: bytes):
    path = tmp_path / "damaged.tfrecord"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:-3], "record 3 at byte {third}: truncated (the file ends inside a record "
                       "of 70000 bytes)"),
    (lambda b: b + b"\x01\x02", "record 4 at byte {end}: truncated (the file ends inside "
                                "the record's length, 2 of 12 bytes)"),
    # record 2 starts at byte 33 (16 + 17): its length at 33-40, its data from 45
    (lambda b: b[:35] + bytes([b[35] ^ 0x40]) + b[36:],
     "record 2 at byte 33: corrupted (the length's checksum does not match)"),
    (lambda b: b[:50] + bytes([b[50] ^ 0x01]) + b[51:],
     "record 2 at byte 33: corrupted (the data's checksum does not match)"),
])
def test_a_damaged_file_is_named_with_its_record_and_offset(tmp_path, damage, message):
    whole = b"".join(records.frame(p) for p in PAYLOADS)
    third = sum(len(p) + 16 for p in PAYLOADS[:3])
    path = _file(tmp_path, damage(whole))
    with open(path, "rb") as f, pytest.raises(RecordError) as e:
        list(records.read_records(f, str(path)))
    assert str(e.value).startswith(f"{path}: " + message.format(third=third,
                                                                  end=len(whole)))


def test_without_verify_only_the_framing_is_checked(tmp_path):
    whole = b"".join(records.frame(p) for p in PAYLOADS)
    flipped = whole[:50] + bytes([whole[50] ^ 0x01]) + whole[51:]
    got = list(records.read_records(io.BytesIO(flipped), "x", verify=False))
    assert len(got) == 4 and got[2] != PAYLOADS[2] and got[3] == PAYLOADS[3]


def test_examples_parse_as_tensorflow_parses_a_build(data_dir, manifest):
    """Every record of every shard of a build: the same int32 ids as tf.io.parse_example."""
    length = manifest["max_seq_length"]
    spec = {n: tf.io.FixedLenFeature([length], tf.int64) for n in records.FEATURE_NAMES}
    total = 0
    for shard in manifest["shards"]:
        path = os.path.join(data_dir, shard["name"])
        with open(path, "rb") as f:
            raw = list(records.read_records(f, path))
        assert len(raw) == shard["examples"]
        got = records.parse_examples(raw, length, where=path)
        want = tf.io.parse_example(tf.constant(raw), spec)
        for name in records.FEATURE_NAMES:
            assert got[name].dtype == np.int32 and got[name].shape == (len(raw), length)
            np.testing.assert_array_equal(got[name], want[name].numpy(), err_msg=name)
        total += len(raw)
    assert total > 300


def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((v & 0x7F) | (0x80 if v > 0x7F else 0))
        v >>= 7
        if not v:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    key = _varint(number << 3 | wire)
    return key + (_varint(len(payload)) + payload if wire == 2 else payload)


def _example(features):
    """A hand-written Example: {name: (encoding, values)}, encoding packed or unpacked."""
    entries = b""
    for name, (encoding, values) in features.items():
        if encoding == "packed":
            int64_list = _field(1, 2, b"".join(_varint(v) for v in values))
        elif encoding == "unpacked":
            int64_list = b"".join(_field(1, 0, _varint(v)) for v in values)
        else:  # a float list
            int64_list = None
            feature = _field(2, 2, _field(1, 2, struct.pack(f"<{len(values)}f", *values)))
        if int64_list is not None:
            feature = _field(3, 2, int64_list)
        entries += _field(1, 2, _field(1, 2, name.encode()) + _field(2, 2, feature))
    return _field(1, 2, entries)


def test_unpacked_lists_any_feature_order_and_negatives_as_tensorflow():
    raw = [_example({"segment_ids": ("unpacked", [0, 1, 1]), "extra": ("float", [1.5]),
                     "input_mask": ("packed", [1, 1, 0]),
                     "input_ids": ("packed", [101, -7, 2 ** 31 - 1])}),
           _example({"input_ids": ("unpacked", [5, 300, 70000]),
                     "input_mask": ("unpacked", [1, 0, 0]),
                     "segment_ids": ("packed", [0, 0, 0])})]
    got = records.parse_examples(raw, 3)
    spec = {n: tf.io.FixedLenFeature([3], tf.int64) for n in records.FEATURE_NAMES}
    want = tf.io.parse_example(tf.constant(raw), spec)
    for name in records.FEATURE_NAMES:
        np.testing.assert_array_equal(got[name], want[name].numpy(), err_msg=name)
    np.testing.assert_array_equal(got["input_ids"], [[101, -7, 2 ** 31 - 1], [5, 300, 70000]])


@pytest.mark.parametrize("features, message", [
    ({"input_ids": ("packed", [1, 2]), "input_mask": ("packed", [1, 1, 1]),
      "segment_ids": ("packed", [0, 0, 0])},
     "record 1 has 2 values of 'input_ids', expected 3 (max_seq_length)"),
    ({"input_ids": ("packed", [1, 2, 3]), "input_mask": ("packed", [1, 1, 1])},
     "record 1 has no int64 feature 'segment_ids'"),
    ({"input_ids": ("float", [1.0, 2.0, 3.0]), "input_mask": ("packed", [1, 1, 1]),
      "segment_ids": ("packed", [0, 0, 0])},
     "record 1 is not a readable Example (feature 'input_ids' is a float_list, not an "
     "int64 list)"),
    ({"input_ids": ("packed", [1, 2, 2 ** 40]), "input_mask": ("packed", [1, 1, 1]),
      "segment_ids": ("packed", [0, 0, 0])},
     "'input_ids' holds a value outside int32"),
])
def test_an_example_outside_the_schema_is_one_line(features, message):
    good = _example({n: ("packed", [1, 1, 1]) for n in records.FEATURE_NAMES})
    with pytest.raises(RecordError) as e:
        records.parse_examples([good, _example(features)], 3, where="shard-7")
    assert str(e.value) == f"shard-7: {message}"


def test_no_records_give_empty_arrays():
    got = records.parse_examples([], 5)
    assert {k: (v.shape, v.dtype) for k, v in got.items()} == {
        n: ((0, 5), np.int32) for n in records.FEATURE_NAMES}


def test_a_packed_run_cut_inside_a_varint_is_one_line():
    def entry(name, packed):
        return _field(1, 2, _field(1, 2, name.encode()) +
                      _field(2, 2, _field(3, 2, _field(1, 2, packed))))

    bad = _field(1, 2, entry("input_ids", b"\x01\x02\x83") +  # its last varint never ends
                 entry("input_mask", b"\x01\x01\x01") + entry("segment_ids", b"\x00" * 3))
    with pytest.raises(RecordError) as e:
        records.parse_examples([bad], 3, where="s")
    assert str(e.value) == "s: 'input_ids': an int64 list ends inside a varint"


def test_a_record_that_is_not_an_example_is_one_line():
    with pytest.raises(RecordError) as e:
        records.parse_examples([b"\x0a\xff\xff\xff\xff\x0f"], 3, where="s")
    assert str(e.value).startswith("s: record 0 is not a readable Example (")
