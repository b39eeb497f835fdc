"""Tests of electra_tf.finetune.squad: reading SQuAD JSON, sliding-window features and
postprocessing of the joint head's top-k outputs, on tiny hand-made files."""

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest

from electra_tf.finetune import DataError
from electra_tf.finetune.squad import (SquadExample, get_final_text, postprocess,
                                       read_squad)

from electra_tf.finetune.qa_task import SquadTask

from bert_reference import ReferenceBertTokenizer
from conftest import REPO, VOCAB, EagerEncoder

SPECIAL = {"[PAD]": 0, "[CLS]": 1, "[SEP]": 2, "[UNK]": 3, "[MASK]": 4}
CLS, SEP, PAD = 1, 2, 0


class FakeTokenizer:
    """Lower-cases, splits on whitespace (and on punctuation when `punct`, as WordPiece
    does), then cuts each token into pieces of up to 3 characters; ids from 10 up, given
    on first sight. Words in `silent` have no sub-tokens. Records its batched calls."""

    def __init__(self, punct=False, silent=()):
        self.punct, self.silent = punct, set(silent)
        self.ids, self.calls = {}, []

    def pieces(self, text):
        out = []
        for word in text.lower().split():
            if word in self.silent:
                continue
            parts = re.findall(r"\w+|[^\w\s]", word) if self.punct else [word]
            for part in parts:
                out.extend(part[i:i + 3] for i in range(0, len(part), 3))
        return out

    def id(self, piece):
        return self.ids.setdefault(piece, 10 + len(self.ids))

    def __call__(self, strings):
        self.calls.append(list(strings))
        return [[self.id(p) for p in self.pieces(s)] for s in strings]


def features(examples, tokenize, special, max_seq_length, doc_stride=128,
             max_query_length=4, is_training=False):
    """SquadTask.features (the serving windows) with a hand-made tokenizer. Short queries
    here; the official check wants max_query_length + 3 < max_seq_length."""
    task = SquadTask(doc_stride=doc_stride, max_query_length=max_query_length)
    return task.features(examples, EagerEncoder(tokenize, special), max_seq_length,
                         is_training)


def _squad(paragraphs, version="1.1"):
    return {"version": version, "data": [{"title": "T", "paragraphs": paragraphs}]}


def _write(tmp_path, obj, name="squad.json"):
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj, indent=1),
                    encoding="utf-8")
    return str(path)


def _qa(qid, question, answers, **extra):
    return dict(id=qid, question=question,
                answers=[{"text": t, "answer_start": s} for t, s in answers], **extra)


TEN = " ".join(f"W{i}" for i in range(10))  # each word one token; word i at char 3 * i


# ---------------------------------------------------------------------------------------
# Reading


def test_read_words_offsets_and_answers(tmp_path):
    context = "Alpha\u202fbeta  gamma\u00a0delta\tepsilon\n(1895) zeta"
    paragraphs = [{"context": context, "qas": [
        _qa("q1", "Which?", [("gamma\u00a0delta", 12), ("delta", 18)]),
        _qa("q2", "Year?", [("1895", 33)]),
        _qa("q3", "First?", [("Alpha", 0)])]}]
    path = _write(tmp_path, _squad(paragraphs))
    ev = read_squad(path, is_training=False, v2=False)
    assert [e.qid for e in ev] == ["q1", "q2", "q3"]
    # U+202F, tab and newline split words; the no-break space does not.
    assert ev[0].doc_words == ("Alpha", "beta", "gamma\u00a0delta", "epsilon", "(1895)",
                               "zeta")
    assert ev[0].answers == ("gamma\u00a0delta", "delta")
    assert ev[0].doc_words is ev[1].doc_words  # one tuple per paragraph
    assert (ev[0].start_word, ev[0].end_word, ev[0].is_impossible) == (-1, -1, False)

    tr = read_squad(path, is_training=True, v2=False)
    # q1's answer, cleaned with Python's whitespace, is "gamma delta", which the words
    # do not contain: skipped (official behaviour), the others are kept.
    assert [e.qid for e in tr] == ["q2", "q3"]
    assert (tr[0].start_word, tr[0].end_word, tr[0].answer_text) == (4, 4, "1895")
    assert (tr[1].start_word, tr[1].end_word) == (0, 0)
    assert isinstance(tr[0], SquadExample)
    with pytest.raises(Exception):
        tr[0].qid = "x"  # frozen


def test_read_v2_unanswerable_and_v1_rules(tmp_path):
    paragraphs = [{"context": TEN, "qas": [
        _qa("a", "q?", [("W1 W2", 3)], is_impossible=False),
        _qa("b", "q?", [], is_impossible=True),
        _qa("c", "q?", [])]}]  # no is_impossible field: unanswerable from its answers
    path = _write(tmp_path, _squad(paragraphs, "v2.0"))
    for is_training in (True, False):
        ex = read_squad(path, is_training=is_training, v2=True)
        assert [(e.qid, e.is_impossible) for e in ex] == [("a", False), ("b", True),
                                                          ("c", True)]
    ex = read_squad(path, is_training=True, v2=True)
    assert (ex[0].start_word, ex[0].end_word) == (1, 2)
    assert (ex[1].start_word, ex[1].end_word) == (-1, -1)
    assert [e.answers for e in ex] == [("W1 W2",), (), ()]
    # SQuAD 1.1: questions without answers are fine for evaluation, an error for training.
    assert len(read_squad(path, is_training=False, v2=False)) == 3
    with pytest.raises(DataError, match=r"squad\.json:\d+: .*\"b\" has no answers"):
        read_squad(path, is_training=True, v2=False)


BAD_JSON = """\
{"version": "1.1",
 "data": [
  {"title": "T",
   "paragraphs": [
    {"context": "one two"
     "qas": []}
   ]}
 ]}
"""

FILE = """\
{"version": "1.1",
 "data": [
  {"title": "T",
   "paragraphs": [
    {"context": "one two three",
     "qas": [
      {"id": "good",
       "question": "What?",
       "answers": [{"text": "two", "answer_start": 4}]},
      {
       "id": "bad",
       QUESTION
       "answers": [
        {"text": "ANSWER",
         "answer_start": START}
       ]}
     ]}
   ]}
 ]}
"""


def _file(question='"question": "Why?",', answer="three", start="8"):
    return FILE.replace("QUESTION", question).replace("ANSWER", answer).replace(
        "START", start)


def test_file_is_valid_when_fixed(tmp_path):
    ex = read_squad(_write(tmp_path, _file()), is_training=True, v2=False)
    assert [(e.qid, e.start_word, e.end_word) for e in ex] == [("good", 1, 1),
                                                                ("bad", 2, 2)]


@pytest.mark.parametrize("text,line,what", [
    (BAD_JSON, 6, "invalid JSON: Expecting ',' delimiter"),
    # answer_start past the context: the line of the offending answer_start.
    (_file(start="11"), 15, 'answer_start 11 + len(text) 5 of question "bad" lies '
                            'outside its context (13 characters)'),
    (_file(start="-1"), 15, "answer_start -1"),
    # A question's own problems point at its "id" line.
    (_file(question=""), 11, 'question "bad" has no "question" field'),
    (_file(answer="thre3"), 14, 'the answer text of question "bad" does not match'),
    (_file(start='"8"'), 15, '"answer_start" of an answer of question "bad" must be an '
                             'integer'),
    (_file().replace('"qas"', '"QAS"'), 5, 'a paragraph has no "qas" field'),
])
def test_malformed_files_name_file_and_line(tmp_path, text, line, what):
    path = _write(tmp_path, text, name="dev-bad.json")
    for is_training in (True, False):
        with pytest.raises(DataError) as info:
            read_squad(path, is_training=is_training, v2=False)
        message = str(info.value)
        assert message.startswith(f"{path}:{line}: ")
        assert what in message
        assert "\n" not in message


def test_unreadable_file(tmp_path):
    with pytest.raises(DataError, match="missing.json: cannot read"):
        read_squad(str(tmp_path / "missing.json"), is_training=False, v2=False)
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"data": [\n\n"caf\xe9"]}')
    with pytest.raises(DataError,
                       match=r"latin1\.json:3: not valid UTF-8 \(byte 0xe9 at column 5\)"):
        read_squad(str(path), is_training=False, v2=False)


# ---------------------------------------------------------------------------------------
# Features


def _examples(tmp_path, paragraphs, is_training, v2=False):
    return read_squad(_write(tmp_path, _squad(paragraphs, "v2.0" if v2 else "1.1")),
                      is_training=is_training, v2=v2)


def test_windows_layout_and_max_context(tmp_path):
    ex = _examples(tmp_path, [{"context": TEN, "qas": [_qa("q", "Qq", [])]}], False)
    tok = FakeTokenizer()
    f = features(ex, tok, SPECIAL, max_seq_length=10, doc_stride=3)
    # 10 doc tokens, 10 - 1 - 3 = 6 per window, stride 3: tokens 0-5, 3-8, 6-9.
    w = [tok.ids[f"w{i}"] for i in range(10)]
    q = tok.ids["qq"]
    assert f.input_ids.tolist() == [
        [CLS, q, SEP] + w[0:6] + [SEP],
        [CLS, q, SEP] + w[3:9] + [SEP],
        [CLS, q, SEP] + w[6:10] + [SEP, PAD, PAD]]
    assert f.input_mask.tolist()[2] == [1] * 8 + [0, 0]
    assert f.segment_ids.tolist() == [[0] * 3 + [1] * 7, [0] * 3 + [1] * 7,
                                      [0] * 3 + [1] * 5 + [0] * 2]
    assert f.token_to_orig_map[1].tolist() == [-1] * 3 + [3, 4, 5, 6, 7, 8] + [-1]
    assert f.token_to_orig_map[2].tolist() == [-1] * 3 + [6, 7, 8, 9] + [-1] * 3
    # Scores min(left, right) + 0.01 * length give tokens 0-4 to the first window
    # (token 4 ties 1.06 with the second, the first wins), 5-7 to the second, 8-9 to
    # the third.
    assert [m[3:9].tolist() for m in f.token_is_max_context[:2]] == [
        [True] * 5 + [False], [False, False, True, True, True, False]]
    assert f.token_is_max_context[2].tolist() == [False] * 5 + [True, True] + [False] * 3
    assert not any(m[[0, 1, 2, 9]].any() for m in f.token_is_max_context)
    assert f.example_index.tolist() == [0, 0, 0] and f.num_examples == 1 and len(f) == 3
    arrays = f.arrays()
    assert sorted(arrays) == ["end_positions", "input_ids", "input_mask", "is_impossible",
                              "segment_ids", "start_positions", "weight"]
    assert arrays.pop("weight").tolist() == [1.0, 1.0, 1.0]
    assert all(a.dtype == np.int32 and a.shape[0] == 3 for a in arrays.values())
    assert arrays["start_positions"].tolist() == [0, 0, 0]


def test_multi_token_words_query_truncation_and_silent_words(tmp_path):
    paragraphs = [{"context": "ab cdefg zz h ijklmn op",
                   "qas": [_qa("q", "what is it here", [])]}]
    ex = _examples(tmp_path, paragraphs, False)
    tok = FakeTokenizer(silent={"zz"})
    f = features(ex, tok, SPECIAL, max_seq_length=16, doc_stride=8,
                                     max_query_length=3)
    # Query "wha t is it here" cut to 3 tokens; "zz" (word 2) has no sub-tokens.
    ids = tok.ids
    assert f.input_ids[0].tolist() == (
        [CLS, ids["wha"], ids["t"], ids["is"], SEP, ids["ab"], ids["cde"], ids["fg"],
         ids["h"], ids["ijk"], ids["lmn"], ids["op"], SEP, PAD, PAD, PAD])
    assert f.token_to_orig_map[0].tolist() == ([-1] * 5 + [0, 1, 1, 3, 4, 4, 5]
                                               + [-1] * 4)
    assert f.segment_ids[0].tolist() == [0] * 5 + [1] * 8 + [0] * 3
    assert f.token_is_max_context[0][5:12].all()


def test_tokenize_is_batched(tmp_path):
    paragraphs = [{"context": TEN, "qas": [_qa(f"a{i}", f"Q{i}", [(f"W{i}", 3 * i)])
                                           for i in range(4)]},
                  {"context": "x y z", "qas": [_qa("b", "Q0", [("y", 2)])]}]
    ex = _examples(tmp_path, paragraphs, True)
    tok = FakeTokenizer()
    features(ex, tok, SPECIAL, max_seq_length=32, is_training=True)
    # Once for the questions, once for the words of the contexts, once for the distinct
    # answers (no word has punctuation to split into basic pieces).
    assert tok.calls == [["Q0", "Q1", "Q2", "Q3", "Q0"], TEN.split() * 4 + ["x", "y", "z"],
                         ["W0", "W1", "W2", "W3", "y"]]
    tok = FakeTokenizer()
    features(ex, tok, SPECIAL, max_seq_length=32)
    assert len(tok.calls) == 2


def test_training_positions_across_windows(tmp_path):
    paragraphs = [{"context": TEN, "qas": [_qa("one", "Qq", [("W4", 12)]),
                                           _qa("three", "Qq", [("W5 W6 W7", 15)])]}]
    ex = _examples(tmp_path, paragraphs, True)
    f = features(ex, FakeTokenizer(), SPECIAL, max_seq_length=10,
                                     doc_stride=3, is_training=True)
    # Windows hold doc tokens 0-5, 3-8, 6-9 at positions 3...; W4 is in the first two.
    assert f.example_index.tolist() == [0, 0, 0, 1, 1, 1]
    assert f.start_positions.tolist() == [7, 4, 0, 0, 5, 0]
    assert f.end_positions.tolist() == [7, 4, 0, 0, 7, 0]
    assert f.is_impossible.tolist() == [0, 0, 1, 1, 0, 1]


def test_improve_answer_span_tightens_to_answer_tokens(tmp_path):
    context = "Born in Paris (1895) he died."
    paragraphs = [{"context": context, "qas": [_qa("q", "When", [("1895", 15)])]}]
    ex = _examples(tmp_path, paragraphs, True)
    assert (ex[0].start_word, ex[0].end_word) == (3, 3)  # the word "(1895)"
    tok = FakeTokenizer(punct=True)
    f = features(ex, tok, SPECIAL, max_seq_length=32, is_training=True)
    # [CLS] whe n [SEP] bor n in par is ( 189 5 ) ...: "(1895)" is tokens 9-12, the
    # answer "1895" only 10-11.
    assert f.input_ids[0, 9:13].tolist() == [tok.ids[p] for p in ["(", "189", "5", ")"]]
    assert (f.start_positions[0], f.end_positions[0], f.is_impossible[0]) == (10, 11, 0)
    # Without punctuation splitting no tighter span exists: the whole word stays.
    tok = FakeTokenizer()
    f = features(ex, tok, SPECIAL, max_seq_length=32, is_training=True)
    assert f.input_ids[0, 9:11].tolist() == [tok.ids["(18"], tok.ids["95)"]]
    assert (f.start_positions[0], f.end_positions[0]) == (9, 10)


def test_v2_unanswerable_points_at_cls(tmp_path):
    paragraphs = [{"context": TEN, "qas": [_qa("no", "Qq", [], is_impossible=True),
                                           _qa("yes", "Qq", [("W8", 24)],
                                               is_impossible=False)]}]
    ex = _examples(tmp_path, paragraphs, True, v2=True)
    f = features(ex, FakeTokenizer(), SPECIAL, max_seq_length=10,
                                     doc_stride=3, is_training=True)
    assert f.start_positions.tolist() == [0, 0, 0, 0, 8, 5]
    assert f.end_positions.tolist() == [0, 0, 0, 0, 8, 5]
    assert f.is_impossible.tolist() == [1, 1, 1, 1, 0, 0]


def test_bad_lengths_rejected(tmp_path):
    ex = _examples(tmp_path, [{"context": TEN, "qas": [_qa("q", "Qq", [])]}], False)
    with pytest.raises(ValueError, match="leaves no room"):
        features(ex, FakeTokenizer(), SPECIAL, max_seq_length=67,
                                     max_query_length=64)


# ---------------------------------------------------------------------------------------
# Postprocessing


def _outputs(start_index, start_lp, end_index, end_lp, null=None):
    out = {"start_top_index": np.array(start_index, np.int32),
           "start_top_log_probs": np.array(start_lp, np.float32),
           "end_top_index": np.array(end_index, np.int32),
           "end_top_log_probs": np.array(end_lp, np.float32)}
    if null is not None:
        out["null_logit"] = np.array(null, np.float32)
    return out


def _one_span(start, end):
    """Outputs of one window whose only candidate is the span start..end."""
    return _outputs([[start]], [[0.0]], [[[end]]], [[[0.0]]])


def _ten_windows(tmp_path, v2=False):
    ex = _examples(tmp_path, [{"context": TEN, "qas": [_qa("q", "Qq", [])]}], False, v2)
    f = features(ex, FakeTokenizer(), SPECIAL, max_seq_length=10,
                                     doc_stride=3)
    return ex, f


# Three windows at positions 3...: tokens 0-5 (max context 0-4), 3-8 (5-7), 6-9 (8-9).
TEN_OUTPUTS = _outputs(
    start_index=[[4, 0], [3, 6], [5, 7]],
    start_lp=[[-0.1, -0.2], [-0.01, -0.2], [-1.0, -0.5]],
    end_index=[[[3, 5], [5, 5]],     # end before start; W1 W2 (-0.4); start is the CLS
               [[4, 5], [8, 6]],     # start W3 not max context here; W6-W8 (-0.3), W6
               [[9, 6], [8, 8]]],    # end in padding; W8 W9 (-2.0); start is the SEP
    end_lp=[[[-0.05, -0.3], [0.0, 0.0]],
            [[0.0, 0.0], [-0.1, -0.5]],
            [[0.0, -1.0], [0.0, 0.0]]])


def test_postprocess_picks_best_valid_span(tmp_path):
    ex, f = _ten_windows(tmp_path)
    # Two invalid spans score higher (-0.15, -0.01): neither is the answer.
    preds, na = postprocess(ex, f, TEN_OUTPUTS)
    assert preds == {"q": "W6 W7 W8"} and na is None  # -0.3
    preds, _ = postprocess(ex, f, TEN_OUTPUTS, max_answer_length=2)
    assert preds == {"q": "W1 W2"}  # -0.4
    preds, _ = postprocess(ex, f, TEN_OUTPUTS, max_answer_length=1)
    assert preds == {"q": "W6"}  # -0.7
    # Equal scores: the first candidate (by window, start, end) wins.
    tie = {k: v.copy() for k, v in TEN_OUTPUTS.items()}
    tie["end_top_log_probs"][0, 0, 1] = -0.2  # W1 W2: -0.1 - 0.2, as W6 W7 W8: -0.2 - 0.1
    assert postprocess(ex, f, tie)[0] == {"q": "W1 W2"}


def test_postprocess_without_valid_span_and_na_probs(tmp_path):
    ex, f = _ten_windows(tmp_path, v2=True)
    nothing = _outputs([[0]] * 3, [[0.0]] * 3, [[[1]]] * 3, [[[0.0]]] * 3,
                       null=[2.0, -1.0, 0.5])
    preds, na = postprocess(ex, f, nothing, v2=True)
    assert preds == {"q": ""}
    # The most confident window says answerable: sigmoid(min null_logit).
    assert na == {"q": pytest.approx(1 / (1 + math.exp(1.0)))}
    preds, na = postprocess(ex, f, dict(TEN_OUTPUTS, null_logit=np.array([3., 4., 5.])),
                            v2=True)
    assert preds == {"q": "W6 W7 W8"}  # the threshold is the metric's business
    assert na["q"] == pytest.approx(1 / (1 + math.exp(-3.0)))


def test_na_probs_two_windows_two_questions(tmp_path):
    paragraphs = [{"context": "a b c d e f", "qas": [_qa("x", "Qq", []),
                                                     _qa("y", "Qq", [("b", 2)])]}]
    ex = _examples(tmp_path, paragraphs, False, v2=True)
    f = features(ex, FakeTokenizer(), SPECIAL, max_seq_length=8,
                                     doc_stride=2)
    assert f.example_index.tolist() == [0, 0, 1, 1]  # 6 tokens, windows 0-3 and 2-5
    # Start 4, end 5: "b c" in the first window, "d e" (less likely) in the second.
    out = _outputs([[4]] * 4, [[-0.5], [-0.9]] * 2, [[[5]]] * 4, [[[-0.5]]] * 4,
                   null=[-0.5, 1.5, 4.0, 2.0])
    preds, na = postprocess(ex, f, out, v2=True)
    assert preds == {"x": "b c", "y": "b c"}
    assert na == {"x": pytest.approx(1 / (1 + math.exp(0.5))),
                  "y": pytest.approx(1 / (1 + math.exp(-2.0)))}
    with pytest.raises(ValueError, match="do not match 4 features"):
        postprocess(ex, f, {k: v[:3] for k, v in out.items()}, v2=True)


def test_postprocess_refines_within_words_keeping_case(tmp_path):
    context = "Le Café (1895) ouvrit."
    paragraphs = [{"context": context, "qas": [_qa("q", "Quand", [])]}]
    ex = _examples(tmp_path, paragraphs, False)
    tok = FakeTokenizer(punct=True)
    f = features(ex, tok, SPECIAL, max_seq_length=24)
    # [CLS] qua nd [SEP] le caf é ( 189 5 ) ouv rit . [SEP]
    assert f.input_ids[0, 7:11].tolist() == [tok.ids[p] for p in ["(", "189", "5", ")"]]
    out = _outputs([[8, 4]], [[-0.1, -0.2]], [[[9, 8], [5, 4]]],
                   [[[-0.1, -0.2], [-1.0, -2.0]]])
    preds, _ = postprocess(ex, f, out)
    assert preds == {"q": "1895"}
    # "189" alone shows as the basic piece it belongs to, "1895"; "le caf" is the whole
    # words "Le Café", accent restored.
    spans = {(8, 8): "1895", (4, 5): "Le Café", (4, 4): "Le", (7, 9): "(1895"}
    for (start, end), text in spans.items():
        assert postprocess(ex, f, _one_span(start, end))[0] == {"q": text}


def test_real_wordpiece_end_to_end(tmp_path):
    ref = ReferenceBertTokenizer(VOCAB, lower=True)

    def tokenize(strings):
        return [ref.encode(s) for s in strings]

    context = "The Musée d'Orsay opened in (1986), after years of work."
    paragraphs = [{"context": context, "qas": [_qa("q", "When did it open?",
                                                   [("1986", 29)])]}]
    path = _write(tmp_path, _squad(paragraphs))
    train = read_squad(path, is_training=True, v2=False)
    f = features(train, tokenize, SPECIAL, max_seq_length=48,
                                     max_query_length=16, is_training=True)
    s, e = int(f.start_positions[0]), int(f.end_positions[0])
    off = len(ref.tokenize("When did it open?")) + 2
    assert ref.tokenize(context)[s - off:e - off + 1] == ["1986"]  # not "(", ")" or ","
    ev = read_squad(path, is_training=False, v2=False)
    f = features(ev, tokenize, SPECIAL, max_seq_length=48,
                                     max_query_length=16)
    # Doc tokens: the musee d ' or ##say opened in ( 1986 ) , ...
    musee = ref.tokenize(context).index("musee") + off
    out = _outputs([[s, musee]], [[-0.1, -0.3]], [[[e + 1, e], [musee + 4, musee]]],
                   [[[-0.9, -0.1], [-0.1, -1.0]]])
    preds, _ = postprocess(ev, f, out)
    assert preds == {"q": "1986"} and ev[0].answers == ("1986",)
    # "musee d ' orsay" maps back to the accented original.
    spans = {(musee, musee + 4): "Musée d'Orsay", (s, e + 1): "1986)", (musee, musee): "Musée"}
    for (start, end), text in spans.items():
        assert postprocess(ev, f, _one_span(start, end))[0] == {"q": text}


@pytest.mark.parametrize("pred,orig,lower,want", [
    ("1895", "(1895)", True, "1895"),
    ("cafe", "(Café),", True, "Café"),
    ("Café", "(Café),", False, "Café"),
    ("steve smith", "Steve Smith's", True, "Steve Smith"),
    ("smith ' s", "Steve Smith's", True, "Smith's"),
    ("jones", "Steve Smith's", True, "Steve Smith's"),  # not found: the original span
    ("a", "x\u0007a", True, "x\u0007a"),  # lengths differ after cleaning: original
])
def test_get_final_text(pred, orig, lower, want):
    assert get_final_text(pred, orig, lower) == want


@pytest.mark.every_leg
@pytest.mark.subprocess
def test_no_tensorflow_import():
    code = ("import sys, electra_tf.finetune.squad; "
            "assert 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
