import numpy as np
import pytest

from tfrecord_builder.packing import Packer

CLS, SEP = 101, 102


def _doc(rng, n_sentences, lo=3, hi=40):
    return [rng.integers(1000, 2000, size=int(rng.integers(lo, hi))).astype(np.int32)
            for _ in range(n_sentences)]


def _content(ids, segs, length):
    """Tokens of segment A then B, without [CLS]/[SEP]."""
    row, seg = ids[:length], segs[:length]
    a = row[1:][seg[1:] == 0][:-1]
    b = row[seg == 1][:-1]
    return np.concatenate([a, b])


def test_layout_and_no_token_lost():
    rng = np.random.default_rng(0)
    docs = [_doc(rng, int(rng.integers(1, 60))) for _ in range(40)]
    packer = Packer(64, CLS, SEP, np.random.default_rng(1))
    for d in docs:
        packer.add_document(d)
    ex = packer.take_examples()
    stream = []
    for ids, segs, mask, n in zip(ex.input_ids, ex.segment_ids, ex.input_mask, ex.lengths):
        assert 3 <= n <= 64
        assert ids[0] == CLS and ids[n - 1] == SEP
        assert (mask[:n] == 1).all() and (mask[n:] == 0).all()
        assert (ids[n:] == 0).all() and (segs[n:] == 0).all()
        n_sep = int((ids[:n] == SEP).sum())
        assert n_sep in (1, 2)
        first_b = np.argmax(segs) if segs.any() else n
        # segment ids: 0 for [CLS] A [SEP], then 1 for B [SEP]; contiguous
        assert (segs[:first_b] == 0).all() and (segs[first_b:n] == 1).all()
        assert (n_sep == 2) == bool(segs.any())
        if n_sep == 2:
            assert ids[first_b - 1] == SEP
        stream.append(_content(ids, segs, n))
    # Carry-over keeps every token, in order.
    expected = np.concatenate([np.concatenate(d) for d in docs])
    np.testing.assert_array_equal(np.concatenate(stream), expected)
    assert ex.content_tokens == len(expected)


def test_long_sentence_fills_examples():
    sentence = np.arange(10_000, dtype=np.int32) + 1000
    packer = Packer(128, CLS, SEP, np.random.default_rng(3))
    packer.add_document([sentence])
    ex = packer.take_examples()
    # Full examples hold 126 content tokens (one segment: the sentence overflows A).
    full = ex.lengths == 128
    assert full.sum() >= 10_000 // 126 - 5
    assert ex.content_tokens == 10_000
    np.testing.assert_array_equal(
        np.concatenate([_content(i, s, n) for i, s, n in
                        zip(ex.input_ids, ex.segment_ids, ex.lengths)]), sentence)


def test_segment_statistics():
    """Many short sentences: ~10% single-segment examples, ~5% short targets."""
    rng = np.random.default_rng(7)
    packer = Packer(128, CLS, SEP, np.random.default_rng(11))
    for _ in range(300):
        packer.add_document(_doc(rng, 200, 5, 15))
    ex = packer.take_examples()
    two_segments = ex.segment_ids.any(axis=1)
    single_rate = 1 - two_segments.mean()
    assert 0.07 < single_rate < 0.14, single_rate
    # Examples far below the target come from the 5% short targets (and document ends).
    short_rate = (ex.lengths < 100).mean()
    assert 0.03 < short_rate < 0.09, short_rate
    assert len(ex.lengths) > 3000


def test_deterministic_for_seed():
    rng = np.random.default_rng(0)
    docs = [_doc(rng, 30) for _ in range(10)]

    def run(seed):
        p = Packer(128, CLS, SEP, np.random.default_rng(seed))
        for d in docs:
            p.add_document(d)
        return p.take_examples().input_ids

    np.testing.assert_array_equal(run(5), run(5))
    assert not np.array_equal(run(5), run(6))


def test_rejects_tiny_length():
    with pytest.raises(ValueError):
        Packer(4, CLS, SEP, np.random.default_rng(0))
