import pytest
import tensorflow as tf

from tfrecord_builder import BuildError
from tfrecord_builder.tokenizers import Tokenizer, bert_normalize, normalize, vocab_info

from bert_reference import ReferenceBertTokenizer
from conftest import NEWS, VOCAB, WIKI


def _lines(path, n=None):
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[:n] if n else lines


def _sample_lines():
    lines = _lines(WIKI) + _lines(NEWS)
    return lines + ["Héllo, Wörld! naïve café — “quotes” ½ ² … 中文字 \t tabs\u00a0nbsp",
                    "a" * 150 + " word", "ΟΔΟΣ ΑΧΙΛΛΕΥΣ İstanbul ǅ", "ctrl\x07char \ufffd x"]


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
    with pytest.raises(BuildError) as e:
        vocab_info(str(bad))
    msg = str(e.value)
    assert str(bad) in msg and "[CLS]" in msg and "[SEP]" in msg and "[MASK]" in msg
    assert "\n" not in msg


def test_unreadable_and_empty_vocab(tmp_path):
    with pytest.raises(BuildError, match="nope.txt"):
        vocab_info(str(tmp_path / "nope.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(BuildError, match="empty"):
        vocab_info(str(empty))
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(BuildError, match="not UTF-8"):
        vocab_info(str(binary))
