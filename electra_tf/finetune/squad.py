"""SQuAD 1.1 / 2.0 without TensorFlow: reading the official JSON, the features' container
and the joint head's top-k outputs back to answer texts (the windows are qa_task's)."""

import bisect
import collections
import dataclasses
import json
import json.decoder
import json.scanner
import re
import unicodedata
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from absl import logging

from electra_tf.finetune import DataError, Features, read_text

# The official readers split the context on exactly these characters (U+202F appears in
# SQuAD contexts and must not end up inside a word); serving splits on them too.
WORD_SEPARATORS = " \t\r\n\u202f"
_WORD = re.compile(f"[^{WORD_SEPARATORS}]+")

Tokenize = Callable[[List[str]], Sequence[Sequence[int]]]


@dataclasses.dataclass(frozen=True)
class SquadExample:
    """One question. `start_word`/`end_word`/`answer_text` are set (from the first
    answer) only when read for training and the question is answerable; else -1/""."""
    qid: str
    question: str
    doc_words: Tuple[str, ...]  # shared by all questions of one paragraph
    answers: Tuple[str, ...]  # every gold answer text; () when unanswerable
    is_impossible: bool = False
    start_word: int = -1
    end_word: int = -1
    answer_text: str = ""


# ------------------------------------------------------------------------------- Reading

class _Problem(Exception):
    """A validation failure; `nodes`: candidates for the line to report, innermost first."""

    def __init__(self, message: str, *nodes):
        super().__init__(message)
        self.nodes = nodes


# Subclasses of the JSON value types that can carry an attribute (`.pos`, the offset).
_LOCATED = {t: type(f"Located{t.__name__.capitalize()}", (t,), {})
            for t in (dict, list, str, int, float)}


def _located_loads(text: str):
    """json.loads whose values remember their character offset (`.pos`); slow."""
    decoder = json.JSONDecoder()

    def scan(s, idx):
        value, end = inner(s, idx)
        cls = _LOCATED.get(type(value))
        if cls is not None:
            value = cls(value)
            value.pos = idx
        return value, end

    # The pure-Python scanner looks these up on the decoder once; routing nested values
    # through `scan` instead of its private closure is what lets every level be located.
    decoder.parse_object = lambda s_end, strict, _scan, hook, pairs_hook, memo: \
        json.decoder.JSONObject(s_end, strict, scan, hook, pairs_hook, memo)
    decoder.parse_array = lambda s_end, _scan: json.decoder.JSONArray(s_end, scan)
    inner = json.scanner.py_make_scanner(decoder)
    value, _ = scan(text, json.decoder.WHITESPACE.match(text, 0).end())
    return value


def _field(obj, key: str, kind, what: str, *anchors):
    if key not in obj:
        raise _Problem(f'{what} has no "{key}" field', *anchors, obj)
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        name = {str: "a string", list: "a list", int: "an integer", bool: "true/false",
                dict: "an object"}[kind]
        raise _Problem(f'"{key}" of {what} must be {name}, got {json.dumps(value)[:40]}',
                       value, *anchors, obj)
    return value


def _parse(tree, is_training: bool, v2: bool, warn: bool) -> List[SquadExample]:
    if not isinstance(tree, dict):
        raise _Problem("the top level must be an object with a \"data\" list", tree)
    examples = []
    for entry in _field(tree, "data", list, "the top level"):
        if not isinstance(entry, dict):
            raise _Problem("each \"data\" entry must be an object", entry, tree)
        for para in _field(entry, "paragraphs", list, "a \"data\" entry"):
            if not isinstance(para, dict):
                raise _Problem("each paragraph must be an object", para, entry)
            context = _field(para, "context", str, "a paragraph")
            qas = _field(para, "qas", list, "a paragraph")
            spans = [(m.start(), m.end()) for m in _WORD.finditer(context)]
            words = tuple(context[s:e] for s, e in spans)
            starts = [s for s, _ in spans]
            for qa in qas:
                if not isinstance(qa, dict):
                    raise _Problem("each \"qas\" entry must be an object", qa, para)
                ex = _parse_question(qa, para, context, words, starts, is_training, v2,
                                     warn)
                if ex is not None:
                    examples.append(ex)
    return examples


def _parse_question(qa, para, context, words, starts, is_training, v2, warn):
    qid = _field(qa, "id", str, "a question", para)
    # A question's errors point at its "id", the value a reader can search for.
    anchor = qa["id"]
    what = f"question {json.dumps(qid)}"
    question = _field(qa, "question", str, what, anchor)
    answers = _field(qa, "answers", list, what, anchor)
    impossible = False
    if v2:
        impossible = (_field(qa, "is_impossible", bool, what, anchor)
                      if "is_impossible" in qa else not answers)
    texts = []
    for answer in answers:
        if not isinstance(answer, dict):
            raise _Problem(f"each answer of {what} must be an object", answer, anchor)
        text = _field(answer, "text", str, f"an answer of {what}", anchor)
        start = _field(answer, "answer_start", int, f"an answer of {what}", anchor)
        if start < 0 or start + len(text) > len(context):
            raise _Problem(
                f"answer_start {int(start)} + len(text) {len(text)} of {what} lies outside "
                f"its context ({len(context)} characters)", start, answer, anchor)
        if context[start:start + len(text)] != text:
            raise _Problem(
                f"the answer text of {what} does not match the context at answer_start "
                f"{int(start)}: {json.dumps(text)[:60]} vs "
                f"{json.dumps(context[start:start + len(text)])[:60]}", text, answer, anchor)
        texts.append(str(text))
    if impossible or not is_training:
        return SquadExample(str(qid), str(question), words,
                            () if impossible else tuple(texts), impossible)
    if not answers:
        raise _Problem(f"{what} has no answers (required for training"
                       f"{'' if v2 else ' on SQuAD 1.1'})", anchor)
    text, offset = texts[0], int(answers[0]["answer_start"])
    # The first and last non-whitespace characters of the answer pick its words, so that
    # stray spaces around an answer text do not pull in a neighbouring word.
    stripped = [m.span() for m in _WORD.finditer(text)]
    recovered = ""
    if stripped:
        first = bisect.bisect_right(starts, offset + stripped[0][0]) - 1
        last = bisect.bisect_right(starts, offset + stripped[-1][1] - 1) - 1
        recovered = " ".join(words[first:last + 1])
    # Official rule: Python's (wider) whitespace cleans the answer, so e.g. a no-break
    # space inside an answer makes it unrecoverable from the words: skip, don't fail.
    cleaned = " ".join(text.split())
    if not stripped or not cleaned or recovered.find(cleaned) == -1:
        if warn:
            logging.warning("SQuAD: skipping training question %s: answer %r cannot be "
                            "recovered from the context words (%r)", qid, text, recovered)
        return None
    return SquadExample(str(qid), str(question), words, tuple(texts), False, first, last,
                        text)


def parse_squad_tree(tree, is_training: bool, v2: bool, source: str) -> List[SquadExample]:
    """Questions of a parsed SQuAD JSON tree, checked as `read_squad`; DataError names `source`."""
    try:
        return _parse(tree, is_training, v2, warn=True)
    except _Problem as p:
        raise DataError(f"{source}: {' '.join(str(p).split())}") from None


def read_squad(path: str, is_training: bool, v2: bool) -> List[SquadExample]:
    """Questions of an official SQuAD JSON file, in order; training drops (warning) those
    whose answer the context words cannot recover, as officially. DataError names file
    and line (bad JSON, fields, answers; training: an answerable question without one)."""
    text = read_text(path)
    try:
        tree = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: invalid JSON: {e.msg} "
                        f"(column {e.colno})") from None
    try:
        return _parse(tree, is_training, v2, warn=True)
    except _Problem:
        pass
    # Rare path: parse again keeping offsets, only to say on which line the problem is.
    try:
        _parse(_located_loads(text), is_training, v2, warn=False)
    except _Problem as p:
        pos = next((n.pos for n in p.nodes if hasattr(n, "pos")), 0)
        line = text.count("\n", 0, pos) + 1
        raise DataError(f"{path}:{line}: {' '.join(str(p).split())}") from None
    raise AssertionError("the located re-parse found no problem")  # pragma: no cover


# ---------------------------------- BERT basic tokenization (placing answers inside words)

_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _char_kind(ch: str) -> str:
    """'drop', 'space', 'cjk', 'punct' or 'plain' in BERT's basic tokenizer."""
    cp = ord(ch)
    if ch in " \t\n\r":
        return "space"
    cat = unicodedata.category(ch)
    if cp == 0 or cp == 0xFFFD or cat[0] == "C":
        return "drop"
    if cat == "Zs":
        return "space"
    if any(lo <= cp <= hi for lo, hi in _CJK):
        return "cjk"
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 \
            or cat[0] == "P":
        return "punct"
    return "plain"


def basic_tokenize(text: str, do_lower_case: bool) -> List[str]:
    """BERT's BasicTokenizer: drop control characters, split on whitespace, around CJK
    characters and punctuation; lower-case and strip accents when `do_lower_case`."""
    out = []
    for token in _split_cased(text):
        if do_lower_case:
            token = token.lower()
            if not token.isascii():  # strip accents: NFD, then no non-spacing marks
                token = "".join(c for c in unicodedata.normalize("NFD", token)
                                if unicodedata.category(c) != "Mn")
            out.extend(_split_cased(token))
        elif token:
            out.append(token)
    return out


def _split_cased(text: str) -> List[str]:
    pieces, current = [], []
    for ch in text:
        kind = _char_kind(ch)
        if kind == "plain":
            current.append(ch)
            continue
        if current:
            pieces.append("".join(current))
            current = []
        if kind in ("cjk", "punct"):
            pieces.append(ch)
    if current:
        pieces.append("".join(current))
    return pieces


def _strip_spaces(text: str) -> Tuple[str, List[int]]:
    kept = [i for i, c in enumerate(text) if c != " "]
    return "".join(text[i] for i in kept), kept


def get_final_text(pred_text: str, orig_text: str, do_lower_case: bool,
                   search_from: int = 0) -> str:
    """The part of `orig_text` that `pred_text` (space-separated normalised basic tokens)
    covers, else `orig_text`. Official BERT rule: find it in the basic-tokenized
    `orig_text` (from `search_from` first), map back through the space-free texts."""
    tok_text = " ".join(basic_tokenize(orig_text, do_lower_case))
    start = tok_text.find(pred_text, search_from) if pred_text else -1
    if start == -1 and search_from and pred_text:
        start = tok_text.find(pred_text)
    if start == -1:
        return orig_text
    end = start + len(pred_text) - 1
    orig_ns, orig_map = _strip_spaces(orig_text)
    tok_ns, tok_map = _strip_spaces(tok_text)
    if len(orig_ns) != len(tok_ns):
        return orig_text
    tok_to_ns = {s: n for n, s in enumerate(tok_map)}
    if start not in tok_to_ns or end not in tok_to_ns:
        return orig_text
    return orig_text[orig_map[tok_to_ns[start]]:orig_map[tok_to_ns[end]] + 1]


# ------------------------------------------------------------------------------ Features

@dataclasses.dataclass
class SquadFeatures(Features):
    """Windows of all examples in example order (qa_task.SquadTask.features). Per feature
    f and token t: `token_to_orig_map` its context word or -1 (CLS, query, SEP, padding);
    `token_is_max_context` whether this window gives it its most context; `token_piece`
    its word's basic-tokenizer piece, -1 when unknown (then the whole word is used)."""
    ARRAYS = Features.ARRAYS + ("start_positions", "end_positions", "is_impossible")
    input_ids: np.ndarray  # int32 [N, L]
    input_mask: np.ndarray  # int32 [N, L]
    segment_ids: np.ndarray  # int32 [N, L]
    start_positions: np.ndarray  # int32 [N]; 0 (the CLS) when no answer in the window
    end_positions: np.ndarray  # int32 [N]
    is_impossible: np.ndarray  # int32 [N]; 1 when no answer in the window (training)
    example_index: np.ndarray  # int32 [N], index into the examples list
    token_to_orig_map: np.ndarray  # int32 [N, L]
    token_is_max_context: np.ndarray  # bool [N, L]
    token_piece: np.ndarray  # int16 [N, L]
    num_examples: int


def word_pieces(words: Sequence[str], tokenize: Tokenize) -> Dict[str, np.ndarray]:
    """{word: int16 basic piece of each sub-token} for the distinct `words` of several
    basic pieces (all -1 when the pieces tokenized alone differ from the word)."""
    split = {w: _split_cased(w) for w in dict.fromkeys(words)
             if not (w.isascii() and w.isalnum())}
    split = {w: p for w, p in split.items() if len(p) > 1}
    strings = list(dict.fromkeys([*split, *(p for parts in split.values() for p in parts)]))
    if not strings:
        return {}
    ids = dict(zip(strings, (np.asarray(r, np.int32).reshape(-1) for r in tokenize(strings))))
    out = {}
    for w, parts in split.items():
        rows = [ids[p] for p in parts]
        if len(rows) < 32768 and np.array_equal(np.concatenate(rows), ids[w]):
            out[w] = np.repeat(np.arange(len(rows), dtype=np.int16), [len(r) for r in rows])
        else:
            out[w] = np.full([len(ids[w])], -1, np.int16)
    return out


def improve_answer_span(doc_ids: np.ndarray, start: int, end: int,
                        answer_ids: np.ndarray) -> Tuple[int, int]:
    """Official rule: the first (leftmost start, then longest) sub-span of [start, end]
    whose tokens are exactly the tokenized answer text; else the span unchanged."""
    n = len(answer_ids)
    if n == 0:
        return start, end
    for new_start in range(start, end - n + 2):
        if np.array_equal(doc_ids[new_start:new_start + n], answer_ids):
            return new_start, new_start + n - 1
    return start, end


# ------------------------------------------------------------------------ Postprocessing

def _sigmoid(x: float) -> float:
    if x >= 0:
        return float(1.0 / (1.0 + np.exp(-x)))
    z = np.exp(x)
    return float(z / (1.0 + z))


def _span_text(words: Sequence[str], first_word: int, first_piece: int, last_word: int,
               last_piece: int, do_lower_case: bool) -> str:
    """The answer from `first_piece` of `first_word` to `last_piece` of `last_word` (-1: edge)."""
    orig_text = " ".join(words[first_word:last_word + 1])
    lowered = [basic_tokenize(w, do_lower_case) for w in words[first_word:last_word + 1]]
    cased_counts = [len(_split_cased(w)) for w in words[first_word:last_word + 1]]
    if [len(x) for x in lowered] != cased_counts:
        first_piece = last_piece = -1  # normalisation changed the pieces: whole words
    flat = [p for x in lowered for p in x]
    lo = first_piece if first_piece >= 0 else 0
    hi = (len(flat) - len(lowered[-1]) + last_piece if last_piece >= 0
          else len(flat) - 1)
    if not flat or lo > hi:
        return orig_text
    # Stands in for the official de-tokenized WordPiece text (which needs the vocab):
    # the normalised basic pieces the predicted sub-tokens belong to.
    pred_text = " ".join(flat[lo:hi + 1])
    search_from = len(" ".join(flat[:lo])) + 1 if lo else 0
    return get_final_text(pred_text, orig_text, do_lower_case, search_from)


def postprocess(examples: Sequence[SquadExample], features: SquadFeatures,
                outputs: Mapping[str, np.ndarray], max_answer_length: int = 30,
                do_lower_case: bool = True, v2: bool = False,
                ) -> Tuple[Dict[str, str], Optional[Dict[str, float]]]:
    """Answer texts from the joint head's top-k `outputs` over features: start_top_log_probs /
    start_top_index [N, k], end_top_log_probs / end_top_index [N, k, k'], v2: null_logit [N].
    Returns (predictions {qid: text}, na_probs {qid: sigmoid(min null_logit)} or None). A span
    scores the sum of its log-probs; the best valid one (first on ties) is the answer, else ""."""
    if features.num_examples != len(examples):
        raise ValueError(f"features were made from {features.num_examples} examples, "
                         f"got {len(examples)}")
    n = len(features)
    s_lp = np.asarray(outputs["start_top_log_probs"], np.float64)
    s_idx = np.asarray(outputs["start_top_index"]).astype(np.int64)
    e_lp = np.asarray(outputs["end_top_log_probs"], np.float64)
    e_idx = np.asarray(outputs["end_top_index"]).astype(np.int64)
    null = np.asarray(outputs["null_logit"], np.float64).reshape(-1) if v2 else None
    if s_lp.shape[0] != n or s_idx.shape != s_lp.shape or e_lp.shape[:2] != s_lp.shape \
            or e_idx.shape != e_lp.shape or (v2 and null.shape[0] != n):
        raise ValueError(f"outputs do not match {n} features: " + ", ".join(
            f"{k} {tuple(np.shape(v))}" for k, v in outputs.items()))
    L = features.input_ids.shape[1]
    by_example = collections.defaultdict(list)
    for f, e in enumerate(features.example_index.tolist()):
        by_example[e].append(f)

    predictions, na_probs = {}, ({} if v2 else None)
    for e, ex in enumerate(examples):
        best = None  # (score, feature, start, end)
        for f in by_example.get(e, []):
            orig, maxc = features.token_to_orig_map[f], features.token_is_max_context[f]
            for i in range(s_idx.shape[1]):
                start = int(s_idx[f, i])
                if not 0 <= start < L or orig[start] < 0 or not maxc[start]:
                    continue
                for j in range(e_idx.shape[2]):
                    end = int(e_idx[f, i, j])
                    if not start <= end < L or orig[end] < 0 \
                            or end - start + 1 > max_answer_length:
                        continue
                    score = s_lp[f, i] + e_lp[f, i, j]
                    if best is None or score > best[0]:
                        best = (score, f, start, end)
        predictions[ex.qid] = ""
        if best is not None:
            _, f, start, end = best
            orig, pieces = features.token_to_orig_map[f], features.token_piece[f]
            predictions[ex.qid] = _span_text(ex.doc_words, int(orig[start]),
                                             int(pieces[start]), int(orig[end]),
                                             int(pieces[end]), do_lower_case)
        if v2:
            feats = by_example.get(e, [])
            # No window at all (empty context): certainly unanswerable from the model.
            na_probs[ex.qid] = _sigmoid(float(null[feats].min())) if feats else 1.0
    return predictions, na_probs
