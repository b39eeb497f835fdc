"""In-graph tokenization and packing (electra_tf/finetune/text.py)."""

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.finetune.text import TextEncoder, pair_lengths
from tfrecord_builder.tokenizers import Tokenizer, vocab_info
from ram_paths import forget

VOCAB = "data/vocab/bert_uncased_vocab.txt"


@pytest.fixture(scope="module")
def encoder():
    return TextEncoder(VOCAB)


def test_ids_equal_the_pretraining_builder(encoder):
    # The builder's ids are tested equal to reference BERT; fine-tuning must match them.
    lines = [l.rstrip("\n") for l in open("data/corpus/lee_news_sample.txt", encoding="utf-8")]
    lines += ["Café naïve RÉSUMÉ", "ctrl\x01chars\u200b here", "tab\tand  spaces", "",
              "İstanbul ΣΊΣΥΦΟΣ", "\ufeffbom", "emoji 🙂 text"]
    ref = Tokenizer(vocab_info(vocab_file=VOCAB, do_lower_case=True))
    flat, splits = ref.tokenize(lines)
    got = encoder.tokenize_lists(lines)
    assert len(got) == len(lines) > 300
    for i, line in enumerate(lines):
        assert got[i] == flat[splits[i]:splits[i + 1]].tolist(), line


def test_invalid_utf8_is_dropped_not_an_error(encoder):
    ids = encoder.tokenize(tf.constant([b"good \xff\xfe film", b"good film"]))
    assert ids[0].numpy().tolist() == ids[1].numpy().tolist() == [2204, 2143]


@pytest.mark.parametrize("a,b,budget,want", [
    (3, 2, 10, (3, 2)),     # fits
    (10, 2, 8, (6, 2)),     # only the longer is cut
    (2, 10, 8, (2, 6)),
    (10, 10, 8, (4, 4)),    # equal: both cut to half
    (10, 10, 7, (4, 3)),    # ties drop from the second segment first
    (5, 4, 8, (4, 4)),
])
def test_pair_truncation_is_berts(a, b, budget, want):
    def reference(a, b):
        while a + b > budget:
            if a > b:
                a -= 1
            else:
                b -= 1
        return a, b
    assert reference(a, b) == want
    got = pair_lengths(tf.constant([a], tf.int64), tf.constant([b], tf.int64),
                       tf.constant(budget, tf.int64))
    assert (int(got[0][0]), int(got[1][0])) == want


def test_pack_pair_layout(encoder):
    out = encoder.encode_numpy(["good film"], ["a b c d e f"], max_seq_length=10)
    # 2 + 6 tokens for a budget of 10 - 3 = 7: the longer second segment loses one.
    assert out["input_ids"][0].tolist() == [101, 2204, 2143, 102, 1037, 1038, 1039, 1040,
                                            1041, 102]
    assert out["segment_ids"][0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert out["input_mask"][0].tolist() == [1] * 10
    single = encoder.encode_numpy(["good", "x " * 50], max_seq_length=6)
    assert single["input_ids"].tolist() == [[101, 2204, 102, 0, 0, 0],
                                            [101, 1060, 1060, 1060, 1060, 102]]
    assert single["input_mask"].tolist() == [[1, 1, 1, 0, 0, 0], [1] * 6]
    assert np.all(single["segment_ids"] == 0)
    empty = encoder.encode_numpy([""], max_seq_length=4)
    assert empty["input_ids"].tolist() == [[101, 102, 0, 0]]


def _train_spm(lines, vocab_size=300) -> bytes:
    """A small SentencePiece model with the ELECTRA special tokens, trained in memory."""
    import io
    import sentencepiece as spm
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
        pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]", bos_id=-1, eos_id=-1,
        control_symbols=["[CLS]", "[SEP]", "[MASK]"], num_threads=1, minloglevel=2)
    return model.getvalue()


def test_vocab_and_sentencepiece_model_read_from_ram(tmp_path, monkeypatch, encoder):
    """--vocab_file and --spm_model on TensorFlow's in-memory filesystem tokenize as the
    same files on disk; a missing one is a one-line error naming it; nothing local named
    after the ram:// path appears."""
    import os
    import uuid

    import sentencepiece as spm

    from electra_tf import fileio
    from tfrecord_builder import BuildError
    repo = os.getcwd()
    lines = [l.strip().lower() for l in open(os.path.join(
        repo, "data/corpus/lee_news_sample.txt"), encoding="utf-8") if l.strip()][:300]
    proto = _train_spm(lines)
    (tmp_path / "sp.model").write_bytes(proto)
    monkeypatch.chdir(tmp_path)
    root = f"ram://text_{uuid.uuid4().hex}"
    try:
        fileio.write_atomic(f"{root}/sp.model", proto)
        fileio.copy(os.path.join(repo, VOCAB), f"{root}/vocab.txt")
        wordpiece = TextEncoder(f"{root}/vocab.txt")
        assert wordpiece.vocab_size == encoder.vocab_size == 30522
        assert wordpiece.vocab_path == f"{root}/vocab.txt"
        assert wordpiece.tokenize_lists(lines[:50]) == encoder.tokenize_lists(lines[:50])
        assert wordpiece.tokenize_lists(["good film"]) == [[2204, 2143]]

        ram_spm = TextEncoder(spm_model=f"{root}/sp.model")
        local_spm = TextEncoder(spm_model=str(tmp_path / "sp.model"))
        proc = spm.SentencePieceProcessor(model_proto=proto)
        assert ram_spm.vocab_size == local_spm.vocab_size == proc.get_piece_size() == 300
        assert ram_spm.special_ids == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3,
                                       "[MASK]": 4}
        got = ram_spm.tokenize_lists(lines[:50])
        assert got == local_spm.tokenize_lists(lines[:50]) == proc.encode(lines[:50])
        assert sum(map(len, got)) > 500
        for flag, kwargs in (("--vocab_file", {"vocab_file": f"{root}/nope.txt"}),
                             ("--spm_model", {"spm_model": f"{root}/nope.model"})):
            with pytest.raises(BuildError) as e:
                TextEncoder(**kwargs)
            path = kwargs.get("vocab_file") or kwargs.get("spm_model")
            assert str(e.value) == f"{flag}: cannot read {path}: No such file or directory"
        assert not [p for p in tmp_path.rglob("*") if p.name.startswith("ram:")]
    finally:
        forget(root)
