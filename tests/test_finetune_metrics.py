"""Fine-tuning metrics: hand-computed values, and the GLUE wrappers against direct
sklearn/scipy calls on random inputs (labels of any type, the class to score, ties)."""

import math
import warnings

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as skm

from electra_tf.finetune.metrics import (accuracy, classification_metrics, entity_f1,
                                         extract_spans, f1, matthews_corrcoef,
                                         normalize_answer, pearson, spearman, squad_em,
                                         squad_f1, squad_scores)

SEEDS = (0, 1, 2, 3, 4)
TOL = 1e-9


# ---------------------------------------------------------------------------------------
# Classification / regression, by hand
# ---------------------------------------------------------------------------------------

def test_accuracy_by_hand():
    # Positions 0 and 2 agree: 2 / 4.
    assert accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    assert accuracy(["a", "b"], ["a", "b"]) == 1.0


def test_f1_by_hand():
    labels, preds = [1, 1, 0, 0, 1], [1, 0, 1, 0, 1]
    # Class 1: tp = 2 (items 0, 4), fp = 1 (item 2), fn = 1 (item 1): 2*2 / (4+1+1) = 2/3.
    assert f1(labels, preds) == pytest.approx(2 / 3, abs=TOL)
    # Class 0: tp = 1 (item 3), fp = 1 (item 1), fn = 1 (item 2): 2 / (2+1+1) = 1/2.
    assert f1(labels, preds, positive=0) == pytest.approx(0.5, abs=TOL)
    # No true and no predicted positives: 0, as sklearn's zero_division=0.
    assert f1([0, 0, 0], [0, 0, 0]) == 0.0
    # Only false positives: tp = 0, so 0.
    assert f1([0, 0], [1, 0]) == 0.0


def test_matthews_by_hand():
    # Binary: TP = 2, FN = 1, TN = 2, FP = 1:
    # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (4 - 1) / sqrt(3^4) = 1/3.
    assert matthews_corrcoef([1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 1]) == pytest.approx(
        1 / 3, abs=TOL)
    # Three classes: n = 6, correct = 4 (items 0, 2, 3, 4), true counts t = (2, 2, 2),
    # predicted counts p = (2, 3, 1).
    # cov(t,p) = 4*6 - (4 + 6 + 2) = 12; cov(p,p) = 36 - (4 + 9 + 1) = 22;
    # cov(t,t) = 36 - 12 = 24; MCC = 12 / sqrt(22 * 24) = 12 / sqrt(528) ~ 0.5222.
    assert matthews_corrcoef([0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 2, 0]) == pytest.approx(
        12 / math.sqrt(528), abs=TOL)
    assert matthews_corrcoef([0, 1, 2], [0, 1, 2]) == pytest.approx(1.0, abs=TOL)
    # A constant prediction makes the denominator 0: 0.0, as sklearn.
    assert matthews_corrcoef([0, 1, 1, 0], [1, 1, 1, 1]) == 0.0
    assert matthews_corrcoef([1, 1], [1, 1]) == 0.0


def test_pearson_spearman_by_hand():
    # x - mean = (-1, 0, 1); y = (1, 2, 5), y - 8/3 = (-5/3, -2/3, 7/3).
    # dot = 5/3 + 7/3 = 4; |x| = sqrt 2; |y| = sqrt(78)/3; r = 12 / sqrt(156) = 6 / sqrt 39.
    assert pearson([1, 2, 3], [1, 2, 5]) == pytest.approx(6 / math.sqrt(39), abs=TOL)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0, abs=TOL)
    # Average ranks: x -> (1, 2.5, 2.5, 4), y -> (1, 2, 3, 4); centred (-1.5, 0, 0, 1.5)
    # and (-1.5, -.5, .5, 1.5): dot 4.5, norms^2 4.5 and 5, rho = 4.5/sqrt(22.5) = sqrt(.9).
    assert spearman([1, 2, 2, 3], [10, 20, 30, 40]) == pytest.approx(math.sqrt(0.9),
                                                                     abs=TOL)
    # Monotone but not linear: rank correlation 1.
    assert spearman([1, 2, 3, 4], [1, 8, 27, 1000]) == pytest.approx(1.0, abs=TOL)


def test_correlations_of_constant_input_are_nan_as_scipy():
    # Without scipy's ConstantInputWarning (an evaluation log needs no warning per step).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))
        assert math.isnan(pearson([1, 2, 3], [0.1, 0.1, 0.1]))
        assert math.isnan(spearman([2, 2, 2], [1, 2, 3]))
        assert math.isnan(pearson([1, float("nan"), 3], [1, 2, 3]))
        assert math.isnan(spearman([1, 2, 3], [1, float("nan"), 3]))
        # A constant labelling and prediction alike: MCC 0, without sklearn's warning.
        assert matthews_corrcoef([1, 1], [1, 1]) == 0.0


def test_classification_metrics():
    out = classification_metrics("accuracy_f1", [1, 1, 0, 0, 1], [1, 0, 1, 0, 1])
    # accuracy 3/5 (items 0, 3, 4); f1 2/3 (test_f1_by_hand); mean (0.6 + 2/3) / 2.
    assert out == pytest.approx({"accuracy": 0.6, "f1": 2 / 3, "acc_and_f1": (0.6 + 2 / 3) / 2},
                                abs=TOL)
    assert all(type(v) is float for v in out.values())
    assert classification_metrics("accuracy", [1, 0], [1, 1]) == {"accuracy": 0.5}
    out = classification_metrics("mcc", [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 1])
    assert out == pytest.approx({"mcc": 1 / 3}, abs=TOL) and type(out["mcc"]) is float
    out = classification_metrics("pearson_spearman", [1, 2, 2, 3], [10, 20, 30, 40])
    assert set(out) == {"pearson", "spearman", "corr"}
    assert all(type(v) is float for v in out.values())
    assert out["spearman"] == pytest.approx(math.sqrt(0.9), abs=TOL)
    assert out["corr"] == pytest.approx((out["pearson"] + out["spearman"]) / 2, abs=TOL)
    with pytest.raises(ValueError, match="unknown metric kind 'bleu'"):
        classification_metrics("bleu", [1], [1])


@pytest.mark.parametrize("fn", [accuracy, f1, matthews_corrcoef, pearson, spearman])
def test_bad_inputs(fn):
    with pytest.raises(ValueError, match="empty"):
        fn([], [])
    with pytest.raises(ValueError, match=r"has 3 items but .* has 2"):
        fn([1, 2, 3], [1, 2])


def test_correlation_needs_two_points():
    with pytest.raises(ValueError, match="at least 2"):
        pearson([1.0], [2.0])


# ---------------------------------------------------------------------------------------
# Against direct sklearn / scipy calls
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_against_sklearn(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 300))
    labels, preds = rng.integers(0, 2, n), rng.integers(0, 2, n)
    assert accuracy(labels, preds) == pytest.approx(skm.accuracy_score(labels, preds), abs=TOL)
    assert f1(labels, preds) == pytest.approx(
        skm.f1_score(labels, preds, zero_division=0), abs=TOL)
    assert f1(labels, preds, positive=0) == pytest.approx(
        skm.f1_score(labels, preds, pos_label=0, zero_division=0), abs=TOL)
    assert matthews_corrcoef(labels, preds) == pytest.approx(
        skm.matthews_corrcoef(labels, preds), abs=TOL)
    # Multiclass, with string labels and a class only ever predicted.
    k = int(rng.integers(3, 7))
    labels, preds = rng.integers(0, k, n), rng.integers(0, k + 1, n)
    assert matthews_corrcoef(labels, preds) == pytest.approx(
        skm.matthews_corrcoef(labels, preds), abs=TOL)
    names = np.array(["c%d" % i for i in range(k + 1)])
    assert matthews_corrcoef(names[labels], names[preds]) == pytest.approx(
        skm.matthews_corrcoef(names[labels], names[preds]), abs=TOL)
    # Mostly-correct predictions, where MCC is far from 0.
    preds = np.where(rng.random(n) < 0.8, labels, preds)
    assert matthews_corrcoef(labels, preds) == pytest.approx(
        skm.matthews_corrcoef(labels, preds), abs=TOL)
    assert accuracy(labels, preds) == pytest.approx(skm.accuracy_score(labels, preds), abs=TOL)


@pytest.mark.filterwarnings("ignore:A single label was found")
def test_degenerate_cases_against_sklearn():
    for labels, preds in (([0, 0, 0], [0, 0, 0]), ([1, 1, 0], [1, 1, 1]), ([0, 0], [1, 1])):
        assert f1(labels, preds) == skm.f1_score(labels, preds, zero_division=0)
        assert matthews_corrcoef(labels, preds) == skm.matthews_corrcoef(labels, preds)


@pytest.mark.parametrize("seed", SEEDS)
def test_against_scipy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 200))
    x = rng.normal(size=n)
    y = 0.5 * x + rng.normal(size=n)
    assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=TOL)
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], abs=TOL)
    # Many ties on both sides (STS-B style scores on a 0-5 half-point grid).
    a = rng.integers(0, 11, n) / 2.0
    b = np.clip(a + rng.integers(-2, 3, n) / 2.0, 0, 5)
    if len(set(a)) > 1 and len(set(b)) > 1:
        assert pearson(a, b) == pytest.approx(stats.pearsonr(a, b)[0], abs=TOL)
        assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b)[0], abs=TOL)
    ints = rng.integers(0, 4, n), rng.integers(0, 4, n)
    if len(set(ints[0])) > 1 and len(set(ints[1])) > 1:
        assert spearman(*ints) == pytest.approx(stats.spearmanr(*ints)[0], abs=TOL)


# ---------------------------------------------------------------------------------------
# SQuAD
# ---------------------------------------------------------------------------------------

def test_normalize_answer():
    # lower -> drop punctuation ("cat's" -> "cats") -> drop whole-word articles -> spaces.
    assert normalize_answer("The  Cat's, hat!") == "cats hat"
    assert normalize_answer("An apple a day") == "apple day"
    # Articles only as whole words; punctuation goes first, so "A-team" becomes "ateam".
    assert normalize_answer("Theater anarchy") == "theater anarchy"
    assert normalize_answer("A-team") == "ateam"
    assert normalize_answer(" \tthe\n ") == ""


def test_squad_em_f1_by_hand():
    assert squad_em("the Eiffel Tower!", ["Eiffel tower", "Paris"]) == 1.0
    assert squad_em("Eiffel", ["Eiffel tower"]) == 0.0
    # Prediction tokens (big, red, dog). Against (red, dog): 2 common, P = 2/3, R = 1,
    # F = 2*(2/3)/(5/3) = 0.8. Against (big, cat): 1 common, P = 1/3, R = 1/2, F = 0.4.
    assert squad_f1("the big red dog", ["red dog", "a big cat"]) == pytest.approx(0.8)
    # Common tokens are counted with multiplicity: 1 common, P = 1/3, R = 1, F = 0.5.
    assert squad_f1("dog dog dog", ["dog"]) == pytest.approx(0.5)
    assert squad_f1("cat", ["dog"]) == 0.0
    # Unanswerable ([]): only "" is right, and an answer that normalizes to "" counts as "".
    assert squad_em("", []) == 1.0 and squad_f1("", []) == 1.0
    assert squad_f1("the", []) == 1.0
    assert squad_em("x", []) == 0.0 and squad_f1("x", []) == 0.0
    # v2.0 rule: empty against non-empty tokens is 0.
    assert squad_f1("", ["dog"]) == 0.0
    with pytest.raises(ValueError, match="not a string"):
        squad_f1("dog", "dog")


DATASET = {
    "q1": ["Denver Broncos", "the Broncos"],
    "q2": ["Carolina Panthers"],
    "q3": [],
    "q4": [],
}
PREDICTIONS = {"q1": "Broncos", "q2": "Panthers team", "q3": "", "q4": "Mile High"}
# Raw scores (exact, f1): q1 (1, 1) by the second gold; q2 (0, 0.5): 1 of 2 tokens each way;
# q3 (1, 1): "" on an unanswerable question; q4 (0, 0).


def test_squad_scores_without_na_probs():
    out = squad_scores(DATASET, PREDICTIONS)
    assert out == pytest.approx({
        "exact_match": 50.0,            # (1 + 0 + 1 + 0) / 4
        "f1": 62.5,                     # (1 + .5 + 1 + 0) / 4
        "total": 4, "missing": 0,
        "HasAns_exact": 50.0, "HasAns_f1": 75.0, "HasAns_total": 2,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2,
    })


def test_squad_scores_v1_style_and_missing():
    # All answerable: no HasAns/NoAns split.
    out = squad_scores({"a": ["red dog"], "b": ["cat"]}, {"a": "The red dog.", "b": "dog"})
    assert out == {"exact_match": 50.0, "f1": 50.0, "total": 2, "missing": 0}
    # Missing predictions count as "": right on the unanswerable b, wrong on a.
    out = squad_scores({"a": ["x"], "b": []}, {})
    assert out["missing"] == 2 and out["exact_match"] == 50.0 and out["f1"] == 50.0
    assert out["HasAns_f1"] == 0.0 and out["NoAns_f1"] == 100.0
    # Only unanswerable questions: no HasAns group (as the official script).
    out = squad_scores({"a": [], "b": []}, {"a": "", "b": "y"})
    assert out["NoAns_total"] == 2 and "HasAns_total" not in out


def test_squad_scores_with_na_probs_and_best_threshold():
    na_probs = {"q1": 0.1, "q2": 0.6, "q3": 0.5, "q4": 0.7}
    out = squad_scores(DATASET, PREDICTIONS, na_probs=na_probs, na_prob_thresh=0.55)
    # Threshold 0.55 turns q2 (0.6) and q4 (0.7) into abstentions: q2 -> 0 (answerable),
    # q4 -> 1 (unanswerable). exact = f1 = (1 + 0 + 1 + 1) / 4 = 75.
    assert out["exact_match"] == 75.0 and out["f1"] == 75.0
    assert out["HasAns_f1"] == 50.0 and out["NoAns_f1"] == 100.0
    # Sweep over raw predictions in na_prob order q1 .1, q3 .5, q2 .6, q4 .7, starting at
    # 2 (the unanswerable questions, all abstained):
    #   exact: q1 +1 -> 3 (best, thresh .1); q3 +0 -> 3; q2 +0 -> 3 (not > 3, thresh
    #          stays .1); q4 -1 (answered an unanswerable one) -> 2.  best 3/4 = 75 at .1
    #   f1:    q1 +1 -> 3 (best, .1); q3 +0; q2 +.5 -> 3.5 (best, .6); q4 -1 -> 2.5.
    #          best 3.5/4 = 87.5 at .6
    assert out["best_exact"] == 75.0 and out["best_exact_thresh"] == 0.1
    assert out["best_f1"] == 87.5 and out["best_f1_thresh"] == 0.6


def test_best_threshold_ties_follow_na_probs_order():
    # a: answerable and right (+1); b: unanswerable but answered (-1); equal na_prob 0.3.
    # The official sweep visits tied qids in the na_probs order, and the best score depends
    # on it. Start score 1 (one unanswerable question).
    dataset, preds = {"a": ["x"], "b": []}, {"a": "x", "b": "y"}
    # b then a: 1 - 1 = 0, then 0 + 1 = 1, never > 1: best 1/2 = 50 at the initial 0.0.
    out = squad_scores(dataset, preds, na_probs={"b": 0.3, "a": 0.3})
    assert (out["best_exact"], out["best_exact_thresh"]) == (50.0, 0.0)
    # a then b: 1 + 1 = 2 > 1 (best, thresh .3), then 2 - 1 = 1: best 2/2 = 100 at 0.3.
    out = squad_scores(dataset, preds, na_probs={"a": 0.3, "b": 0.3})
    assert (out["best_exact"], out["best_exact_thresh"]) == (100.0, 0.3)
    assert (out["best_f1"], out["best_f1_thresh"]) == (100.0, 0.3)
    # Default threshold 1.0 never forces an abstention.
    assert out["exact_match"] == 50.0


def test_squad_scores_errors():
    with pytest.raises(ValueError, match="empty"):
        squad_scores({}, {})
    with pytest.raises(ValueError, match="na_probs lacks 1 .*'b'"):
        squad_scores({"a": ["x"], "b": []}, {"a": "x", "b": ""}, na_probs={"a": 0.1})
    with pytest.raises(ValueError, match="not a string"):
        squad_scores({"a": "x"}, {"a": "x"})


# ---------------------------------------------------------------------------------------
# Chunk (NER) F1, conlleval
# ---------------------------------------------------------------------------------------

def test_extract_spans_bio_and_iob1():
    assert extract_spans(["B-PER", "I-PER", "O", "B-LOC"]) == {("PER", 0, 2), ("LOC", 3, 4)}
    # IOB1: I- after O opens a chunk, B- splits two adjacent chunks of one type, a type
    # change closes one and opens another, and the sentence end closes the last.
    tags = ["I-PER", "I-PER", "B-PER", "I-LOC", "O", "I-LOC"]
    assert extract_spans(tags) == {("PER", 0, 2), ("PER", 2, 3), ("LOC", 3, 4), ("LOC", 5, 6)}
    # Types may contain hyphens (conlleval splits at the first one).
    assert extract_spans(["B-MISC-X", "I-MISC-X"]) == {("MISC-X", 0, 2)}
    assert extract_spans(["O", "O"]) == set() and extract_spans([]) == set()


def test_extract_spans_iobes_and_no_prefix():
    tags = ["S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC", "B-ORG", "E-ORG", "O"]
    assert extract_spans(tags) == {
        ("PER", 0, 1), ("LOC", 1, 4), ("LOC", 4, 5), ("ORG", 5, 7)}
    # E closes its chunk and B opens one (conlleval.pl itself would merge E-X B-X).
    assert extract_spans(["B-LOC", "E-LOC", "B-LOC", "E-LOC"]) == {("LOC", 0, 2),
                                                                  ("LOC", 2, 4)}
    # An I or E right after E or S opens a new chunk.
    assert extract_spans(["S-LOC", "E-LOC", "E-LOC", "I-LOC"]) == {
        ("LOC", 0, 1), ("LOC", 1, 2), ("LOC", 2, 3), ("LOC", 3, 4)}
    # BILOU's U/L are S/E.
    assert extract_spans(["U-PER", "B-LOC", "L-LOC"]) == {
        ("PER", 0, 1), ("LOC", 1, 3)}
    # No prefix: the tag is its type, a run of it one chunk.
    assert extract_spans(["PER", "PER", "O", "LOC", "PER"]) == {
        ("PER", 0, 2), ("LOC", 3, 4), ("PER", 4, 5)}


def test_extract_spans_rejects_unknown_prefixes():
    with pytest.raises(ValueError, match="prefix 'X' is not one of B, E, I, L, S, U"):
        extract_spans(["B-PER", "X-PER"])
    with pytest.raises(ValueError, match="tags must be strings"):
        extract_spans(["B-PER", 3])


def test_entity_f1_bio():
    gold = [["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O", "B-ORG"],
            ["B-MISC", "I-MISC", "I-MISC"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG", "I-ORG", "O", "I-ORG"],
            ["B-MISC", "I-MISC", "B-MISC"]]
    # Sentence 1: gold PER 0-2, LOC 3-5, ORG 6-7; predicted PER 0-2 (right), ORG 3-5
    # (wrong type), ORG 6-7 (I- after O opens it; right).
    # Sentence 2: gold MISC 0-3; predicted MISC 0-2 and MISC 2-3 (boundary error, none right).
    # correct 2, predicted 5, gold 4: P = 40, R = 50, F = 2*40*50/90 = 400/9.
    out = entity_f1(gold, pred)
    assert out == pytest.approx({"precision": 40.0, "recall": 50.0, "f1": 400 / 9}, abs=TOL)


def test_entity_f1_iob1_and_iobes():
    # IOB1: gold PER 0-2, PER 2-3; predicted one PER 0-3 (B- missed): P = 0/1, R = 0/2.
    out = entity_f1([["I-PER", "I-PER", "B-PER"]], [["I-PER", "I-PER", "I-PER"]])
    assert out == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    # IOBES: gold PER 0-2, LOC 3-4; predicted PER 0-1, PER 1-2, LOC 3-4: 1 right.
    # P = 100/3, R = 50, F = 2*(100/3)*50 / (100/3 + 50) = 40.
    out = entity_f1([["B-PER", "E-PER", "O", "S-LOC"]], [["S-PER", "S-PER", "O", "S-LOC"]])
    assert out == pytest.approx({"precision": 100 / 3, "recall": 50.0, "f1": 40.0}, abs=TOL)
    out = entity_f1([["B-PER", "E-PER"]], [["B-PER", "E-PER"]])
    assert out == {"precision": 100.0, "recall": 100.0, "f1": 100.0}


def test_entity_f1_sentence_boundaries_and_errors():
    # Gold has one PER per sentence (an I- at a sentence start opens a chunk); were the
    # sentences joined, it would be a single PER 0-2 and the prediction would score 0.
    # Here: correct 1, predicted 1, gold 2: P = 100, R = 50, F = 200/3.
    out = entity_f1([["B-PER"], ["I-PER"]], [["B-PER"], ["O"]])
    assert out == pytest.approx({"precision": 100.0, "recall": 50.0, "f1": 200 / 3}, abs=TOL)
    assert entity_f1([["O"]], [["O"]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    with pytest.raises(ValueError, match="empty"):
        entity_f1([], [])
    with pytest.raises(ValueError, match="gold has 2 sentences but predictions have 1"):
        entity_f1([["O"], ["O"]], [["O"]])
    with pytest.raises(ValueError, match="sentence 1: gold has 2 tags but prediction has 1"):
        entity_f1([["O"], ["O", "O"]], [["O"], ["O"]])
