"""GLUE test-set predictions (--do_predict): each task's test layout, the leaderboard's
file format, and the median trial's predictions written by a run."""

import os

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.configs import apply_overrides
from electra_tf.configs import ModelConfig
from electra_tf.finetune import DataError
from electra_tf.finetune.tasks import GLUE, get_task
from electra_tf.text import TextEncoder
from electra_tf.training.options import FinetuneOptions
from electra_tf.finetune.trainer import Finetuner, FinetuneConfig, run

VOCAB = "data/vocab/bert_uncased_vocab.txt"
TINY = ModelConfig(vocab_size=30522, embedding_size=16, hidden_size=32, num_hidden_layers=1,
                   num_attention_heads=2, intermediate_size=64, max_position_embeddings=32)

MNLI_TEST_HEAD = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\t"
                  "sentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\t"
                  "sentence2")
# Each task's test file as GLUE ships it: (folder/file, header, [(index, texts...)], the
# columns before the texts). Indices are not 0..n-1 on purpose: they must be copied.
TESTS = {
    "cola": [("CoLA/test.tsv", "index\tsentence", 0,
              [("7", "the boy ran ."), ("9", "ran boy the .")])],
    "sst2": [("SST-2/test.tsv", "index\tsentence", 0,
              [("0", "a great film"), ("1", "dull , \"flat\" plot"), ("2", "it's fine")])],
    "mrpc": [("MRPC/test.tsv", "index\t#1 ID\t#2 ID\t#1 String\t#2 String", 2,
              [("0", "he left", "he went away"), ("5", "one", "two")])],
    "stsb": [("STS-B/test.tsv", "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\t"
              "sentence1\tsentence2", 6,
              [("0", "a man eats", "a person eats"), ("1", "a cat", "the sky"),
               ("2", "x", "x")])],
    "qqp": [("QQP/test.tsv", "id\tquestion1\tquestion2", 0,
             [("100", "how do i cook?", "how to cook?"), ("101", "why?", "when?")])],
    "mnli": [("MNLI/test_matched.tsv", MNLI_TEST_HEAD, 7,
              [("0", "a man sleeps", "a person rests"), ("1", "dogs bark", "cats fly")]),
             ("MNLI/test_mismatched.tsv", MNLI_TEST_HEAD, 7,
              [("3", "it rains", "it is wet")]),
             ("diagnostic/diagnostic.tsv", "index\tsentence1\tsentence2", 0,
              [("0", "the cat sat", "the cat sits"), ("1", "no one came", "someone came"),
               ("2", "a", "b")])],
    "qnli": [("QNLI/test.tsv", "index\tquestion\tsentence", 0,
              [("0", "who?", "nobody did"), ("1", "what?", "a thing")])],
    "rte": [("RTE/test.tsv", "index\tsentence1\tsentence2", 0,
             [("0", "paris is in france", "france has paris")])],
}
SUBMISSIONS = {"cola": ["CoLA"], "sst2": ["SST-2"], "mrpc": ["MRPC"], "stsb": ["STS-B"],
               "qqp": ["QQP"], "mnli": ["MNLI-m", "MNLI-mm", "AX"], "qnli": ["QNLI"],
               "rte": ["RTE"]}


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _test_line(row, skip):
    return "\t".join([row[0]] + ["x"] * skip + list(row[1:]))


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("glue"))
    for files in TESTS.values():
        for file, head, skip, rows in files:
            write(os.path.join(d, file),
                  head + "\n" + "".join(_test_line(r, skip) + "\n" for r in rows))
    # Training data for the runs: MNLI (three labels, three test sets) and STS-B.
    rng = np.random.default_rng(0)
    labels = ["contradiction", "entailment", "neutral"]
    words = ["dog", "cat", "man", "rain", "sun", "car", "tree", "book"]
    mnli = ["index\tsentence1\tsentence2\tgold_label"]
    stsb = ["index\tsentence1\tsentence2\tscore"]
    for i in range(32):
        a, b = rng.choice(words, 2)
        mnli.append(f"{i}\ta {a}\t{'a ' + a if i % 3 == 1 else 'no ' + b}\t{labels[i % 3]}")
        stsb.append(f"{i}\ta {a}\ta {b}\t{5.0 if a == b else rng.uniform(0, 2):.2f}")
    for name in ("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv"):
        write(os.path.join(d, "MNLI", name), "\n".join(mnli) + "\n")
    for name in ("train.tsv", "dev.tsv"):
        write(os.path.join(d, "STS-B", name), "\n".join(stsb) + "\n")
    return d


@pytest.fixture(scope="module")
def encoder():
    return TextEncoder(VOCAB)


def test_each_task_reads_its_test_layout(glue_dir, encoder):
    assert sorted(TESTS) == sorted(GLUE)
    for name, files in TESTS.items():
        task = get_task(name, glue_dir)
        tests = task.test_splits(glue_dir, encoder, 16)
        assert [t.name for t in tests] == SUBMISSIONS[name]
        for data, (_, _, _, rows) in zip(tests, files):
            assert data.meta == [r[0] for r in rows], name
            assert data.num_examples == len(rows) and "label" not in data.arrays
            texts = list(zip(*rows))[1:]
            want = encoder.encode_numpy(list(texts[0]), list(texts[1]) if len(texts) > 1
                                        else None, 16)
            for k, v in want.items():
                np.testing.assert_array_equal(data.arrays[k], v, err_msg=f"{name} {k}")


def test_predicted_labels_are_submission_strings(glue_dir, encoder):
    rng = np.random.default_rng(1)
    for name in GLUE:
        task = get_task(name, glue_dir)
        data = task.test_splits(glue_dir, encoder, 16)[0]
        logits = rng.normal(size=[data.num_examples, task.num_outputs()]) * 10
        labels = task.predicted_labels(data, {"logits": logits.astype(np.float32)})
        assert len(labels) == data.num_examples
        if name == "stsb":  # 0-5 scores, clipped
            scores = [float(x) for x in labels]
            want = np.clip(logits[:, 0] * 5, 0, 5)
            np.testing.assert_allclose(scores, want, atol=5e-4)
        else:
            assert labels == [task.labels[i] for i in np.argmax(logits, -1)]
    assert get_task("qnli").labels == get_task("rte").labels == ("entailment",
                                                                 "not_entailment")


def test_missing_test_file_fails_before_training(glue_dir, tmp_path):
    d = str(tmp_path)
    for name in ("train.tsv", "dev.tsv"):
        write(os.path.join(d, "RTE", name), "index\tsentence1\tsentence2\tlabel\n"
              "0\ta\tb\tentailment\n")
    options = FinetuneOptions(data_dir=d, model_dir=str(tmp_path / "m"), vocab_file=VOCAB,
                         strategy="cpu", do_predict=True)
    with pytest.raises(DataError, match=r"RTE/test.tsv: no such file \(the test set that "
                                        r"--do_predict predicts for RTE.tsv\)"):
        run(get_task("rte", d), TINY,
            apply_overrides(FinetuneConfig(), {"max_seq_length": 16}), options)
    assert not os.path.exists(tmp_path / "m" / "trial_0")
    with pytest.raises(DataError, match="task polarity: --do_predict writes GLUE"):
        get_task("polarity").test_splits(d, None, 16)


def _read(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    assert lines[0] == "index\tprediction" and lines[-1] == ""
    return [line.split("\t") for line in lines[1:-1]]


CFG = apply_overrides(FinetuneConfig(), dict(learning_rate=1e-3, num_train_epochs=1,
                                             train_batch_size=8, eval_batch_size=8,
                                             max_seq_length=16, steps_per_loop=4))


def test_mnli_run_writes_median_trial_predictions(glue_dir, encoder, tmp_path):
    task = get_task("mnli", glue_dir)
    cfg = apply_overrides(CFG, {"num_trials": 2})
    model_dir = str(tmp_path / "mnli")
    results = run(task, TINY, cfg, FinetuneOptions(data_dir=glue_dir, model_dir=model_dir,
                                              vocab_file=VOCAB, strategy="cpu",
                                              jit_compile=False, do_predict=True))
    out = os.path.join(model_dir, "predictions")
    assert sorted(os.listdir(out)) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]  # no temp files
    assert results["predictions"] == {n: os.path.join(out, f"{n}.tsv")
                                      for n in ("MNLI-m", "MNLI-mm", "AX")}
    # The median trial's model predicted them.
    best = results["median_trial"]
    ft = Finetuner(task, TINY, cfg.resolved(TINY, task), tf.distribute.get_strategy(),
                   results["num_train_steps"], None, 1, jit_compile=False)
    ft.restore(tf.train.latest_checkpoint(os.path.join(model_dir, f"trial_{best}")))
    for data, (_, _, _, rows) in zip(task.test_splits(glue_dir, encoder, 16), TESTS["mnli"]):
        got = _read(os.path.join(out, f"{data.name}.tsv"))
        assert [r[0] for r in got] == [r[0] for r in rows]
        assert all(r[1] in ("entailment", "neutral", "contradiction") for r in got)
        want = np.argmax(ft.predict(data)["logits"], -1)
        assert [r[1] for r in got] == [task.labels[i] for i in want]


def test_stsb_run_writes_scores(glue_dir, tmp_path):
    task = get_task("stsb", glue_dir)
    model_dir = str(tmp_path / "stsb")
    results = run(task, TINY, CFG, FinetuneOptions(data_dir=glue_dir, model_dir=model_dir,
                                              vocab_file=VOCAB, strategy="cpu",
                                              jit_compile=False, do_predict=True))
    rows = _read(results["predictions"]["STS-B"])
    assert results["predictions"]["STS-B"] == os.path.join(model_dir, "predictions",
                                                           "STS-B.tsv")
    assert [r[0] for r in rows] == ["0", "1", "2"]
    scores = [float(r[1]) for r in rows]
    assert all(0.0 <= s <= 5.0 for s in scores) and all("." in r[1] for r in rows)


def test_write_predictions_replaces_atomically(glue_dir, encoder, tmp_path):
    from electra_tf.finetune.trainer import write_predictions

    class Fixed:
        def predict(self, data):
            return {"logits": np.tile([[0.0, 1.0]], [data.num_examples, 1])}

    task = get_task("sst2", glue_dir)
    (data,) = task.test_splits(glue_dir, encoder, 16)
    out = str(tmp_path / "p")
    write(os.path.join(out, "SST-2.tsv"), "stale\n")
    paths = write_predictions(task, Fixed(), [data], out)
    assert _read(paths["SST-2"]) == [["0", "1"], ["1", "1"], ["2", "1"]]
    assert os.listdir(out) == ["SST-2.tsv"]
