"""Fine-tuning metrics as the official scripts compute them: GLUE's through scikit-learn
and scipy, SQuAD v1.1/v2.0 evaluate's and conlleval's in Python. No TensorFlow."""

import collections
import re
import string

import numpy as np
from scipy import stats as scipy_stats
from sklearn import metrics as sklearn_metrics

# --------------------------------------------------- Classification / regression (GLUE)

def _paired(a, b, names=("labels", "predictions")):
    """Two equally long, non-empty 1-D arrays."""
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"{names[0]} and {names[1]} must be 1-D sequences, got shapes "
                         f"{a.shape} and {b.shape}")
    if len(a) != len(b):
        raise ValueError(f"{names[0]} has {len(a)} items but {names[1]} has {len(b)}")
    if len(a) == 0:
        raise ValueError(f"{names[0]} and {names[1]} are empty: a metric needs at least "
                         "one example")
    return a, b


def accuracy(labels, predictions) -> float:
    """Fraction (0-1) of predictions equal to their label (GLUE's simple_accuracy)."""
    labels, predictions = _paired(labels, predictions)
    return float(np.mean(labels == predictions))


def f1(labels, predictions, positive=1) -> float:
    """Binary F1 (0-1) of the `positive` class, sklearn's f1_score as GLUE MRPC/QQP; any
    other label counts as negative; 0.0 without true or predicted positives."""
    labels, predictions = _paired(labels, predictions)
    # Booleans make the class binary whatever the label set, which sklearn's
    # average="binary" otherwise refuses (multiclass labels, or `positive` absent).
    return float(sklearn_metrics.f1_score(labels == positive, predictions == positive,
                                          zero_division=0))


def matthews_corrcoef(labels, predictions) -> float:
    """Matthews correlation (-1..1), multiclass: sklearn's matthews_corrcoef as GLUE CoLA;
    0.0 when the denominator is 0 (a constant labelling or prediction), as sklearn."""
    labels, predictions = _paired(labels, predictions)
    if len(np.unique(np.concatenate([labels, predictions]))) < 2:
        return 0.0  # sklearn's answer, without its single-label warning
    return float(sklearn_metrics.matthews_corrcoef(labels, predictions))


def _correlation(statistic, x, y) -> float:
    """scipy's `statistic` of float64 x and y; nan where scipy's is, without its warning."""
    x, y = _paired(x, y, ("x", "y"))
    if len(x) < 2:
        raise ValueError(f"a correlation needs at least 2 points, got {len(x)}")
    x, y = x.astype(np.float64), y.astype(np.float64)
    # scipy tests constancy by equality, as here.
    if np.isnan(x).any() or np.isnan(y).any() or (x == x[0]).all() or (y == y[0]).all():
        return float("nan")
    return float(statistic(x, y).statistic)


def pearson(x, y) -> float:
    """Pearson correlation (scipy.stats.pearsonr, as GLUE STS-B); nan for a constant or nan side."""
    return _correlation(scipy_stats.pearsonr, x, y)


def spearman(x, y) -> float:
    """Spearman correlation, average ranks for ties (scipy's spearmanr, as GLUE STS-B)."""
    return _correlation(scipy_stats.spearmanr, x, y)


def classification_metrics(kind, labels, predictions) -> dict:
    """The metric dict of a task kind, python floats, fractions (not percent): accuracy:
    {accuracy}; accuracy_f1: {accuracy, f1, acc_and_f1 (their mean)}; mcc: {mcc};
    pearson_spearman: {pearson, spearman, corr (their mean; nan if either is)}."""
    if kind == "accuracy":
        return {"accuracy": accuracy(labels, predictions)}
    if kind == "accuracy_f1":
        acc, f = accuracy(labels, predictions), f1(labels, predictions)
        return {"accuracy": acc, "f1": f, "acc_and_f1": (acc + f) / 2.0}
    if kind == "mcc":
        return {"mcc": matthews_corrcoef(labels, predictions)}
    if kind == "pearson_spearman":
        p, s = pearson(labels, predictions), spearman(labels, predictions)
        return {"pearson": p, "spearman": s, "corr": (p + s) / 2.0}
    raise ValueError(f"unknown metric kind {kind!r}; expected one of accuracy, "
                     "accuracy_f1, mcc, pearson_spearman")


# --------------------------------------- SQuAD (official evaluate-v1.1 / evaluate-v2.0)

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """Lower case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _golds(gold_answers):
    if isinstance(gold_answers, str):
        raise ValueError("gold_answers must be a list of answer texts, not a string")
    # As evaluate-v2.0: golds that normalize to nothing are dropped, and a question left
    # with none is unanswerable, whose only correct answer is the empty string.
    golds = [g for g in gold_answers if normalize_answer(g)]
    return golds or [""]


def _token_f1(gold: str, prediction: str) -> float:
    gold_tokens = normalize_answer(gold).split()
    pred_tokens = normalize_answer(prediction).split()
    if not gold_tokens or not pred_tokens:
        # The v2.0 rule; it makes an abstention on an unanswerable question score 1.
        return float(gold_tokens == pred_tokens)
    same = sum((collections.Counter(gold_tokens) & collections.Counter(pred_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_em(prediction: str, gold_answers) -> float:
    """1.0 if the normalized prediction equals some normalized gold answer, else 0.0; an
    empty `gold_answers` list means unanswerable: only "" is then correct."""
    return max(float(normalize_answer(g) == normalize_answer(prediction))
               for g in _golds(gold_answers))


def squad_f1(prediction: str, gold_answers) -> float:
    """Best token-level F1 (0-1) of the prediction against any gold answer (v2.0 rules)."""
    return max(_token_f1(g, prediction) for g in _golds(gold_answers))


def _best_threshold(scores, predictions, na_probs, has_answer):
    """evaluate-v2.0's find_best_thresh: (best score in percent, its na_prob threshold)."""
    score = best = sum(1 for qid in has_answer if not has_answer[qid])
    threshold = 0.0
    # Sorting the na_probs keys keeps their order among equal probabilities, on which the
    # official sweep (and so the best score) depends.
    for qid in sorted(na_probs, key=lambda q: na_probs[q]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            score += scores[qid]
        elif predictions[qid]:
            score -= 1
        if score > best:
            best, threshold = score, na_probs[qid]
    return 100.0 * best / len(scores), float(threshold)


def squad_scores(dataset, predictions, na_probs=None, na_prob_thresh=1.0) -> dict:
    """The official SQuAD scores in percent (0-100), as evaluate-v1.1/v2.0. dataset:
    {qid: [gold answer texts]}, [] when unanswerable. predictions: {qid: text},
    "" for no answer (other qids are ignored). Returns exact_match, f1, total and missing
    (qids without a prediction, scored as ""; evaluate-v2.0 drops them from the total);
    with an unanswerable question also NoAns_/HasAns_exact/f1/total (HasAns_ when some
    question is answerable). na_probs: {qid: P(no answer)} of every predicted qid; a
    prediction above na_prob_thresh becomes "". It adds best_exact/best_f1 and their
    _thresh (evaluate-v2.0's sweep over the raw predictions; a missing one gets 1.0)."""
    if not dataset:
        raise ValueError("the SQuAD dataset is empty")
    if na_probs is not None:
        unscored = [q for q in dataset if q in predictions and q not in na_probs]
        if unscored:
            raise ValueError(f"na_probs lacks {len(unscored)} predicted question(s), e.g. "
                             f"{unscored[0]!r}")
    has_answer, preds, exact_raw, f1_raw = {}, {}, {}, {}
    missing = 0
    for qid, gold_answers in dataset.items():
        if isinstance(gold_answers, str):
            raise ValueError(f"gold answers of {qid!r} must be a list of texts, not a string")
        has_answer[qid] = bool(gold_answers)
        if qid in predictions:
            prediction = predictions[qid]
            if not isinstance(prediction, str):
                raise ValueError(f"prediction for {qid!r} is {type(prediction).__name__}, "
                                 "not str")
        else:
            prediction, missing = "", missing + 1
        preds[qid] = prediction
        exact_raw[qid] = squad_em(prediction, gold_answers)
        f1_raw[qid] = squad_f1(prediction, gold_answers)

    probs = None if na_probs is None else {
        **na_probs, **{qid: 1.0 for qid in dataset if qid not in na_probs}}

    def thresholded(raw):
        if probs is None:
            return raw
        # A forced abstention scores 1 exactly when the question has no answer (even if
        # the raw prediction would have scored otherwise), as apply_no_ans_threshold.
        return {qid: float(not has_answer[qid]) if probs[qid] > na_prob_thresh else s
                for qid, s in raw.items()}

    exact, f1_scores = thresholded(exact_raw), thresholded(f1_raw)

    def percent(scores, qids):
        return 100.0 * sum(scores[q] for q in qids) / len(qids)

    qids = list(dataset)
    out = {"exact_match": percent(exact, qids), "f1": percent(f1_scores, qids),
           "total": len(qids), "missing": missing}
    no_ans = [q for q in qids if not has_answer[q]]
    if no_ans:
        has_ans = [q for q in qids if has_answer[q]]
        for prefix, group in (("HasAns", has_ans), ("NoAns", no_ans)):
            if group:
                out[f"{prefix}_exact"] = percent(exact, group)
                out[f"{prefix}_f1"] = percent(f1_scores, group)
                out[f"{prefix}_total"] = len(group)
    if probs is not None:
        out["best_exact"], out["best_exact_thresh"] = _best_threshold(
            exact_raw, preds, probs, has_answer)
        out["best_f1"], out["best_f1_thresh"] = _best_threshold(
            f1_raw, preds, probs, has_answer)
    return out


# ----------------------------------------------------------- Chunking / NER (conlleval)

_PREFIXES = frozenset("BIESLU")
_ALIASES = {"U": "S", "L": "E"}  # BILOU's U/L are IOBES's S/E under other names


def _split_tag(tag):
    """(prefix, type) of a tag, prefix one of B I E S O."""
    if not isinstance(tag, str):
        raise ValueError(f"tags must be strings, got {tag!r}")
    if tag == "O":
        return "O", ""
    if "-" not in tag:
        # A tag without a prefix is its own type, consecutive equal tags one chunk (IO).
        return "I", tag
    # Split at the first hyphen only: conlleval lets types contain hyphens.
    prefix, kind = tag.split("-", 1)
    if prefix not in _PREFIXES:
        raise ValueError(f"tag {tag!r}: prefix {prefix!r} is not one of "
                         f"{', '.join(sorted(_PREFIXES))}")
    return _ALIASES.get(prefix, prefix), kind


def _chunk_ends(prev_tag, tag, prev_type, kind):
    # conlleval's endOfChunk, with the IOBES rules (an E or S always closes its chunk;
    # B and S always open a new one) that conlleval.pl itself lacks for S.
    if prev_tag in "ES":
        return True
    if prev_tag in "BI" and tag in "BSO":
        return True
    return prev_tag != "O" and prev_type != kind


def _chunk_starts(prev_tag, tag, prev_type, kind):
    # conlleval's startOfChunk: an I or E opens a chunk unless it continues one of its type.
    if tag in "BS":
        return True
    if tag in "IE" and prev_tag in "ESO":
        return True
    return tag != "O" and prev_type != kind


def extract_spans(tags) -> set:
    """The chunks of one sentence as a set of (type, start, end), end exclusive. Chunk
    boundaries follow conlleval, so IOB1, IOB2/BIO, IOBES/BIOES (and BILOU) tags all decode
    with the same rules: an I- after O or after another type opens a chunk, a type change
    closes one; a tag without a prefix is its own type (`_split_tag`)."""
    spans = set()
    prev_tag, prev_type, start = "O", "", None
    # A trailing "O" closes a chunk still open at the end of the sentence.
    for i, raw in enumerate(list(tags) + ["O"]):
        tag, kind = _split_tag(raw)
        if start is not None and _chunk_ends(prev_tag, tag, prev_type, kind):
            spans.add((prev_type, start, i))
            start = None
        if _chunk_starts(prev_tag, tag, prev_type, kind):
            start = i
        prev_tag, prev_type = tag, kind
    return spans


def entity_f1(gold_sequences, pred_sequences) -> dict:
    """conlleval's overall chunk precision, recall and F1 in percent (0-100) of lists of
    sentences' tags; a chunk is correct when type, start and end match; x / 0 is 0."""
    gold_sequences, pred_sequences = list(gold_sequences), list(pred_sequences)
    if len(gold_sequences) != len(pred_sequences):
        raise ValueError(f"gold has {len(gold_sequences)} sentences but predictions have "
                         f"{len(pred_sequences)}")
    if not gold_sequences:
        raise ValueError("gold and predictions are empty: no sentences to evaluate")
    correct = found_gold = found_pred = 0
    for n, (gold, pred) in enumerate(zip(gold_sequences, pred_sequences)):
        if isinstance(gold, str) or isinstance(pred, str):
            raise ValueError(f"sentence {n} must be a list of tags, not a string")
        if len(gold) != len(pred):
            raise ValueError(f"sentence {n}: gold has {len(gold)} tags but prediction has "
                             f"{len(pred)}")
        gold_spans, pred_spans = extract_spans(gold), extract_spans(pred)
        correct += len(gold_spans & pred_spans)
        found_gold += len(gold_spans)
        found_pred += len(pred_spans)
    precision = 100.0 * correct / found_pred if found_pred else 0.0
    recall = 100.0 * correct / found_gold if found_gold else 0.0
    f = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f}
