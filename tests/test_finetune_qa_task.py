"""Tests of electra_tf.finetune.qa_task: SQuAD data, loss, training and metrics through the
fine-tuning runtime, and the in-graph serving path checked against the Python postprocessing."""

import json
import math
import os
import re
import uuid

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.configs import apply_overrides
from electra_tf import fileio
from electra_tf.compat import xla_cpu_available
from electra_tf.configs import ConfigError, ModelConfig
from electra_tf.finetune import DataError, squad
from electra_tf.finetune.export import IDS_SIGNATURE, TEXT_SIGNATURE, TaskServer
from electra_tf.finetune.metrics import squad_em, squad_f1
from electra_tf.finetune.model import FinetuningModel, answer_mask, make_head
from electra_tf.finetune.qa_task import SquadTask
from electra_tf.finetune.tasks import get_task
from electra_tf.text import TextEncoder
from electra_tf.finetune.trainer import FinetuneConfig, evaluate, predict, train_trial
from runtimes import tf_finetuner

from conftest import VOCAB
from preprocessing_cases import PARAGRAPHS as CASE_PARAGRAPHS
from preprocessing_cases import LONG, squad_cases, squad_digest, squad_tree

RECORDED = os.path.join(os.path.dirname(__file__), "preprocessing_recorded.json")

CFG = ModelConfig(vocab_size=30522, embedding_size=16, hidden_size=32, num_hidden_layers=1,
                  num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
L = 64
OPTIONS = dict(doc_stride=16, max_query_length=16, beam=5)
# LONG is long enough for several windows of L=64 (about 45 context tokens each).
PARAGRAPHS = CASE_PARAGRAPHS[:3]


def squad_json(v2: bool, paragraphs=PARAGRAPHS) -> dict:
    return dict(squad_tree(paragraphs, v2), version="v2.0" if v2 else "1.1")


def write_squad(root, v2: bool, names=("train.json", "dev.json")):
    folder = root / "squad"
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text(json.dumps(squad_json(v2)))
    return str(root)


@pytest.fixture(scope="module")
def encoder():
    return TextEncoder(VOCAB)


@pytest.fixture(scope="module")
def v2_data(tmp_path_factory, encoder):
    task = SquadTask(v2=True, **OPTIONS)
    root = write_squad(tmp_path_factory.mktemp("squad2"), v2=True)
    return task, task.train_split(root, encoder, L), task.eval_splits(root, encoder, L)[0]


def new_model(task, seed=1):
    tf.keras.utils.set_random_seed(seed)
    return FinetuningModel(CFG, make_head(task.kind, CFG, task.num_outputs(),
                                          **task.head_options()))


def tensors(arrays, keys=None):
    return {k: tf.constant(v) for k, v in arrays.items() if keys is None or k in keys}


# ------------------------------------------------------------------------------ data


def test_task_registry_and_files(tmp_path, encoder):
    v1, v2 = get_task("squad_v1"), get_task("squad_v2")
    assert (v1.name, v1.v2, v2.name, v2.v2) == ("squad_v1", False, "squad_v2", True)
    assert (v2.kind, v2.primary_metric, v2.num_train_epochs) == ("qa", "f1", 2.0)
    assert v2.text_fields() == ("question", "context")
    with pytest.raises(DataError, match=r"squad_v2: no train file in .*squad \(looked for "
                                        r"train.json and train-v2.0.json\)"):
        v2.train_split(str(tmp_path), encoder, 128)
    # The official file names are found when the plain ones are absent.
    root = write_squad(tmp_path, v2=False, names=("train-v1.1.json", "dev-v1.1.json"))
    assert SquadTask(v2=False).data_file(root, "dev").endswith("squad/dev-v1.1.json")
    with pytest.raises(DataError, match="looked for dev.json and dev-v2.0.json"):
        SquadTask(v2=True).data_file(root, "dev")
    with pytest.raises(ConfigError, match="max_seq_length=64 leaves no room"):
        SquadTask(v2=False, max_query_length=61).train_split(root, encoder, 64)


def test_train_and_eval_arrays(v2_data):
    task, train, dev = v2_data
    n = train.num_examples
    # 8 questions: the 6 of the short paragraphs have one window each; LONG (96 tokens)
    # has 4 for each of its 2 (windows of 64 - 3 - 5 or 6 question tokens, 16 apart).
    assert n == len(train.arrays["input_ids"]) == 6 + 2 * 4
    assert set(train.arrays) == {"input_ids", "input_mask", "segment_ids", "start_positions",
                                 "end_positions", "is_impossible", "weight"}
    assert train.arrays["weight"].dtype == np.float32 and (train.arrays["weight"] == 1).all()
    impossible = train.arrays["is_impossible"] == 1
    # Unanswerable windows point at [CLS]; answerable ones inside the context segment.
    assert (train.arrays["start_positions"][impossible] == 0).all()
    ok = ~impossible
    rows = np.arange(n)[ok]
    assert (train.arrays["segment_ids"][rows, train.arrays["start_positions"][ok]] == 1).all()
    # One window holds each of the 5 answers ("margaret hill" ends LONG: its last window).
    assert ok.sum() == 5
    # Eval rows are features (the same 14 windows); the metrics map them to questions.
    feats = dev.meta.features
    assert dev.num_examples == len(feats) == 14 and len(dev.meta.examples) == 8
    np.testing.assert_array_equal(np.bincount(feats.example_index),
                                  [1, 1, 1, 1, 1, 1, 4, 4])
    assert set(dev.arrays) == {"input_ids", "input_mask", "segment_ids", "weight"}
    assert dev.meta.do_lower_case is True


def test_squad_files_read_from_ram(v2_data, encoder, tmp_path, monkeypatch):
    """SQuAD JSON under a ram:// data_dir (the official file names): the same arrays as
    from local files; a malformed or missing file names its ram:// path; nothing local
    named after the path appears."""
    task, train, dev = v2_data
    monkeypatch.chdir(tmp_path)
    root = f"ram://squad_{uuid.uuid4().hex}"
    fileio.makedirs(f"{root}/squad")
    for name in ("train-v2.0.json", "dev.json"):
        fileio.write_atomic(f"{root}/squad/{name}", json.dumps(squad_json(True)))
    assert task.data_file(root, "train") == f"{root}/squad/train-v2.0.json"
    got_train = task.train_split(root, encoder, L)
    got_dev = task.eval_splits(root, encoder, L)[0]
    assert got_train.name == "train-v2.0.json" and got_train.num_examples == train.num_examples
    for want, got in ((train, got_train), (dev, got_dev)):
        assert sorted(got.arrays) == sorted(want.arrays)
        for k in want.arrays:
            np.testing.assert_array_equal(got.arrays[k], want.arrays[k], err_msg=k)
    assert [e.qid for e in got_dev.meta.examples] == [e.qid for e in dev.meta.examples]
    fileio.write_atomic(f"{root}/squad/dev.json", '{"data": [\n{"title": "t",\n}]}')
    with pytest.raises(DataError, match=re.escape(f"{root}/squad/dev.json:3: invalid JSON")):
        task.eval_splits(root, encoder, L)
    with pytest.raises(DataError, match=re.escape(f"{root}/squad/x.json: cannot read: No such "
                                                  "file or directory")):
        squad.read_squad(f"{root}/squad/x.json", is_training=False, v2=True)
    with pytest.raises(DataError, match="no dev file in " + re.escape(f"{root}/nope/squad")):
        task.eval_splits(f"{root}/nope", encoder, L)
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith("ram:")]


def test_initial_loss_is_log_of_allowed_positions(v2_data):
    # Near-zero logits at initialisation: each cross-entropy is about the log of the number
    # of positions the mask allows (context tokens and [CLS]), the BCE about log 2.
    task, train, _ = v2_data
    model = new_model(task)
    batch = tensors(train.arrays)
    losses = task.loss(model(batch, training=False), batch).numpy()
    allowed = answer_mask(batch).numpy().sum(axis=1)
    expected = np.log(allowed) + 0.5 * math.log(2.0)
    assert losses.shape == (train.num_examples,)
    assert allowed.min() > 10
    np.testing.assert_allclose(losses, expected, atol=0.1)
    # With the output layers zeroed the logits are exactly uniform over the allowed
    # positions: the masking and the 0.5 weights are then checked to float precision.
    for layer in (model.head.start_logits, model.head.end_logits, model.head.null_logit):
        for v in layer.weights:
            v.assign(tf.zeros_like(v))
    losses = task.loss(model(batch, training=False), batch).numpy()
    np.testing.assert_allclose(losses, expected, rtol=1e-5)


# ------------------------------------------------------------------------------ training


def trained(task, data, tmp_path, steps, lr=2e-3, jit=None):
    cfg = apply_overrides(FinetuneConfig(), dict(learning_rate=lr, layerwise_lr_decay=1.0,
                                                 num_train_epochs=1, train_batch_size=4,
                                                 eval_batch_size=8, max_seq_length=L,
                                                 warmup_proportion=0.0, steps_per_loop=steps,
                                                 save_checkpoints_steps=10 ** 6))
    cfg = cfg.resolved(CFG, task)
    ft = tf_finetuner(task, CFG, cfg, tf.distribute.OneDeviceStrategy("/cpu:0"), steps, None,
                   seed=3, jit_compile=xla_cpu_available() if jit is None else jit)
    batch = tensors(data.arrays)
    before = float(np.mean(task.loss(ft.model(batch, training=False), batch)))
    train_trial(ft, data, str(tmp_path / "trial"), seed=3)
    after = float(np.mean(task.loss(ft.model(batch, training=False), batch)))
    return ft, before, after


@pytest.mark.e2e
def test_training_lowers_the_loss_and_evaluates(v2_data, tmp_path):
    task, train, dev = v2_data
    ft, before, after = trained(task, train, tmp_path, steps=30)
    assert int(ft.global_step.numpy()) == 30
    assert after < before - 0.5, (before, after)
    result = evaluate(ft, dev)
    assert all(type(v) is float for v in result.values())
    assert "loss" not in result  # dev features carry no gold positions
    fetched = predict(ft, dev)
    assert set(fetched) == {"start_top_log_probs", "start_top_index", "end_top_log_probs",
                            "end_top_index", "null_logit"}
    assert fetched["start_top_index"].shape == (dev.num_examples, 5)
    assert fetched["end_top_log_probs"].shape == (dev.num_examples, 5, 5)
    # The metrics, recomputed question by question from postprocess's answers of the same
    # outputs: abstain when P(no answer) > 0.5, then SQuAD 2.0's EM / F1.
    preds, na = task.predictions(dev, fetched)
    golds = {ex.qid: list(ex.answers) for ex in dev.meta.examples}
    assert set(preds) == set(na) == set(golds)
    answered = {q: "" if na[q] > 0.5 else preds[q] for q in golds}
    exact = {q: squad_em(answered[q], golds[q]) for q in golds}
    f1 = {q: squad_f1(answered[q], golds[q]) for q in golds}
    has = [q for q in golds if golds[q]]
    no = [q for q in golds if not golds[q]]

    def percent(scores, qids):
        return 100.0 * sum(scores[q] for q in qids) / len(qids)

    assert (result["total"], result["HasAns_total"], result["NoAns_total"]) == (8, 5, 3)
    want = {"exact_match": percent(exact, golds), "f1": percent(f1, golds),
            "HasAns_exact": percent(exact, has), "HasAns_f1": percent(f1, has),
            "NoAns_exact": percent(exact, no), "NoAns_f1": percent(f1, no)}
    assert {k: result[k] for k in want} == pytest.approx(want, abs=1e-9)
    # best_f1: the official sweep answers the k questions of lowest P(no answer) with
    # their raw predictions and abstains on the rest, for the best k.
    order = sorted(golds, key=lambda q: na[q])
    raw_f1 = {q: squad_f1(preds[q], golds[q]) for q in golds}
    sweep = [sum(raw_f1[q] for q in order[:k]) + sum(not golds[q] for q in order[k:])
             for k in range(len(order) + 1)]
    assert result["best_f1"] == pytest.approx(100.0 * max(sweep) / len(order), abs=1e-9)


def test_squad_v1_file_trains_a_step(tmp_path, encoder):
    task = SquadTask(v2=False, **OPTIONS)
    root = write_squad(tmp_path, v2=False, names=("train-v1.1.json",))
    train = task.train_split(root, encoder, L)
    assert train.name == "train-v1.1.json"
    assert "null_logit" not in task.fetches({k: None for k in (
        "start_top_log_probs", "start_top_index", "end_top_log_probs", "end_top_index",
        "start_logits")})
    # 4 questions of one window each, and LONG's one answerable question in 4 windows.
    assert train.num_examples == 4 + 4
    ft, before, after = trained(task, train, tmp_path, steps=1, jit=False)
    assert int(ft.global_step.numpy()) == 1
    # At initialisation each cross-entropy is about the log of the allowed positions (no
    # answerability term in v1); one step on half of the windows lowers the mean loss.
    allowed = answer_mask(tensors(train.arrays)).numpy().sum(axis=1)
    assert before == pytest.approx(float(np.mean(np.log(allowed))), abs=0.1)
    assert after < before - 0.1, (before, after)


# ------------------------------------------------------------------------------ serving

PLAIN = ("alpha", "bravo", "charlie", "delta", "unbelievably", "echo", "foxtrot",
         "extraordinary", "golf", "hotel")


def plain_text(rng, n):
    return " ".join(rng.choice(PLAIN, n))


def words_of(context: bytes):
    return [w for w in re.split(rb"[ \t\r\n]+|\xe2\x80\xaf", context) if w]


def test_features_equal_the_recorded_python_preprocessor(encoder):
    # Training and dev features now come from the serving windows; ids, positions, maps
    # and windows must be those the Python preprocessor made (recorded before it went).
    with open(RECORDED) as f:
        recorded = json.load(f)["squad"]
    names = []
    for name, examples, L_, stride, query, is_training in squad_cases():
        task = SquadTask(doc_stride=stride, max_query_length=query)
        assert squad_digest(task.features(examples, encoder, L_, is_training)) \
            == recorded[name], name
        names.append(name)
    assert sorted(names) == sorted(recorded) and len(names) == 25


def test_windows_of_awkward_contexts(encoder):
    task = SquadTask(v2=True, **OPTIONS)
    rng = np.random.default_rng(0)
    questions = ["who was the curator?", "", "what " * 30, "why", "empty"]
    contexts = [LONG, "The quick, brown fox.", plain_text(rng, 70), "a\u202fb  c\td\u00a0e",
                " \x07 "]
    win = task.windows(encoder, L, questions, contexts)
    # LONG (96 tokens) under a 5-token question: 4 windows of 56 tokens, 16 apart; 70 plain
    # words (108 tokens) under 30 "what"s (cut to 16 tokens): 5 of 45; the short ones 1,
    # and a context without tokens one context-less window (training drops it).
    np.testing.assert_array_equal(win["request"].numpy(), [0] * 4 + [1] + [2] * 5 + [3, 4])
    np.testing.assert_array_equal(win["num_tokens"].numpy(), [96, 6, 108, 5, 0])
    assert win["words"][3].numpy().tolist() == [b"a", b"b", b"c", b"d\xc2\xa0e"]
    index, word = win["token_index"].numpy(), win["token_word"].numpy()
    np.testing.assert_array_equal(index[:4, 7], [0, 16, 32, 48])  # 5-token question
    for w in range(12):
        inside = index[w] >= 0
        e = win["request"].numpy()[w]
        np.testing.assert_array_equal(word[w][inside],
                                      win["doc_word"][e].numpy()[index[w][inside]])
        np.testing.assert_array_equal(win["batch"]["input_ids"].numpy()[w][inside],
                                      win["doc_ids"][e].numpy()[index[w][inside]])
    empty = encoder.tokenize(["empty"]).numpy()[0].tolist()
    assert win["batch"]["input_ids"].numpy()[11, :4].tolist() == [101] + empty + [102, 102]
    assert win["batch"]["segment_ids"].numpy()[11, :4].tolist() == [0, 0, 0, 1]


def best_span_score(feats, fetched, example, max_answer_length):
    """The largest start + end log-prob of a valid span of `example`, by brute force:
    start and end in the context, the start in its max-context window, end >= start."""
    best = -np.inf
    for f in np.flatnonzero(feats.example_index == example):
        orig, maxc = feats.token_to_orig_map[f], feats.token_is_max_context[f]
        for i, start in enumerate(fetched["start_top_index"][f]):
            for j, end in enumerate(fetched["end_top_index"][f, i]):
                if orig[start] >= 0 and maxc[start] and orig[end] >= 0 \
                        and 0 <= end - start < max_answer_length:
                    best = max(best, float(fetched["start_top_log_probs"][f, i])
                               + float(fetched["end_top_log_probs"][f, i, j]))
    return best


def test_served_span_equals_postprocess(encoder):
    # Same weights, same windows: the in-graph choice over all windows (max-context rule
    # included) must be postprocess's best span, and the no-answer probability its na_prob.
    task = SquadTask(v2=True, serve_windows_per_call=3, **OPTIONS)
    model = new_model(task, seed=7)
    rng = np.random.default_rng(1)
    questions = [plain_text(rng, int(n)) for n in rng.integers(1, 8, 10)]
    contexts = [plain_text(rng, int(n)) for n in rng.integers(3, 120, 10)]
    out = {k: v.numpy() for k, v in task.serve_text(
        model, encoder, L, {"question": tf.constant(questions),
                            "context": tf.constant(contexts)}).items()}
    examples = [squad.SquadExample(str(i), q, tuple(c.split()), ())
                for i, (q, c) in enumerate(zip(questions, contexts))]
    feats = task.features(examples, encoder, L, is_training=False)
    assert len(feats) == 47  # several windows per long context: 16 model calls of <= 3
    fetched = task.fetches(model(tensors(feats.arrays(), ("input_ids", "input_mask",
                                                          "segment_ids")), training=False))
    fetched = {k: v.numpy() for k, v in fetched.items()}
    preds, na = squad.postprocess(examples, feats, fetched,
                                  max_answer_length=task.max_answer_length, v2=True)
    for i, ex in enumerate(examples):
        s, e = out["start_word"][i], out["end_word"][i]
        assert 0 <= s <= e < len(ex.doc_words)
        assert " ".join(ex.doc_words[s:e + 1]) == preds[ex.qid], i
        assert out["score"][i] == pytest.approx(
            best_span_score(feats, fetched, i, task.max_answer_length), abs=1e-4)
        assert out["no_answer_probability"][i] == pytest.approx(na[ex.qid], abs=1e-5)
        expect = b"" if na[ex.qid] > 0.5 else preds[ex.qid].encode()
        assert out["answer"][i] == expect


@pytest.fixture(scope="module")
def server(encoder):
    task = SquadTask(v2=False, serve_windows_per_call=4, **OPTIONS)
    srv = TaskServer(task, new_model(task, seed=2), encoder, L)
    return srv, srv.signatures()


def test_serving_signature_on_awkward_rows(server):
    srv, signatures = server
    rng = np.random.default_rng(2)
    huge = plain_text(rng, 400)  # about 40 windows
    contexts = [b"the quick brown fox jumps over the lazy dog", b"",
                b"caf\xe9 au lait \xff\xfe is served hot at noon", huge.encode(),
                b"   \t ", b"no question here at all", LONG.encode()]
    questions = [b"what jumps?", b"anything?", b"what is served?", b"which word?",
                 b"blank?", b"", b"who was the curator?"]
    out = {k: v.numpy() for k, v in signatures[TEXT_SIGNATURE](
        question=tf.constant(questions), context=tf.constant(contexts)).items()}
    assert set(out) == {"answer", "start_word", "end_word", "score"}
    for i, context in enumerate(contexts):
        words, answer = words_of(context), out["answer"][i]
        if not words:
            assert (answer, out["start_word"][i], out["end_word"][i]) == (b"", -1, -1)
            assert out["score"][i] == -np.inf
            continue
        s, e = out["start_word"][i], out["end_word"][i]
        assert 0 <= s <= e < len(words) and answer in context and answer, i
        # Whole words, cut from the original bytes (the bad bytes included).
        assert words_of(answer) == words[s:e + 1], i
        assert np.isfinite(out["score"][i]) and out["score"][i] <= 0
    # The token-id signature gives the head's top-k outputs for packed windows.
    win = srv.task.windows(srv.encoder, L, questions[:1], contexts[:1])
    ids = signatures[IDS_SIGNATURE](**win["batch"])
    assert set(ids) == {"start_top_log_probs", "start_top_index", "end_top_log_probs",
                        "end_top_index"}
    assert ids["end_top_index"].shape == (1, 5, 5)


def test_serving_v2_withholds_answers_and_handles_empty_requests(encoder):
    task = SquadTask(v2=True, **OPTIONS)
    model = new_model(task, seed=4)
    # A very negative null bias makes every window answerable, a positive one none.
    bias = model.head.null_logit.bias
    # Invalid bytes alone normalise to nothing: that context has words but no tokens.
    contexts = [b"one two three", b"", b"x y", b"\xff \xfe", b"caf\xe9 \xff ok"]
    has_tokens = np.array([True, False, True, False, True])
    texts = {"question": tf.constant(["what?", "what?", "", "q", "which?"]),
             "context": tf.constant(contexts)}
    for value, answered in ((-50.0, True), (50.0, False)):
        bias.assign([value])
        out = {k: v.numpy() for k, v in task.serve_text(model, encoder, L, texts).items()}
        np.testing.assert_allclose(out["no_answer_probability"],
                                   np.where(has_tokens & answered, 0.0, 1.0), atol=1e-6)
        np.testing.assert_array_equal(out["start_word"] >= 0, has_tokens)
        np.testing.assert_array_equal(out["answer"] != b"", has_tokens & answered)
        for answer, context in zip(out["answer"], contexts):
            assert answer in context
    empty = task.serve_text(model, encoder, L, {"question": tf.constant([], tf.string),
                                                "context": tf.constant([], tf.string)})
    assert all(v.shape == (0,) for v in empty.values())
