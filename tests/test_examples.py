"""tfrecord_builder.examples: one chunk -> packed examples, their stats and records."""

import numpy as np
import pytest
import tensorflow as tf

from tfrecord_builder.corpus import MAX_SKIP_EXAMPLES, Chunk
from tfrecord_builder.packing import PackedExamples
from tfrecord_builder.examples import (FEATURES, ChunkStats, chunk_rng, encode_chunk,
                                       merge_stats, pack_chunk, serialize_examples,
                                       tokenize_chunk)

CLS, SEP = 2, 3


class WordIds:
    """A tokenizer whose tokens are the line's whitespace-separated integers."""
    special_ids = {"[PAD]": 0, "[UNK]": 1, "[CLS]": CLS, "[SEP]": SEP, "[MASK]": 4}

    def tokenize(self, lines):
        rows = [[int(w) for w in line.split()] for line in lines]
        flat = np.array([i for row in rows for i in row], np.int32)
        return flat, np.cumsum([0] + [len(row) for row in rows]).astype(np.int64)


def _chunk(data: bytes, file_index=0, index=0) -> Chunk:
    return Chunk(file_index, index, "x.txt", 1, data, False)


# Two documents: 5 tokens in two sentences, then 4 in one; ids 10 and 12 repeat.
TEXT = b"10 11 10\n10 12\n\n12 13 14 15\n"


def test_tokenize_chunk_splits_sentences():
    lines, sentences, stats = tokenize_chunk(_chunk(TEXT), WordIds())
    assert lines == ["10 11 10", "10 12", "", "12 13 14 15"]
    assert [s.tolist() for s in sentences] == [[10, 11, 10], [10, 12], [12, 13, 14, 15]]
    assert stats.lines == 4 and stats.skipped == {}


def test_encode_chunk_exact_examples_and_stats():
    # Each document is shorter than an example, so each is one example, single segment.
    packed, stats = encode_chunk(_chunk(TEXT), WordIds(), max_seq_length=16, seed=1)
    assert packed.lengths.tolist() == [7, 6]
    assert packed.input_ids.tolist() == [
        [CLS, 10, 11, 10, 10, 12, SEP] + [0] * 9,
        [CLS, 12, 13, 14, 15, SEP] + [0] * 10]
    assert packed.input_mask.sum(1).tolist() == [7, 6]
    assert not packed.segment_ids.any()
    assert (stats.examples, stats.lines, stats.documents) == (2, 4, 2)
    assert (stats.corpus_tokens, stats.example_tokens) == (9, 9)
    assert stats.count_ids.tolist() == [10, 11, 12, 13, 14, 15]
    assert stats.counts.tolist() == [3, 1, 2, 1, 1, 1]
    assert stats.count_ids.dtype == stats.counts.dtype == np.int64


def test_bad_lines_are_dropped_and_counted():
    data = b"10 11\n\xff\xfe 12\n13\x00\n14\n"
    packed, stats = encode_chunk(_chunk(data), WordIds(), max_seq_length=16, seed=1)
    assert packed.input_ids[0, :5].tolist() == [CLS, 10, 11, 14, SEP]
    assert (stats.lines, stats.documents, stats.corpus_tokens) == (4, 1, 3)
    assert stats.skipped == {"invalid_utf8": 1, "nul_bytes": 1}
    assert stats.skip_examples == ["x.txt:2: invalid_utf8", "x.txt:3: nul_bytes"]


def test_packing_rng_is_keyed_by_seed_file_and_chunk():
    a = chunk_rng(7, _chunk(b"", 1, 2)).random(4)
    np.testing.assert_array_equal(a, np.random.default_rng([7, 1, 2]).random(4))
    np.testing.assert_array_equal(a, chunk_rng(7, _chunk(b"x", 1, 2)).random(4))
    assert not np.array_equal(a, chunk_rng(7, _chunk(b"", 1, 3)).random(4))
    # One long document (60 tokens over 12 sentences), packed into 12-token examples.
    text = b"".join(b" ".join(str(100 + 5 * s + t).encode() for t in range(5)) + b"\n"
                    for s in range(12))
    first, _ = encode_chunk(_chunk(text), WordIds(), 12, seed=3)
    again, _ = encode_chunk(_chunk(text), WordIds(), 12, seed=3)
    other, _ = encode_chunk(_chunk(text), WordIds(), 12, seed=4)
    np.testing.assert_array_equal(first.input_ids, again.input_ids)
    np.testing.assert_array_equal(first.segment_ids, again.segment_ids)
    assert not np.array_equal(first.segment_ids, other.segment_ids)
    for packed in (first, other):  # every token once, in order, whatever the draws
        ids = packed.input_ids[packed.input_mask.astype(bool)]
        assert ids[(ids != CLS) & (ids != SEP)].tolist() == list(range(100, 160))
        assert packed.content_tokens == 60


def test_pack_chunk_counts_documents():
    lines = ["a", "b", "", "", "c", ""]
    sentences = [np.array([10, 11]), np.array([12]), np.array([13, 14, 15])]
    packed, documents = pack_chunk(_chunk(b""), lines, sentences, WordIds.special_ids, 16, 0)
    assert documents == 2
    assert packed.lengths.tolist() == [5, 5]
    assert packed.content_tokens == 6


def test_serialize_examples_round_trip():
    # Length 8, and this seed draws two segments: A's target is (8 - 3) // 2 = 2 tokens,
    # so the first document's second sentence starts segment B.
    packed, _ = encode_chunk(_chunk(TEXT), WordIds(), max_seq_length=8, seed=1)
    records = serialize_examples(packed)
    assert len(records) == 2 and records == serialize_examples(packed)  # deterministic
    spec = {k: tf.io.FixedLenFeature([8], tf.int64) for k in FEATURES}
    parsed = {k: v.numpy().tolist() for k, v in tf.io.parse_example(records, spec).items()}
    assert parsed["input_ids"] == [[CLS, 10, 11, 10, SEP, 10, 12, SEP],
                                   [CLS, 12, 13, 14, 15, SEP, 0, 0]]
    assert parsed["segment_ids"] == [[0, 0, 0, 0, 0, 1, 1, 1], [0] * 8]
    assert parsed["input_mask"] == [[1] * 8, [1] * 6 + [0] * 2]


def _protobuf_records(packed):
    """The oracle: tf.train.Example protos, serialized deterministically."""
    out = []
    for row in zip(packed.input_ids.tolist(), packed.input_mask.tolist(),
                   packed.segment_ids.tolist()):
        example = tf.train.Example(features=tf.train.Features(feature={
            name: tf.train.Feature(int64_list=tf.train.Int64List(value=values))
            for name, values in zip(FEATURES, row)}))
        out.append(example.SerializeToString(deterministic=True))
    return out


@pytest.mark.parametrize("seq_length", [1, 2, 7, 128, 512])
def test_serialize_examples_bytes_equal_protobufs(seq_length):
    rng = np.random.default_rng(seq_length)
    # Varint sizes change at 2^7, 2^14, 2^21, 2^28: values on both sides of each.
    edges = [0, 127, 128, 16383, 16384, 2**21 - 1, 2**21, 2**28, 2**31 - 1]
    for high in (2, 128, 30522, 2**31):
        n = 13
        ids = rng.integers(0, high, (n, seq_length))
        ids[0] = 0
        ids[1] = np.resize(edges, seq_length)
        segments = rng.integers(0, 2 if high == 2 else high, (n, seq_length))
        packed = PackedExamples(ids.astype(np.int32), segments.astype(np.int32),
                                rng.integers(0, seq_length + 1, n), 0)
        records = serialize_examples(packed)
        assert len(records) == n and records == _protobuf_records(packed)
    # Beyond int32, and negative (10-byte varints), as int64 features may hold.
    wide = np.array([[2**40, -1, 0], [-(2**63), 2**63 - 1, 300]], np.int64)
    packed = PackedExamples(wide, wide[::-1].copy(), np.array([3, 0]), 0)
    assert serialize_examples(packed) == _protobuf_records(packed)
    empty = PackedExamples(np.zeros([0, 8], np.int32), np.zeros([0, 8], np.int32),
                           np.zeros([0], np.int64), 0)
    assert serialize_examples(empty) == []


def test_chunk_stats_json_round_trip():
    stats = ChunkStats(examples=3, lines=9, documents=2, corpus_tokens=40, example_tokens=38,
                       skipped={"nul_bytes": 1}, skip_examples=["x.txt:4: nul_bytes"],
                       count_ids=np.array([5, 9], np.int64), counts=np.array([2, 7], np.int64))
    as_json = stats.to_json()
    assert as_json == {"examples": 3, "lines": 9, "documents": 2, "corpus_tokens": 40,
                       "example_tokens": 38, "skipped": {"nul_bytes": 1},
                       "skip_examples": ["x.txt:4: nul_bytes"]}
    back = ChunkStats.from_json(as_json, stats.count_ids, stats.counts)
    assert back.to_json() == as_json and back.counts.tolist() == [2, 7]
    assert ChunkStats.from_json(as_json).count_ids.size == 0


def test_merge_stats_sums_and_caps_the_quoted_skips():
    total, counts = ChunkStats(), np.zeros([12], np.int64)
    for k in range(3):
        part = ChunkStats(examples=2, lines=5, documents=1, corpus_tokens=10 + k,
                          example_tokens=9, skipped={"nul_bytes": 2, f"r{k}": 1},
                          skip_examples=[f"f{k}:{i}" for i in range(9)],
                          count_ids=np.array([3, 11], np.int64),
                          counts=np.array([4, k], np.int64))
        merge_stats(total, part, counts)
    assert (total.examples, total.lines, total.documents) == (6, 15, 3)
    assert (total.corpus_tokens, total.example_tokens) == (33, 27)
    assert total.skipped == {"nul_bytes": 6, "r0": 1, "r1": 1, "r2": 1}
    assert MAX_SKIP_EXAMPLES == 20
    assert total.skip_examples == ([f"f0:{i}" for i in range(9)] +
                                   [f"f1:{i}" for i in range(9)] + ["f2:0", "f2:1"])
    assert counts[3] == 12 and counts[11] == 3 and counts.sum() == 15


def test_empty_chunk_and_too_short_examples():
    packed, stats = encode_chunk(_chunk(b"\n\n"), WordIds(), max_seq_length=16, seed=1)
    assert packed.input_ids.shape == (0, 16) and packed.content_tokens == 0
    assert (stats.examples, stats.lines, stats.documents, stats.corpus_tokens) == (0, 2, 0, 0)
    assert stats.count_ids.size == stats.counts.size == 0
    with pytest.raises(ValueError, match="^max_seq_length must be at least 5$"):
        encode_chunk(_chunk(TEXT), WordIds(), max_seq_length=4, seed=1)
