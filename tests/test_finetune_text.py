"""In-graph tokenization and packing (electra_tf/finetune/text.py)."""

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.finetune.text import TextEncoder
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


def bert_pack(a, b, max_seq_length):
    """Reference BERT packing of token lists: _truncate_seq_pair (pop the last token of
    the longer list, of the second on ties), then [CLS] a [SEP] (b [SEP]) and padding."""
    a, b = list(a), None if b is None else list(b)
    budget = max_seq_length - (2 if b is None else 3)
    while len(a) + len(b or []) > budget and (a or b):
        if b is None or len(a) > len(b):
            a.pop()
        else:
            b.pop()
    ids = [101] + a + [102] + ([] if b is None else b + [102])
    segments = [0] * (len(a) + 2) + ([] if b is None else [1] * (len(b) + 1))
    ids, segments = ids[:max_seq_length], segments[:max_seq_length]
    pad = max_seq_length - len(ids)
    return ids + [0] * pad, [1] * len(ids) + [0] * pad, segments + [0] * pad


@pytest.mark.parametrize("max_seq_length", [1, 3, 4, 5, 8, 9, 16])
@pytest.mark.parametrize("graph", [False, True])
def test_pair_truncation_is_berts(encoder, max_seq_length, graph):
    # Every pair of segment lengths up to 3 past the budget, eagerly and in a graph (the
    # SavedModel's path); the segments' tokens are distinct so a wrong cut shows.
    lengths = range(max_seq_length + 4)
    pairs = [(a, b) for a in lengths for b in lengths]
    rows = [(list(range(1000, 1000 + a)), list(range(2000, 2000 + b))) for a, b in pairs]
    ragged = [tf.ragged.constant([r[i] for r in rows], tf.int32, ragged_rank=1)
              for i in (0, 1)]
    pack = tf.function(encoder.pack) if graph else encoder.pack
    for second in (ragged[1], None):
        out = {k: v.numpy().tolist() for k, v in pack(ragged[0], second,
                                                      max_seq_length).items()}
        for i, (a, b) in enumerate(rows):
            want = bert_pack(a, None if second is None else b, max_seq_length)
            got = (out["input_ids"][i], out["input_mask"][i], out["segment_ids"][i])
            assert got == want, (max_seq_length, len(a), len(b), second is None)


def test_pack_pair_layout(encoder):
    out = encoder.encode_numpy(["good film"], ["a b c d e f"], max_seq_length=10)
    # 2 + 6 tokens for a budget of 10 - 3 = 7: the longer second segment loses one.
    assert out["input_ids"][0].tolist() == [101, 2204, 2143, 102, 1037, 1038, 1039, 1040,
                                            1041, 102]
    assert out["segment_ids"][0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert out["input_mask"][0].tolist() == [1] * 10
    # 10 + 10 tokens for a budget of 7: 4 + 3 (ties cut the second segment first).
    out = encoder.pack(tf.ragged.constant([list(range(1000, 1010))], tf.int32),
                       tf.ragged.constant([list(range(2000, 2010))], tf.int32), 10)
    assert out["input_ids"].numpy().tolist() == [[101, 1000, 1001, 1002, 1003, 102, 2000,
                                                  2001, 2002, 102]]
    assert out["segment_ids"].numpy().tolist() == [[0] * 6 + [1] * 4]
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
