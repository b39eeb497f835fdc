"""electra_tf/text.py: normalisation and the builder's Tokenizer against reference BERT,
vocabulary checks, and the in-graph TextEncoder (ids equal the builder's, BERT's pair
truncation and layout, vocabularies on ram://)."""

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.text import (TextEncoder, Tokenizer, VocabError, bert_normalize, normalize,
                             vocab_info)

from bert_reference import ReferenceBertTokenizer
from conftest import NEWS, VOCAB, WIKI
from ram_paths import forget


def _lines(path, n=None):
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[:n] if n else lines


def _sample_lines():
    lines = _lines(WIKI) + _lines(NEWS)
    return lines + ["Héllo, Wörld! naïve café — “quotes” ½ ² … 中文字 \t tabs\u00a0nbsp",
                    "a" * 150 + " word", "ΟΔΟΣ ΑΧΙΛΛΕΥΣ İstanbul ǅ", "ctrl\x07char \ufffd x"]


@pytest.mark.slow
def test_ids_equal_reference_bert_uncased():
    """Every line of both bundled corpora (and some hard cases) gets exactly the ids of
    the reference BERT uncased algorithm."""
    ref = ReferenceBertTokenizer(VOCAB, lower=True)
    tok = Tokenizer(vocab_info(VOCAB))
    lines = _sample_lines()
    flat, splits = tok.tokenize(lines)
    mismatches = [line for i, line in enumerate(lines)
                  if flat[splits[i]:splits[i + 1]].tolist() != ref.encode(line)]
    assert len(lines) > 19_000 and len(flat) > 600_000
    assert mismatches == []


def test_cased_ids_equal_reference():
    ref = ReferenceBertTokenizer(VOCAB, lower=False)
    tok = Tokenizer(vocab_info(VOCAB, do_lower_case=False))
    lines = _sample_lines()[:3000]
    flat, splits = tok.tokenize(lines)
    assert all(flat[splits[i]:splits[i + 1]].tolist() == ref.encode(line)
               for i, line in enumerate(lines))


@pytest.mark.slow
def test_reference_agrees_with_hugging_face():
    """Cross-check of the reference itself against transformers' BertTokenizer; they
    differ only where the Rust lower-casing ignores Greek final sigma."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertTokenizer(VOCAB, do_lower_case=True)
    ref = ReferenceBertTokenizer(VOCAB, lower=True)
    lines = _sample_lines()
    differ = [line for line in lines
              if hf.convert_tokens_to_ids(hf.tokenize(line)) != ref.encode(line)]
    assert all("Σ" in line for line in differ), differ[:3]
    assert len(differ) <= 3


def test_normalize_by_hand():
    raw = tf.constant([b"Caf\xc3\xa9 NA\xc3\x8fVE", b"a\x07b\xe2\x80\x8bc\tD\r\n",
                       b"bad \xff\xfe bytes \xef\xbf\xbd", "ΟΔΟΣ İ".encode(),
                       "\u0378x".encode()])
    # Control (\x07), format (U+200B) and U+FFFD go, invalid bytes with them; tab, CR and
    # newline stay. Lower-casing: Greek final sigma as str.lower, U+0130 -> i + U+0307
    # (a mark: stripped with the accents). The unassigned U+0378 stays (reference BERT
    # drops it).
    want = [["café naïve", "abc\td\r\n", "bad  bytes ", "οδος i\u0307", "\u0378x"],
            ["cafe naive", "abc\td\r\n", "bad  bytes ", "οδος i", "\u0378x"],
            ["Café NAÏVE", "abc\tD\r\n", "bad  bytes ", "ΟΔΟΣ İ", "\u0378x"],
            ["Café NAÏVE", "a\x07b\u200bc\tD\r\n", "bad \ufffd\ufffd bytes \ufffd",
             "ΟΔΟΣ İ", "\u0378x"]]
    cases = [dict(lower=True, strip_accents=False), dict(lower=True),
             dict(lower=False), dict(lower=False, clean=False)]
    for options, expected in zip(cases, want):
        got = [s.decode("utf-8", "replace") for s in normalize(raw, **options).numpy()]
        assert got == expected, options
    assert normalize(tf.constant([["A"], ["É"]]), lower=True).numpy().tolist() == [
        [b"a"], [b"e"]]
    assert bert_normalize(["Héllo\x00 Wörld", ""], lower=True) == ["hello world", ""]
    assert bert_normalize([], lower=True) == []


def test_known_ids():
    tok = Tokenizer(vocab_info(VOCAB))
    flat, splits = tok.tokenize(["Hello World!", "Anarchism is a political philosophy"])
    assert flat.tolist() == [7592, 2088, 999, 9617, 11140, 2964, 2003, 1037, 2576, 4695]
    assert splits.tolist() == [0, 3, 10]
    assert tok.ids_to_tokens(flat[3:6]) == ["ana", "##rch", "##ism"]


def test_vocab_info_specials_and_hash():
    info = vocab_info(VOCAB)
    assert info.vocab_size == 30522
    assert info.special_ids == {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102,
                                "[MASK]": 103}
    assert len(info.sha256) == 64


def test_vocab_without_specials_is_refused(tmp_path):
    bad = tmp_path / "vocab.txt"
    bad.write_text("\n".join(["[PAD]", "[UNK]", "the", "a"]) + "\n")
    with pytest.raises(VocabError) as e:
        vocab_info(str(bad))
    msg = str(e.value)
    assert str(bad) in msg and "[CLS]" in msg and "[SEP]" in msg and "[MASK]" in msg
    assert "\n" not in msg


def test_unreadable_and_empty_vocab(tmp_path):
    with pytest.raises(VocabError, match="nope.txt"):
        vocab_info(str(tmp_path / "nope.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(VocabError, match="empty"):
        vocab_info(str(empty))
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(VocabError, match="not UTF-8"):
        vocab_info(str(binary))


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
    from electra_tf.text import VocabError
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
            with pytest.raises(VocabError) as e:
                TextEncoder(**kwargs)
            path = kwargs.get("vocab_file") or kwargs.get("spm_model")
            assert str(e.value) == f"{flag}: cannot read {path}: No such file or directory"
        assert not [p for p in tmp_path.rglob("*") if p.name.startswith("ram:")]
    finally:
        forget(root)
