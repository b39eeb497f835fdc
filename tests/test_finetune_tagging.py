"""Tests of electra_tf.finetune.tagging: CoNLL reading, BIOES conversion, the label map and
word-level predictions, and of the sub-token features they read (tagging_task's
pack_words, shared with serving), on tiny hand-made files."""

import json

import numpy as np
import pytest

from electra_tf.finetune import DataError
from electra_tf.finetune.tagging import (LabelMap, Sentence, predictions_to_tags,
                                         read_conll, to_bioes)
from electra_tf.finetune.tagging_task import TaggingTask

from conftest import EagerEncoder

SPECIAL = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 1, "[SEP]": 2, "[MASK]": 3}

CHUNK = """\
Confidence NN B-NP
in IN B-PP
the DT B-NP
pound NN I-NP
is VBZ B-VP
widely RB I-VP
expected VBN I-VP

Chancellor NNP O
of IN B-PP
the DT B-NP
Exchequer NNP I-NP

Ride VB B-VP
"""

# CoNLL-2003 is IOB1: I- opens a chunk, B- only splits adjacent chunks of one type.
NER = """\
-DOCSTART- -X- -X- O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O

Peter NNP I-NP I-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O

BRUSSELS NNP I-NP I-LOC
1996-08-22 CD I-NP O
"""


class FakeTokenizer:
    """Lower-cased words cut into 2-character pieces, ids 10, 11, ... by first sight;
    words made only of control characters give no pieces."""

    def __init__(self):
        self.vocab = {}
        self.calls = 0

    def __call__(self, words):
        self.calls += 1
        out = []
        for word in words:
            word = "".join(c for c in word.lower() if c.isprintable())
            pieces = [word[i:i + 2] for i in range(0, len(word), 2)]
            out.append([self.vocab.setdefault(p, 10 + len(self.vocab)) for p in pieces])
        return out


def features(sentences, tokenize, special, label_map, max_seq_length,
                      scheme="bioes"):
    """TaggingTask.features (serving's pack_words) with a hand-made tokenizer."""
    task = TaggingTask(scheme=scheme, label_map=label_map)
    return task.features(sentences, EagerEncoder(tokenize, special), max_seq_length)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return str(path)


def test_read_conll2000_chunking(tmp_path):
    sentences = read_conll(write(tmp_path, "train.txt", CHUNK))
    assert len(sentences) == 3
    assert [len(s.words) for s in sentences] == [7, 4, 1]
    assert sentences[0].words[:4] == ("Confidence", "in", "the", "pound")
    assert sentences[0].labels == ("B-NP", "B-PP", "B-NP", "I-NP", "B-VP", "I-VP", "I-VP")
    assert sentences[1].labels == ("O", "B-PP", "B-NP", "I-NP")
    assert [s.line for s in sentences] == [1, 9, 14]
    pos = read_conll(write(tmp_path, "pos.txt", CHUNK), label_column=1)
    assert pos[1].labels == ("NNP", "IN", "DT", "NNP")


def test_read_conll2003_ner_skips_docstart(tmp_path):
    path = write(tmp_path, "ner.txt", NER)
    sentences = read_conll(path)
    assert len(sentences) == 3
    assert sentences[0].words == ("EU", "rejects", "German", "call")
    assert sentences[0].labels == ("I-ORG", "O", "I-MISC", "O")
    assert sentences[1].labels == ("I-PER", "I-PER")
    assert sentences[2].labels == ("I-LOC", "O")
    assert [s.line for s in sentences] == [3, 8, 13]
    assert sentences[2].where(1) == f"{path}:14"
    chunks = read_conll(path, label_column=2)
    assert chunks[0].labels == ("I-NP", "I-VP", "I-NP", "I-NP")


def test_read_conll_tolerates_crlf_tabs_and_trailing_blanks(tmp_path):
    text = "\ufeffa\tDT  B-NP\r\nb NN I-NP\r\n\r\n\r\n\r\nc VB B-VP\r\n\r\n"
    sentences = read_conll(write(tmp_path, "crlf.txt", text))
    assert [(s.words, s.labels, s.line) for s in sentences] == [
        (("a", "b"), ("B-NP", "I-NP"), 1), (("c",), ("B-VP",), 6)]


def test_to_bioes_from_bio():
    bio = ["B-NP", "I-NP", "I-NP", "O", "B-VP", "B-NP", "I-NP", "B-NP", "O", "I-NP", "I-NP"]
    expected = ["B-NP", "I-NP", "E-NP", "O", "S-VP", "B-NP", "E-NP", "S-NP", "O", "B-NP", "E-NP"]
    assert to_bioes(bio) == expected
    assert to_bioes(expected) == expected


def test_to_bioes_from_iob1():
    iob1 = ["I-PER", "I-PER", "B-PER", "O", "I-ORG", "I-LOC", "I-LOC", "O", "I-MISC"]
    expected = ["B-PER", "E-PER", "S-PER", "O", "S-ORG", "B-LOC", "E-LOC", "O", "S-MISC"]
    assert to_bioes(iob1) == expected
    assert to_bioes(expected) == expected


def test_to_bioes_edge_cases():
    assert to_bioes([]) == []
    assert to_bioes(["O", "O"]) == ["O", "O"]
    # An I- after a closed chunk (E-/S-) starts a new one.
    assert to_bioes(["B-X", "E-X", "I-X", "S-X", "I-X", "I-X"]) == \
        ["B-X", "E-X", "S-X", "S-X", "B-X", "E-X"]
    with pytest.raises(ValueError):
        to_bioes(["B-NP", "NN"])


def test_label_map_sorted_complete_and_json(tmp_path):
    sentences = read_conll(write(tmp_path, "train.txt", CHUNK))
    label_map = LabelMap.from_sentences(sentences)
    assert label_map.labels == ("O", "B-NP", "B-PP", "B-VP", "E-NP", "E-PP", "E-VP",
                                "I-NP", "I-PP", "I-VP", "S-NP", "S-PP", "S-VP")
    assert [label_map.get(t) for t in ["O", "S-PP", "E-VP"]] == [0, 11, 6]
    assert label_map.names([0, 11, 6]) == ["O", "S-PP", "E-VP"]
    assert json.loads(label_map.to_json()) == {"scheme": "bioes",
                                               "labels": list(label_map.labels)}
    assert LabelMap.from_sentences(reversed(sentences)) == label_map
    assert label_map.get("B-ADJP") is None
    with pytest.raises(ValueError):
        label_map.names([13])
    bio = LabelMap.from_sentences(sentences, scheme="bio")
    assert bio.labels == ("O", "B-NP", "B-PP", "B-VP", "I-NP", "I-PP", "I-VP")


def hand_made():
    return Sentence(("Confidence", "in", "the", "pound"), ("B-NP", "B-PP", "B-NP", "I-NP"),
                    line=1, path="hand.txt")


def test_features_exact_rows():
    sentence = hand_made()
    label_map = LabelMap.from_sentences([sentence])
    assert [label_map.get(t) for t in ["S-NP", "S-PP", "B-NP", "E-NP"]] == [7, 8, 1, 3]
    tokenize = FakeTokenizer()
    f = features([sentence], tokenize, SPECIAL, label_map, max_seq_length=16)
    assert tokenize.calls == 1
    # co nf id en ce | in | th e | po un d
    np.testing.assert_array_equal(
        f.input_ids, [[1, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 2, 0, 0, 0]])
    np.testing.assert_array_equal(f.input_mask, [[1] * 13 + [0] * 3])
    np.testing.assert_array_equal(f.segment_ids, np.zeros((1, 16)))
    np.testing.assert_array_equal(
        f.label_ids, [[0, 7, 0, 0, 0, 0, 8, 1, 0, 3, 0, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(
        f.label_weights, [[0, 1, 0, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0]])
    assert [p.tolist() for p in f.word_positions] == [[1, 6, 7, 9]]
    assert f.num_truncated_words == 0
    arrays = f.arrays()
    assert {k: v.dtype for k, v in arrays.items()} == {
        "input_ids": np.int32, "input_mask": np.int32, "segment_ids": np.int32,
        "label_ids": np.int32, "label_weights": np.float32, "weight": np.float32}
    np.testing.assert_array_equal(arrays["weight"], [1.0])
    assert predictions_to_tags(f, f.label_ids, label_map) == [["S-NP", "S-PP", "B-NP", "E-NP"]]


def test_features_truncation():
    sentence = hand_made()
    label_map = LabelMap.from_sentences([sentence])
    f = features([sentence], FakeTokenizer(), SPECIAL, label_map, max_seq_length=8)
    np.testing.assert_array_equal(f.input_ids, [[1, 10, 11, 12, 13, 14, 15, 2]])
    np.testing.assert_array_equal(f.label_ids, [[0, 7, 0, 0, 0, 0, 8, 0]])
    assert f.word_positions[0].tolist() == [1, 6, -1, -1]
    assert f.num_truncated_words == 2
    assert predictions_to_tags(f, f.label_ids, label_map) == [["S-NP", "S-PP", "O", "O"]]
    # A word cut after its first piece keeps its label; the rest are gone.
    f = features([sentence], FakeTokenizer(), SPECIAL, label_map, max_seq_length=5)
    np.testing.assert_array_equal(f.input_ids, [[1, 10, 11, 12, 2]])
    assert f.word_positions[0].tolist() == [1, -1, -1, -1]
    assert f.num_truncated_words == 3
    assert predictions_to_tags(f, f.label_ids, label_map) == [["S-NP", "O", "O", "O"]]


def test_features_word_without_tokens():
    sentences = [Sentence(("ab", "\x07", "cde"), ("B-NP", "O", "B-VP"), 1, "ctl.txt"),
                 Sentence(("\x07\x07",), ("B-NP",), 5, "ctl.txt")]
    label_map = LabelMap.from_sentences(sentences)
    tokenize = FakeTokenizer()
    f = features(sentences, tokenize, SPECIAL, label_map, max_seq_length=6)
    assert tokenize.calls == 1
    np.testing.assert_array_equal(f.input_ids, [[1, 10, 11, 12, 2, 0], [1, 2, 0, 0, 0, 0]])
    np.testing.assert_array_equal(f.label_weights, [[0, 1, 1, 0, 0, 0], [0] * 6])
    assert [p.tolist() for p in f.word_positions] == [[1, -1, 2], [-1]]
    assert f.num_truncated_words == 0
    # Whatever the model says at padding, words without tokens read as O.
    predicted = np.full((2, 6), label_map.get("S-NP"), np.int32)
    assert predictions_to_tags(f, predicted, label_map) == [["S-NP", "O", "S-NP"], ["O"]]


def test_predictions_round_trip_on_ner(tmp_path):
    sentences = read_conll(write(tmp_path, "ner.txt", NER))
    label_map = LabelMap.from_sentences(sentences)
    f = features(sentences, FakeTokenizer(), SPECIAL, label_map, max_seq_length=32)
    assert f.input_ids.shape == (3, 32) and f.num_truncated_words == 0
    tags = predictions_to_tags(f, f.label_ids, label_map)
    assert tags == [["S-ORG", "O", "S-MISC", "O"], ["B-PER", "E-PER"], ["S-LOC", "O"]]
    assert tags == [to_bioes(s.labels) for s in sentences]
    with pytest.raises(ValueError):
        predictions_to_tags(f, f.label_ids[:, :16], label_map)


def test_wrong_column_count(tmp_path):
    text = "a DT B-NP\nb NN I-NP\n\nc VB B-VP\nd B-NP\n"
    with pytest.raises(DataError) as e:
        read_conll(write(tmp_path, "name.txt", text))
    message = str(e.value)
    assert "name.txt:5" in message and "expected 3 columns, found 2" in message
    assert "\n" not in message


def test_label_column_out_of_range_and_empty(tmp_path):
    path = write(tmp_path, "cols.txt", "a DT B-NP\n")
    for column in (3, -4, 0, -3):
        with pytest.raises(DataError, match="cols.txt"):
            read_conll(path, label_column=column)
    for text in ("", "\n\n", "-DOCSTART- -X- -X- O\n\n"):
        with pytest.raises(DataError, match="empty.txt"):
            read_conll(write(tmp_path, "empty.txt", text))


def test_non_utf8(tmp_path):
    path = write(tmp_path, "latin.txt", b"a DT B-NP\n\ncaf\xe9 NN B-NP\n")
    with pytest.raises(DataError, match="latin.txt:3"):
        read_conll(path)


def test_unknown_dev_label(tmp_path):
    label_map = LabelMap.from_sentences(read_conll(write(tmp_path, "train.txt", CHUNK)))
    # ADJP (line 4) is a chunk type training never saw.
    dev = read_conll(write(tmp_path, "dev.txt", "x IN B-PP\n\ny VB B-VP\nz JJ B-ADJP\n"))
    with pytest.raises(DataError, match="dev.txt:4") as e:
        features(dev, FakeTokenizer(), SPECIAL, label_map, max_seq_length=8)
    assert "B-ADJP" in str(e.value)
    # Training only has one-token PP chunks, yet B-PP/E-PP of a known type still map.
    dev = read_conll(write(tmp_path, "dev2.txt", "x IN I-PP\ny IN I-PP\n\nz VB I-VP\n"))
    f = features(dev, FakeTokenizer(), SPECIAL, label_map, max_seq_length=8)
    assert predictions_to_tags(f, f.label_ids, label_map) == [["B-PP", "E-PP"], ["S-VP"]]


def test_bad_tag_for_scheme_names_line(tmp_path):
    pos = read_conll(write(tmp_path, "pos.txt", CHUNK), label_column=1)
    with pytest.raises(DataError, match="pos.txt:1"):
        LabelMap.from_sentences(pos)
    raw = LabelMap.from_sentences(pos, scheme="raw")
    assert raw.labels[:3] == ("O", "DT", "IN")
    f = features(pos, FakeTokenizer(), SPECIAL, raw, max_seq_length=24, scheme="raw")
    assert predictions_to_tags(f, f.label_ids, raw) == [list(s.labels) for s in pos]
