"""Tests of electra_tf.finetune.tagging_task: the CoNLL splits, the per-sentence loss, a
tiny model learning a synthetic chunking set, and raw-text serving equal to the Python path."""

import json
import math
import os
import random
import uuid

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.configs import apply_overrides
from electra_tf import fileio
from electra_tf.configs import ModelConfig
from electra_tf.finetune import export
from electra_tf.finetune import DataError
from electra_tf.finetune.export import TEXT_SIGNATURE, TaskServer
from electra_tf.finetune.model import FinetuningModel, make_head
from electra_tf.finetune.tagging import Sentence, predictions_to_tags, read_conll
from electra_tf.finetune.tagging_task import TaggingTask
from electra_tf.finetune.tasks import TaskData, get_task
from electra_tf.text import TextEncoder
from electra_tf.training.options import FinetuneOptions
from electra_tf.finetune.trainer import (FinetuneConfig, evaluate, num_train_steps, predict,
                                         run, train_trial)
from runtimes import tf_finetuner
from conftest import VOCAB
from preprocessing_cases import tagging_cases, tagging_digest

RECORDED = os.path.join(os.path.dirname(__file__), "preprocessing_recorded.json")

TINY = ModelConfig(vocab_size=30522, embedding_size=16, hidden_size=32, num_hidden_layers=1,
                   num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
MAX_LEN = 16

# Every word has one chunk role, so its BIOES tag is a function of the word:
# determiner B-NP, noun E-NP, verb S-VP, preposition S-PP, "." O. "unaffable" is three
# WordPiece tokens (una ##ff ##able): its tag sits on the first one.
DETS = ["the", "a", "this"]
NOUNS = ["cat", "dog", "house", "tree", "car", "unaffable"]
VERBS = ["runs", "jumped", "sees", "likes"]
PREPS = ["in", "on", "over"]
NUM_LABELS = 1 + 3 * 4  # O + {B, I, E, S} x {NP, VP, PP}


def _sentence(rng):
    """(word, POS, IOB2 chunk tag) rows: NP VP (PP NP){0,2} ."""
    def np_():
        return [(rng.choice(DETS), "DT", "B-NP"), (rng.choice(NOUNS), "NN", "I-NP")]
    rows = np_() + [(rng.choice(VERBS), "VBZ", "B-VP")]
    for _ in range(rng.randrange(3)):
        rows += [(rng.choice(PREPS), "IN", "B-PP")] + np_()
    return rows + [(".", ".", "O")]


def _conll(sentences):
    return "\n\n".join("\n".join(" ".join(r) for r in s) for s in sentences) + "\n"


@pytest.fixture(scope="module")
def encoder():
    return TextEncoder(VOCAB)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    rng = random.Random(0)
    text = _conll([_sentence(rng) for _ in range(64)])
    root = tmp_path_factory.mktemp("tagging")
    os.makedirs(root / "chunk")
    # The dev set is the training set: the test is whether the model fits it.
    for name in ("train.txt", "dev.txt"):
        (root / "chunk" / name).write_text(text)
    return str(root)


def _cfg(**kw):
    base = dict(learning_rate=5e-3, layerwise_lr_decay=1.0, num_train_epochs=8,
                train_batch_size=16, eval_batch_size=16, max_seq_length=MAX_LEN,
                steps_per_loop=32, warmup_proportion=0.1)
    base.update(kw)
    return apply_overrides(FinetuneConfig(), base).resolved(TINY, TaggingTask()).check()


@pytest.fixture(scope="module")
def trained(encoder, data_dir, tmp_path_factory):
    """(task, finetuner, train, dev, loss at init on dev) after training to the end."""
    task = get_task("chunk")
    train = task.train_split(data_dir, encoder, MAX_LEN)
    dev = task.eval_splits(data_dir, encoder, MAX_LEN)[0]
    cfg = _cfg()
    # 32 steps of 16. Graph mode without XLA: XLA's compile alone costs ~15 s on 2 cores.
    finetuner = tf_finetuner(task, TINY, cfg, tf.distribute.OneDeviceStrategy("/cpu:0"),
                          num_train_steps(train.num_examples, cfg), None, seed=1,
                          jit_compile=False)
    init = evaluate(finetuner, dev)
    train_trial(finetuner, train, str(tmp_path_factory.mktemp("trial")), seed=1)
    return task, finetuner, train, dev, init


# --------------------------------------------------------------------------- data

def test_features_equal_the_recorded_python_preprocessor(encoder):
    # The features now come from serving's pack_words; ids, labels, word positions and
    # counts must be those the Python preprocessor made (recorded before it went).
    with open(RECORDED) as f:
        recorded = json.load(f)["tagging"]
    names = []
    for name, sentences, label_map, max_len, scheme in tagging_cases():
        task = TaggingTask(scheme=scheme, label_map=label_map)
        assert tagging_digest(task.features(sentences, encoder, max_len)) == recorded[name], \
            name
        names.append(name)
    assert sorted(names) == sorted(recorded) and len(names) == 24


def test_task_splits_and_label_map(encoder, data_dir):
    task = get_task("chunk")
    assert isinstance(task, TaggingTask)
    assert (task.kind, task.primary_metric, task.num_train_epochs) == ("tagging", "f1", 3.0)
    with pytest.raises(ValueError, match="label map is unknown"):
        task.num_outputs()
    train = task.train_split(data_dir, encoder, MAX_LEN)
    assert task.num_outputs() == NUM_LABELS == len(task.label_map)
    assert task.label_map.labels[:5] == ("O", "B-NP", "B-PP", "B-VP", "E-NP")
    assert train.num_examples == 64 and train.name == "train.txt"
    assert sorted(train.arrays) == ["input_ids", "input_mask", "label_ids", "label_weights",
                                    "segment_ids", "weight"]
    assert train.arrays["input_ids"].shape == (64, MAX_LEN)
    np.testing.assert_array_equal(train.arrays["weight"], np.ones(64, np.float32))
    # Labels are converted to BIOES: a noun closes its NP, a verb is a single-word VP.
    role = {**{w: "B-NP" for w in DETS}, **{w: "E-NP" for w in NOUNS},
            **{w: "S-VP" for w in VERBS}, **{w: "S-PP" for w in PREPS}, ".": "O"}
    sentences = task._read(data_dir, "train.txt")
    for sentence, gold, ids, weights in zip(sentences, train.meta.gold,
                                            train.arrays["label_ids"],
                                            train.arrays["label_weights"]):
        assert gold == [role[w] for w in sentence.words]
        # Sentences fit in MAX_LEN: every word has its label on one token.
        assert task.label_map.names(ids[weights > 0]) == gold
    assert json.loads(task.assets()["labels.json"]) == {
        "scheme": "bioes", "labels": list(task.label_map.labels)}

    (dev,) = task.eval_splits(data_dir, encoder, MAX_LEN)
    assert dev.num_examples == 64 and dev.meta.label_map is task.label_map
    # NER: same reader, the other folder and the 4-column layout.
    assert get_task("ner").name == "ner"
    with pytest.raises(DataError, match="dev.txt: no such file.*test.txt"):
        TaggingTask("chunk", dev_files=("dev.txt",)).eval_splits(
            os.path.join(data_dir, "nowhere"), encoder, MAX_LEN)


def test_conll_files_read_from_ram(encoder, data_dir, tmp_path, monkeypatch):
    """CoNLL files under a ram:// data_dir: the same sentences, label map and arrays as
    the local files; a bad line and a missing file name their ram:// path; nothing local
    named after the path appears."""
    monkeypatch.chdir(tmp_path)
    root = f"ram://conll_{uuid.uuid4().hex}"
    fileio.makedirs(f"{root}/chunk")
    for name in ("train.txt", "dev.txt"):
        fileio.copy(os.path.join(data_dir, "chunk", name), f"{root}/chunk/{name}")
    local, ram = get_task("chunk"), get_task("chunk")
    want = local.train_split(data_dir, encoder, MAX_LEN)
    got = ram.train_split(root, encoder, MAX_LEN)
    assert ram.label_map == local.label_map and len(ram.label_map) == NUM_LABELS
    assert got.num_examples == want.num_examples == 64
    for k in want.arrays:
        np.testing.assert_array_equal(got.arrays[k], want.arrays[k], err_msg=k)
    assert got.meta.gold == want.meta.gold
    got_sentences = ram._read(root, "train.txt")
    want_sentences = local._read(data_dir, "train.txt")
    assert [s.words for s in got_sentences] == [s.words for s in want_sentences]
    assert got_sentences[1].where() == f"{root}/chunk/train.txt:{want_sentences[1].line}"
    (dev,) = ram.eval_splits(root, encoder, MAX_LEN)
    assert dev.num_examples == 64
    fileio.write_atomic(f"{root}/bad.txt", "a DT B-NP\nb NN\n")
    with pytest.raises(DataError, match=f"{root}/bad.txt:2: "):
        read_conll(f"{root}/bad.txt")
    with pytest.raises(DataError, match=f"{root}/nope.txt: cannot read: No such file"):
        read_conll(f"{root}/nope.txt")
    with pytest.raises(DataError, match=f"{root}/x/chunk/dev.txt: no such file"):
        ram.eval_splits(f"{root}/x", encoder, MAX_LEN)
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith("ram:")]


def test_loss_is_mean_over_labelled_words_and_ln_labels_at_init(encoder, data_dir):
    task = TaggingTask()
    train = task.train_split(data_dir, encoder, MAX_LEN)
    keras.utils.set_random_seed(0)
    model = FinetuningModel(TINY, make_head("tagging", TINY, task.num_outputs()))
    batch = {k: tf.constant(v[:8]) for k, v in train.arrays.items()}
    logits = model(batch, training=False)["logits"].numpy()
    loss = task.loss({"logits": tf.constant(logits)}, batch).numpy()
    assert loss.shape == (8,)
    # Reference: log-softmax in numpy, averaged over each row's labelled positions.
    log_p = logits - logits.max(-1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
    for r in range(8):
        w = train.arrays["label_weights"][r]
        ce = -log_p[r, np.arange(MAX_LEN), train.arrays["label_ids"][r]]
        assert loss[r] == pytest.approx(float((ce * w).sum() / w.sum()), rel=1e-5)
    # Small logits at init (std ~0.1): every sentence costs about ln(13) = 2.565.
    np.testing.assert_allclose(loss, math.log(NUM_LABELS), atol=0.2)
    assert loss.mean() == pytest.approx(math.log(NUM_LABELS), abs=0.1)
    # A row without labelled words costs 0, not NaN.
    empty = dict(batch, label_weights=tf.zeros_like(batch["label_weights"]))
    assert np.all(task.loss({"logits": tf.constant(logits)}, empty).numpy() == 0.0)


# --------------------------------------------------------------------------- training

@pytest.mark.e2e
def test_training_reaches_entity_f1(trained):
    task, finetuner, _, dev, init = trained
    assert init["loss"] == pytest.approx(math.log(NUM_LABELS), abs=0.1)
    assert init["f1"] < 50
    result = evaluate(finetuner, dev)
    assert result["f1"] >= 90.0, result
    assert result["accuracy"] >= 0.95, result
    assert result["loss"] < 0.5 * init["loss"]
    assert set(result) == {"precision", "recall", "f1", "accuracy", "loss"}


# --------------------------------------------------------------------------- serving

SENTENCES = [
    "the cat runs .",
    "a unaffable dog jumped over this house .",
    # Over MAX_LEN - 2 = 14 tokens: "unaffable" (3 tokens) starts at token 13 and keeps
    # its tag; the words after it are 'O' on both paths.
    "the dog sees a car in the tree on this cat over the unaffable house .",
    "this \x00 tree likes the car",  # a word without tokens
    "",
]


def _python_tags(task, finetuner, encoder, sentences):
    words = [s.split() for s in sentences]
    # Unlabelled text: every word tagged 'O'.
    unlabelled = [Sentence(tuple(w), ("O",) * len(w), 0) for w in words]
    feats = task.features(unlabelled, encoder, MAX_LEN)
    fetched = predict(finetuner, TaskData(feats.arrays(), len(feats)))
    return words, predictions_to_tags(feats, fetched["predictions"], task.label_map)


@pytest.fixture(scope="module")
def serve(trained, encoder):
    task, finetuner = trained[:2]
    server = TaskServer(task, finetuner.model, encoder, MAX_LEN)
    fn = server.signatures()[TEXT_SIGNATURE]
    return lambda texts: {k: v.numpy() for k, v in fn(text=tf.constant(texts)).items()}


def _rows(out):
    """Per sentence: (words, tags, tag ids) without the padding."""
    return [([w.decode() for w in out["words"][i, :n]],
             [t.decode() for t in out["tags"][i, :n]], list(out["tag_ids"][i, :n]))
            for i, n in enumerate(out["num_words"])]


def test_serving_text_equals_python_path(trained, encoder, serve):
    task, finetuner = trained[:2]
    words, expected = _python_tags(task, finetuner, encoder, SENTENCES)
    assert expected[2][13:] == ["E-NP", "O", "O"] and expected[3][1] == "O"
    assert expected[0] == ["B-NP", "E-NP", "S-VP", "O"]
    out = serve(SENTENCES)
    width = max(len(w) for w in words)
    assert out["words"].shape == out["tags"].shape == out["tag_ids"].shape == (5, width)
    assert list(out["num_words"]) == [len(w) for w in words]
    for (got_words, got_tags, got_ids), want_words, want_tags in zip(_rows(out), words,
                                                                      expected):
        assert got_words == want_words
        assert got_tags == want_tags
        assert task.label_map.names(got_ids) == want_tags
    # Padding: "" tags and -1 ids past each sentence's words.
    assert out["tags"][0, 4:].tolist() == [b""] * (width - 4)
    assert out["tag_ids"][4].tolist() == [-1] * width
    # Each sentence alone answers as in the mixed batch.
    alone = serve(SENTENCES[1:2])
    assert _rows(alone) == _rows(out)[1:2]


def test_serving_bad_requests_answer(trained, serve):
    task = trained[0]
    out = serve(["", "   \t\n", "the cat\u00a0runs\u3000.", b"the \xff\xfecat runs"])
    rows = _rows(out)
    assert rows[0] == ([], [], []) and rows[1] == ([], [], [])
    # Unicode spaces separate words.
    assert rows[2][0] == ["the", "cat", "runs", "."]
    assert rows[2][1] == ["B-NP", "E-NP", "S-VP", "O"]
    # Bad bytes come back as U+FFFD (valid UTF-8) and are dropped by the tokenizer.
    assert rows[3][0] == ["the", "\ufffd\ufffdcat", "runs"]
    assert rows[3][1] == ["B-NP", "E-NP", "S-VP"]
    long = " ".join(["the cat runs on a tree ."] * 700)
    out = serve([long, "a dog"])
    assert out["num_words"].tolist() == [4900, 2]
    assert out["tags"].shape == (2, 4900)
    tags = [t.decode() for t in out["tags"][0]]
    # Only the first MAX_LEN - 2 words (one token each) are tagged.
    assert tags[:7] == ["B-NP", "E-NP", "S-VP", "S-PP", "B-NP", "E-NP", "O"]
    assert set(tags[MAX_LEN - 2:]) == {"O"}
    assert [t.decode() for t in out["tags"][1]][:2] == ["B-NP", "E-NP"]
    assert task.label_map.names(out["tag_ids"][0, :20]) == tags[:20]


def test_serve_ids_returns_tag_ids_and_probabilities(trained, encoder, serve):
    task, finetuner = trained[:2]
    server = TaskServer(task, finetuner.model, encoder, MAX_LEN)
    batch = encoder.encode(tf.constant(["the cat runs ."]), None, MAX_LEN)
    out = server.serve_ids(**batch)
    assert out["tag_ids"].shape == (1, MAX_LEN)
    assert out["probabilities"].shape == (1, MAX_LEN, NUM_LABELS)
    np.testing.assert_allclose(out["probabilities"].numpy().sum(-1), 1.0, rtol=1e-5)
    names = task.label_map.names(out["tag_ids"].numpy()[0, 1:5])
    assert names == ["B-NP", "E-NP", "S-VP", "O"] == _rows(serve(["the cat runs ."]))[0][1]


def test_exported_savedmodel_serves_the_same(trained, encoder, serve, tmp_path):
    task, finetuner = trained[:2]
    paths = export.export(task, finetuner.model, encoder, MAX_LEN, str(tmp_path), version=1)
    with open(os.path.join(paths["task"], "assets.extra_labels.json")) as f:
        assert json.loads(f.read()) == {"scheme": task.scheme,
                                        "labels": list(task.label_map.labels)}
    loaded = tf.saved_model.load(paths["task"]).signatures[TEXT_SIGNATURE]
    out = {k: v.numpy() for k, v in loaded(text=tf.constant(SENTENCES)).items()}
    assert _rows(out) == _rows(serve(SENTENCES))


@pytest.mark.e2e
def test_run_reads_train_before_building_the_model(data_dir, tmp_path):
    # A fresh task: run() must learn the label map (the head's size) before the model.
    task = TaggingTask("chunk")
    cfg = apply_overrides(FinetuneConfig(), dict(learning_rate=5e-3, num_train_epochs=1,
                                                 train_batch_size=16, eval_batch_size=32,
                                                 max_seq_length=MAX_LEN))
    results = run(task, TINY, cfg, FinetuneOptions(data_dir=data_dir, model_dir=str(tmp_path),
                                              vocab_file=VOCAB, strategy="cpu",
                                              jit_compile=False))
    assert results["metric"] == "f1" and results["num_train_steps"] == 4
    assert set(results["trials"][0]) >= {"f1", "precision", "recall", "accuracy", "loss"}
    assert len(task.label_map) == NUM_LABELS
