"""finetune/trainer.py: GLUE layouts, a run's training, trials, export and serving, the
CLI; strategies and precisions (two MirroredStrategy replicas equal one device, bfloat16,
float16) and preemption (SIGTERM -> checkpoint -> resume); GLUE test-set predictions
(--do_predict): each task's test layout, the leaderboard's file format, and the median
trial's predictions written by a run."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import types
import uuid

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.configs import apply_overrides
from electra_tf.finetune import export as export_lib
from electra_tf.finetune import DataError
from electra_tf.finetune.tasks import GLUE, get_task, read_tsv
from electra_tf.text import TextEncoder
from electra_tf.training.options import FinetuneOptions
from electra_tf.finetune.trainer import FinetuneConfig, median_trial, predict, run
from electra_tf.training.runtime import pad_rows
from runtimes import tf_finetuner
from electra_tf.training.preemption import PREEMPTED_EXIT_CODE
from ram_paths import forget

from conftest import REPO, finetune_tiny_model, sigterm_after, write
import forked_cli

VOCAB = "data/vocab/bert_uncased_vocab.txt"
TINY = finetune_tiny_model()


@pytest.fixture(scope="module")
def encoder():
    return TextEncoder(VOCAB)


# ----------------------------------------------------------------------------- data

def test_glue_layouts(tmp_path, encoder):
    d = str(tmp_path)
    write(f"{d}/MNLI/train.tsv", "index\tx\tsentence1\tsentence2\tgold_label\n"
          "0\t.\ta man sleeps\ta person rests\tentailment\n"
          "1\t.\ta dog\ta cat\tcontradiction\n")
    write(f"{d}/MNLI/dev_matched.tsv", "index\tsentence1\tsentence2\tlabel1\tgold_label\n"
          "0\tx\ty\tneutral\tneutral\n")
    write(f"{d}/MNLI/dev_mismatched.tsv", "index\tsentence1\tsentence2\tlabel1\tgold_label\n"
          "0\tx\ty\tneutral\tneutral\n1\tz\tw\tneutral\tentailment\n")
    mnli = get_task("mnli", d)
    train = mnli.train_split(d, encoder, 16)
    assert train.arrays["label"].tolist() == [1, 0]  # contradiction, entailment, neutral
    devs = mnli.eval_splits(d, encoder, 16)
    assert [x.num_examples for x in devs] == [1, 2]
    assert [x.name for x in devs] == ["dev_matched.tsv", "dev_mismatched.tsv"]
    # MRPC trains on both orders; dev keeps one.
    write(f"{d}/mrpc/train.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
          "1\t1\t2\tgood film\tbad film\n0\t3\t4\tyes\tno\n")
    write(f"{d}/mrpc/dev.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\ta\tb\n")
    mrpc = get_task("MRPC", d)
    t = mrpc.train_split(d, encoder, 16)
    assert t.num_examples == 4 and t.arrays["label"].tolist() == [1, 0, 1, 0]
    # row 2 is row 0 swapped: "bad film" then "good film"
    assert t.arrays["input_ids"][2][:7].tolist() == [101, 2919, 2143, 102, 2204, 2143, 102]
    assert mrpc.eval_splits(d, encoder, 16)[0].num_examples == 1
    # STS-B: regression on score / 5; CoLA: no header, label in column 1, text in 3.
    write(f"{d}/STS-B/train.tsv", "index\tsentence1\tsentence2\tscore\n0\ta\tb\t3.8\n")
    assert get_task("sts-b", d).train_split(d, encoder, 8).arrays["label"][0] == \
        pytest.approx(0.76)
    write(f"{d}/CoLA/train.tsv", "gj04\t1\t\tthe book is red .\ngj04\t0\t*\tbook the red .\n")
    cola = get_task("cola", d).train_split(d, encoder, 8)
    assert cola.arrays["label"].tolist() == [1, 0]
    assert sorted(GLUE) == ["cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb"]


def test_malformed_tsv_names_file_and_line(tmp_path, encoder):
    d = str(tmp_path)
    write(f"{d}/SST-2/train.tsv", "sentence\tlabel\ngood\t1\n\nmissing a column\nbad\t0\n")
    task = get_task("sst2", d)
    with pytest.raises(DataError, match=r"SST-2/train.tsv:4: expected at least 2 "
                       r"tab-separated columns, found 1"):
        task.train_split(d, encoder, 8)
    write(f"{d}/SST-2/train.tsv", "sentence\tlabel\ngood\t1\nbad\tpositive\n")
    with pytest.raises(DataError, match=r"train.tsv:3: label 'positive' is not one of 0, 1"):
        task.train_split(d, encoder, 8)
    write(f"{d}/SST-2/train.tsv", "text\tlabel\ngood\t1\n")
    with pytest.raises(DataError, match=r"train.tsv:1: header has no column 'sentence'"):
        task.train_split(d, encoder, 8)
    with open(f"{d}/SST-2/train.tsv", "wb") as f:
        f.write(b"sentence\tlabel\nok\t1\nbad \xe9\t0\n")
    with pytest.raises(DataError, match=r"train.tsv:3: not valid UTF-8 \(byte 0xe9 at col"):
        read_tsv(f"{d}/SST-2/train.tsv")
    with open(f"{d}/SST-2/train.tsv", "wb") as f:  # the BOM is not part of line 1
        f.write(b"\xef\xbb\xbfsentence\tlabel\n \xa0\t1\n")
    with pytest.raises(DataError, match=r"train.tsv:2: not valid UTF-8 \(byte 0xa0 at col"):
        read_tsv(f"{d}/SST-2/train.tsv")
    with open(f"{d}/SST-2/train.tsv", "wb") as f:  # only ASCII blanks make a blank line
        f.write("\ufeffsentence\tlabel\r\n \t\r\n\u00a0\t1\n".encode())
    assert read_tsv(f"{d}/SST-2/train.tsv") == [(1, ["sentence", "label"]),
                                                (3, ["\u00a0", "1"])]
    with pytest.raises(DataError, match="is not a known task"):
        get_task("nosuch", d)


def test_pad_rows_and_median():
    arrays = {"x": np.arange(5), "weight": np.ones(5, np.float32)}
    padded = pad_rows(arrays, 4)
    assert padded["x"].tolist() == [0, 1, 2, 3, 4, 0, 0, 0]
    assert padded["weight"].tolist() == [1, 1, 1, 1, 1, 0, 0, 0]
    assert median_trial([0.7, 0.9, 0.8]) == 2
    assert median_trial([0.5, 0.9, 0.8, 0.6]) == 3  # lower median


# ----------------------------------------------------------------------------- a run

WORDS_POS = ["good", "great", "fine", "nice", "superb"]
WORDS_NEG = ["bad", "awful", "poor", "dull", "weak"]
FILLER = ["the", "film", "was", "a", "story", "plot", "and", "very", "quite", "it"]


def synthetic_polarity(rng, n):
    rows = []
    for _ in range(n):
        label = int(rng.integers(2))
        words = list(rng.choice(FILLER, size=int(rng.integers(3, 8))))
        words.insert(int(rng.integers(len(words) + 1)),
                     str(rng.choice(WORDS_POS if label else WORDS_NEG)))
        rows.append(f"{' '.join(words)}\t{label}")
    return "sentence\tlabel\n" + "\n".join(rows) + "\n"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("ft"))
    rng = np.random.default_rng(0)
    write(f"{d}/data/toy/train.tsv", synthetic_polarity(rng, 256))
    write(f"{d}/data/toy/dev.tsv", synthetic_polarity(rng, 64))
    task = get_task("toy", f"{d}/data", ["sentence"], "label")
    cfg = apply_overrides(FinetuneConfig(), dict(learning_rate=2e-3, layerwise_lr_decay=0.8,
                                                 num_train_epochs=6, train_batch_size=16,
                                                 eval_batch_size=16, max_seq_length=16,
                                                 num_trials=2, steps_per_loop=24,
                                                 save_checkpoints_steps=50))
    options = FinetuneOptions(data_dir=f"{d}/data", model_dir=f"{d}/model",
                         export_dir=f"{d}/export", vocab_file=VOCAB, strategy="cpu")
    results = run(task, TINY, cfg, options)
    return d, task, cfg, options, results


@pytest.mark.every_leg
@pytest.mark.e2e
def test_run_learns_and_writes_results(trained):
    d, task, cfg, options, results = trained
    assert task.labels == ("0", "1")
    assert results["num_train_steps"] == 96  # 256 * 6 / 16
    assert len(results["scores"]) == 2
    assert min(results["scores"]) >= 0.9, results["scores"]
    assert results["median"] == pytest.approx(np.median(results["scores"]))
    with open(f"{d}/model/results.json") as f:
        saved = json.load(f)
    assert saved["scores"] == results["scores"] and saved["metric"] == "accuracy"
    assert [t["seed"] for t in saved["trials"]] == [1, 2]
    for trial in (0, 1):
        assert tf.train.latest_checkpoint(f"{d}/model/trial_{trial}").endswith("ckpt-96")
    # A rerun finds both trials done and trains nothing.
    again = run(task, TINY, cfg, dataclasses.replace(options, export_dir=None))
    assert again["scores"] == results["scores"]


@pytest.mark.e2e
def test_a_later_trial_reuses_the_compiled_step_and_equals_a_fresh_run(trained, tmp_path):
    """The run's trial 1 (seed 2) trained on trial 0's trainer, reinitialized; alone, on a
    fresh trainer, the same seed gives the same metrics and the same weights, bit for bit."""
    d, task, cfg, options, results = trained
    alone = run(task, TINY, apply_overrides(cfg, dict(seed=2, num_trials=1)),
                dataclasses.replace(options, model_dir=str(tmp_path / "model"),
                                    export_dir=None))
    assert alone["trials"][0] == results["trials"][1]
    ours = tf.train.load_checkpoint(f"{d}/model/trial_1")
    fresh = tf.train.load_checkpoint(str(tmp_path / "model" / "trial_0"))
    names = [n for n in ours.get_variable_to_shape_map() if "OPTIMIZER" not in n
             and n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    assert len(names) > 10
    for name in names:
        np.testing.assert_array_equal(ours.get_tensor(name), fresh.get_tensor(name), name)


@pytest.mark.e2e
def test_reinitialize_draws_a_fresh_trainers_state_and_keeps_one_trace(trained, tmp_path):
    from electra_tf.finetune.trainer import train_trial
    d, task, cfg, options, results = trained
    strategy = tf.distribute.get_strategy()
    train = task.train_split(f"{d}/data", TextEncoder(VOCAB), cfg.train.max_seq_length)
    small = apply_overrides(cfg, dict(steps_per_loop=4, save_checkpoints_steps=8))
    ft = tf_finetuner(task, TINY, small, strategy, 8, None, 1)
    train_trial(ft, train, str(tmp_path / "a"), 1)
    assert int(ft.global_step.numpy()) == 8 and ft.trace_count == 1
    ft.reinitialize(5)
    other = tf_finetuner(task, TINY, small, strategy, 8, None, 5)
    assert len(ft.model.weights) == len(other.model.weights) > 10
    for mine, theirs in zip(ft.model.weights, other.model.weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy(), mine.path)
    for slot in ft.optimizer.slot_variables().values():
        assert not np.any(slot.numpy())
    assert [int(v.numpy()) for v in (ft.global_step, ft.data_batches, ft.good_steps)] == [0] * 3
    assert ft.base_seed.numpy().tolist() == other.base_seed.numpy().tolist() == [5, 0xF17E]
    train_trial(ft, train, str(tmp_path / "b"), 5)
    train_trial(other, train, str(tmp_path / "c"), 5)
    assert ft.trace_count == 1  # the second trial ran on the first one's trace
    for mine, theirs in zip(ft.model.weights, other.model.weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy(), mine.path)


@pytest.mark.e2e
def test_predict_runs_a_short_last_batch_on_one_trace(trained):
    """Without XLA on one replica the last batch is not padded: 9 rows at batch 4 take
    batches of 4, 4, 1 on a single trace, and give the padded path's outputs."""
    d, task, cfg, options, results = trained
    strategy = tf.distribute.get_strategy()
    dev = task.eval_splits(f"{d}/data", TextEncoder(VOCAB), cfg.train.max_seq_length)[0]
    rows = {k: v[:9] for k, v in dev.arrays.items()}
    data = dataclasses.replace(dev, arrays=rows, num_examples=9)
    small = apply_overrides(cfg, dict(eval_batch_size=4))
    ft = tf_finetuner(task, TINY, small, strategy, 8, None, 1)
    assert not ft.jit_compile
    short = predict(ft, data)
    full = predict(ft, dataclasses.replace(data, arrays=pad_rows(rows, 4), num_examples=12))
    assert ft.predict_step.experimental_get_tracing_count() == 1
    assert set(short) == set(full) and {len(v) for v in short.values()} == {9}
    for k in short:
        np.testing.assert_allclose(short[k], full[k][:9], rtol=1e-5, atol=1e-6, err_msg=k)


REQUESTS = ["the film was good", "", "awful " * 200, "very \udcff poor plot".encode(
    "utf-8", "surrogateescape"), "it was nice and quite superb"]


def _in_memory_answers(trained):
    d, task, cfg, options, results = trained
    ft = tf_finetuner(task, TINY, cfg, tf.distribute.get_strategy(), 96, None, 1)
    best = results["median_trial"]
    ft.restore(tf.train.latest_checkpoint(f"{d}/model/trial_{best}"))
    server = export_lib.TaskServer(task, ft.model, TextEncoder(VOCAB),
                                   cfg.train.max_seq_length)
    return server.serve_text(sentence=tf.constant(REQUESTS, tf.string))


@pytest.mark.every_leg
@pytest.mark.subprocess
@pytest.mark.e2e
def test_export_serves_raw_text_like_the_model_in_a_fresh_process(trained):
    d, task, cfg, options, results = trained
    path = results["export"]["task"]
    assert os.path.exists(os.path.join(path, "saved_model.pb"))
    assert open(os.path.join(path, "assets.extra_labels.txt")).read() == "0\n1\n"
    code = f"""
import json, sys, tensorflow as tf, tensorflow_text  # the client's only extra import
m = tf.saved_model.load({path!r})
reqs = {REQUESTS!r}
out = m.signatures["serving_default"](sentence=tf.constant(reqs, tf.string))
print(json.dumps({{k: v.numpy().tolist() for k, v in out.items() if k != "label"}}))
"""
    proc = forked_cli.run(["-c", code], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    served = json.loads(proc.stdout.strip().splitlines()[-1])
    mine = _in_memory_answers(trained)
    np.testing.assert_allclose(served["probabilities"], mine["probabilities"].numpy(),
                               atol=1e-6)
    assert served["label_id"] == mine["label_id"].numpy().tolist()
    probs = np.array(served["probabilities"])
    assert probs.shape == (5, 2) and np.allclose(probs.sum(1), 1.0, atol=1e-6)
    # The model learnt the toy task: positive words -> 1, negative -> 0.
    assert served["label_id"][0] == 1 and served["label_id"][2] == 0
    assert served["label_id"][3] == 0 and served["label_id"][4] == 1


@pytest.mark.subprocess
@pytest.mark.e2e
def test_export_signatures_and_bad_requests(trained):
    d, task, cfg, options, results = trained
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    proc = subprocess.run([cli, "show", "--dir", results["export"]["task"], "--all"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("signature_def['serving_default']", "signature_def['serve_token_ids']",
                 "inputs['sentence']", "outputs['probabilities']", "inputs['input_ids']"):
        assert name in proc.stdout
    # `run` needs the tensorflow-text ops: our wrapper registers them.
    proc = forked_cli.run(["-m", "electra_tf.conversion.saved_model_cli", "run",
                           "--dir", results["export"]["task"], "--tag_set", "serve",
                           "--signature_def", "serving_default", "--input_exprs",
                           "sentence=['a great story', 'the plot was dull']"],
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Result for output key label_id:\n[1 0]" in proc.stdout, proc.stdout
    loaded = tf.saved_model.load(results["export"]["task"])
    ids = loaded.signatures["serve_token_ids"](
        input_ids=tf.constant([[101, 2204, 102] + [0] * 13], tf.int32),
        input_mask=tf.constant([[1] * 3 + [0] * 13], tf.int32),
        segment_ids=tf.zeros([1, 16], tf.int32))
    text = loaded.signatures["serving_default"](sentence=tf.constant(["good"]))
    np.testing.assert_allclose(ids["probabilities"].numpy(), text["probabilities"].numpy(),
                               atol=1e-6)
    empty = loaded.signatures["serving_default"](sentence=tf.constant([], tf.string))
    assert empty["probabilities"].shape == (0, 2)
    enc = tf.saved_model.load(results["export"]["encoder"])
    out = enc.signatures["serving_default"](text=tf.constant(["good", "a much longer text"]))
    assert out["sequence_output"].shape == (2, 16, 32)
    assert out["input_mask"].numpy().sum(1).tolist() == [3, 6]


def no_local_ram_entry(root):
    """No local file or folder named after a ram:// path (`ram:`) under `root`."""
    return not [p for p in root.rglob("*") if p.name.startswith("ram:")]


@pytest.mark.e2e
def test_run_with_every_path_in_ram(tmp_path, monkeypatch):
    """Task data (GLUE's SST-2 layout with a test set), vocabulary, the init checkpoint and
    the pre-training config.json beside it and model_dir all on TensorFlow's in-memory
    filesystem: the same scores and predictions as the same run on local files,
    results.json and checkpoints there, nothing written locally. (No XLA: it is the
    files under test, and compiling would double the time.)"""
    from electra_tf import fileio
    from electra_tf.conversion import formats
    from electra_tf.finetune.cli import find_config
    from electra_tf.training.checkpoints import save_tf1_checkpoint
    from electra_tf.model.modeling import build_discriminator_encoder
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(3)
    files = {"SST-2/train.tsv": synthetic_polarity(rng, 64),
             "SST-2/dev.tsv": synthetic_polarity(rng, 32),
             "SST-2/test.tsv": "index\tsentence\n4\tthe film was good\n9\tawful , dull\n"}
    tf.keras.utils.set_random_seed(11)
    pretrained = build_discriminator_encoder(TINY)
    cfg = apply_overrides(FinetuneConfig(), dict(learning_rate=2e-3, layerwise_lr_decay=0.8,
                                                 num_train_epochs=2, train_batch_size=16,
                                                 eval_batch_size=16, max_seq_length=16,
                                                 steps_per_loop=4, save_checkpoints_steps=4))
    root = f"ram://ft_{uuid.uuid4().hex}"
    results, predictions = {}, {}
    try:
        for where, base in (("local", str(tmp_path / "local")), ("ram", root)):
            fileio.makedirs(fileio.join(base, "data", "SST-2"))
            for name, text in files.items():
                fileio.write_atomic(fileio.join(base, "data", name), text)
            fileio.copy(os.path.join(REPO, VOCAB), fileio.join(base, "vocab.txt"))
            fileio.makedirs(fileio.join(base, "pre"))
            fileio.write_json_atomic(fileio.join(base, "pre", "config.json"),
                                     formats.pretraining_config(TINY).to_json())
            init = save_tf1_checkpoint(pretrained, fileio.join(base, "pre", "discriminator",
                                                               "model.ckpt"))
            assert find_config(init, None) == TINY  # the config.json two levels up
            data = fileio.join(base, "data")
            options = FinetuneOptions(data_dir=data, model_dir=fileio.join(base, "model"),
                                 init_checkpoint=init, vocab_file=fileio.join(base, "vocab.txt"),
                                 strategy="cpu", jit_compile=False, do_predict=True)
            results[where] = run(get_task("sst2", data), TINY, cfg, options)
            predictions[where] = fileio.read_text(results[where]["predictions"]["SST-2"])
        ram = results["ram"]
        assert ram["scores"] == results["local"]["scores"] and ram["num_train_steps"] == 8
        saved = fileio.read_json(f"{root}/model/results.json")
        assert saved["scores"] == ram["scores"] and saved["metric"] == "accuracy"
        assert saved["init_checkpoint"] == f"{root}/pre/discriminator/model.ckpt"
        assert fileio.read_json(f"{root}/model/trial_0/result.json")["accuracy"] == \
            ram["scores"][0]
        assert tf.train.latest_checkpoint(f"{root}/model/trial_0") == \
            f"{root}/model/trial_0/ckpt-8"
        assert ram["predictions"] == {"SST-2": f"{root}/model/predictions/SST-2.tsv"}
        assert predictions["ram"] == predictions["local"]
        assert [l.split("\t")[0] for l in predictions["ram"].splitlines()] == \
            ["index", "4", "9"]
        assert no_local_ram_entry(tmp_path)
    finally:
        forget(root)


@pytest.mark.e2e
def test_export_to_ram_serves_like_the_local_export(trained, tmp_path, monkeypatch):
    """The median trial exported to ram:// (staged locally, copied with saved_model.pb
    last) with its vocabulary read from ram://: complete, and it answers as the local
    export of the same trial does."""
    from electra_tf import fileio
    d, task, cfg, options, results = trained
    monkeypatch.chdir(tmp_path)
    root = f"ram://export_{uuid.uuid4().hex}"
    try:
        fileio.copy(os.path.join(REPO, VOCAB), f"{root}/vocab.txt")
        ft = tf_finetuner(task, TINY, cfg, tf.distribute.get_strategy(), 96, None, 1)
        ft.restore(tf.train.latest_checkpoint(
            f"{d}/model/trial_{results['median_trial']}"))
        paths = export_lib.export(task, ft.model, TextEncoder(f"{root}/vocab.txt"),
                                  cfg.train.max_seq_length, f"{root}/export", version=7)
        assert paths == {"task": f"{root}/export/toy/7", "encoder": f"{root}/export/encoder/7"}
        assert fileio.read_text(f"{root}/export/toy/7/assets.extra_labels.txt") == "0\n1\n"
        assert fileio.read_bytes(f"{root}/export/toy/7/assets/vocab.txt") == \
            fileio.read_bytes(os.path.join(REPO, VOCAB))
        assert not [p for p in fileio.walk_files(root) if p.endswith(fileio.TMP_SUFFIX)]
        mine = tf.saved_model.load(paths["task"]).signatures["serving_default"]
        local = tf.saved_model.load(results["export"]["task"]).signatures["serving_default"]
        requests = tf.constant(REQUESTS, tf.string)
        got, want = mine(sentence=requests), local(sentence=requests)
        np.testing.assert_array_equal(got["probabilities"].numpy(),
                                      want["probabilities"].numpy())
        assert got["label"].numpy().tolist() == want["label"].numpy().tolist()
        enc = tf.saved_model.load(paths["encoder"]).signatures["serving_default"]
        assert enc(text=tf.constant(["good"]))["sequence_output"].shape == (1, 16, 32)
        assert no_local_ram_entry(tmp_path)
    finally:
        forget(root)


@pytest.mark.subprocess
def test_cli_bad_flags_one_line(tmp_path):
    # (A bad --init_checkpoint is tested in test_finetune_model; each process costs ~7 s.)
    cases = [(["--task", "nosuch", "--init_checkpoint", "none"], "is not a known task")]
    for args, message in cases:
        proc = forked_cli.run([os.path.join(REPO, "run_finetuning.py"),
                               "--model_dir", str(tmp_path / "m"), "--config", "tiny"] + args,
                              timeout=300, cwd=REPO)
        assert proc.returncode == 1, proc.stderr[-2000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("run_finetuning: error:") and message in last, last


# ----------------------------------------------------------------------------- strategies

NO_DROPOUT = dataclasses.replace(TINY, hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0)
STEP_CFG = apply_overrides(FinetuneConfig(), dict(
    learning_rate=1e-3, layerwise_lr_decay=0.8, num_train_epochs=1, train_batch_size=16,
    eval_batch_size=16, max_seq_length=16, warmup_proportion=0.0, steps_per_loop=10))


def toy_batch(directory, n=16, seed=0):
    """A toy polarity task in `directory` and its first `n` training rows as one batch."""
    write(os.path.join(directory, "toy", "train.tsv"),
          synthetic_polarity(np.random.default_rng(seed), n))
    task = get_task("toy", directory, ["sentence"], "label")
    data = task.train_split(directory, TextEncoder(os.path.join(REPO, VOCAB)),
                            STEP_CFG.train.max_seq_length)
    assert data.num_examples == n
    return task, {k: v[:n] for k, v in data.arrays.items()}


def run_steps(finetuner, batch, n):
    """n steps of the real host loop on the same global batch -> (mean loss, skipped)."""
    ds = finetuner.strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(batch).repeat())
    out = finetuner.make_train_loop()(iter(ds), tf.constant(n))
    return float(out["loss_sum"]) / n, int(round(float(out["skipped"])))


# ----------------------------------------------------------------------------- replicas

REPLICA_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    sys.path.insert(0, {tests!r})
    from electra_tf.training.tf_runtime.trainer import default_jit
    from runtimes import tf_finetuner
    from test_finetune_trainer import STEP_CFG, NO_DROPOUT, run_steps, toy_batch
    task, batch = toy_batch({data!r})
    one = tf_finetuner(task, NO_DROPOUT, STEP_CFG, tf.distribute.OneDeviceStrategy("/cpu:0"),
                    10, None, 1, jit_compile=False)
    weights = one.model.get_weights()
    loss_one, _ = run_steps(one, batch, 1)
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    # jit_compile=None: the TensorFlow runtime's default, which is no XLA for Mirrored over CPUs.
    two = tf_finetuner(task, NO_DROPOUT, STEP_CFG, mirrored, 10, None, 2)
    two.model.set_weights(weights)
    loss_two, skipped = run_steps(two, batch, 1)
    diff = max(float(np.max(np.abs(a - b))) for a, b in
               zip(one.model.get_weights(), two.model.get_weights()))
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(weights, one.model.get_weights()))
    print(json.dumps({{"diff": diff, "moved": moved, "loss_one": loss_one,
                      "loss_two": loss_two, "skipped": skipped,
                      "steps": [int(one.global_step.numpy()), int(two.global_step.numpy())],
                      "replicas": mirrored.num_replicas_in_sync,
                      "default_jit": default_jit(mirrored)}}))
""")


@pytest.mark.subprocess
def test_two_replicas_equal_one_device(tmp_path):
    """One fine-tuning step under MirroredStrategy on 2 logical CPUs (8 rows each) == one
    step on one device with the same global batch of 16 and the same weights (dropout off;
    the loss is divided by the global batch, gradients are summed over replicas)."""
    code = REPLICA_SCRIPT.format(tests=os.path.join(REPO, "tests"), data=str(tmp_path))
    done = forked_cli.run(["-c", code], cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2
    assert result["default_jit"] is False
    assert result["steps"] == [1, 1] and result["skipped"] == 0
    assert result["loss_one"] == pytest.approx(np.log(2), abs=0.2)
    assert result["loss_two"] == pytest.approx(result["loss_one"], rel=1e-5)
    assert result["moved"] > 1e-4  # the step changed the weights
    assert result["diff"] < 1e-5, result


# ----------------------------------------------------------------------------- bfloat16

@pytest.fixture
def precision():
    """Sets a run precision (the global Keras policy) and restores float32 afterwards."""
    from electra_tf.training import runtime
    yield runtime.set_precision
    runtime.set_precision("float32")


@pytest.mark.slow
def test_bfloat16_finetuning(tmp_path, precision):
    task, batch = toy_batch(str(tmp_path))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    reference = tf_finetuner(task, NO_DROPOUT, STEP_CFG, strategy, 10, None, 1)
    weights = reference.model.get_weights()
    want, _ = run_steps(reference, batch, 1)
    precision("bfloat16")
    ft = tf_finetuner(task, NO_DROPOUT, STEP_CFG, strategy, 10, None, 1)
    assert ft.model.electra.blocks[0].query.compute_dtype == "bfloat16"
    assert ft.model.head.classifier.compute_dtype == "bfloat16"
    assert ft.model.head.compute_dtype == "bfloat16"
    assert all(v.dtype == tf.float32 for v in ft.variables)
    assert all(v.dtype == tf.float32 for v in ft.optimizer.variables
               if v.dtype.is_floating)
    ft.model.set_weights(weights)
    logits = ft.model(batch, training=False)["logits"]
    assert logits.dtype == tf.float32 and logits.shape == (16, 2)
    first, skipped_first = run_steps(ft, batch, 1)
    assert first == pytest.approx(want, rel=0.03)
    rest, skipped_rest = run_steps(ft, batch, 5)
    assert skipped_first == skipped_rest == 0
    assert int(ft.global_step.numpy()) == 6
    assert all(v.dtype == tf.float32 for v in ft.variables)
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(weights, ft.model.get_weights()))
    assert moved > 1e-4
    assert rest < first
    # Evaluation after training: the loss on the fixed batch fell below the initial one.
    assert ft.job.task.loss(ft.model(batch, training=False), batch).numpy().mean() < first


# ----------------------------------------------------------------------------- SIGTERM

@pytest.mark.subprocess
@pytest.mark.e2e
def test_sigterm_saves_a_checkpoint_and_the_rerun_resumes(tmp_path):
    data = str(tmp_path / "data")
    rng = np.random.default_rng(1)
    write(f"{data}/toy/train.tsv", synthetic_polarity(rng, 64))
    write(f"{data}/toy/dev.tsv", synthetic_polarity(rng, 16))
    config = tmp_path / "tiny_model.json"
    # A pre-training config file: its model section is the fine-tuned model's size.
    config.write_text(json.dumps({"model": dataclasses.asdict(TINY),
                                  "train": {"max_seq_length": 16}}))
    model_dir = tmp_path / "model"
    # 64 examples x 12 epochs / batch 8 = 96 steps, a loop (and a checkpoint) every 4.
    args = [sys.executable, "run_finetuning.py", "--task=toy", f"--data_dir={data}",
            "--text_columns=sentence", "--label_column=label", "--init_checkpoint=none",
            f"--config={config}", f"--model_dir={model_dir}", "--max_seq_length=16",
            "--train_batch_size=8", "--eval_batch_size=8", "--num_train_epochs=12",
            "--save_checkpoints_steps=4", "--learning_rate=1e-3", "--strategy=cpu"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = forked_cli.start(args[1:], cwd=REPO, stderr=forked_cli.PIPE, env=env)
    seen, rest = sigterm_after(proc, " step 4/96 ")
    assert proc.returncode == PREEMPTED_EXIT_CODE == 75, (seen + rest)[-3000:]
    last = rest.strip().splitlines()[-1]
    assert last.startswith("run_finetuning: SIGTERM at step ") and "rerun" in last, last
    step = int(last.split("SIGTERM at step ")[1].split(" ")[0])
    assert 4 <= step < 96
    trial_dir = str(model_dir / "trial_0")
    saved = tf.train.latest_checkpoint(trial_dir)
    assert saved.endswith(f"ckpt-{step}") and saved in last, (saved, last)
    assert not (model_dir / "results.json").exists()
    assert not (model_dir / "trial_0" / "result.json").exists()

    done = forked_cli.run(args[1:], cwd=REPO, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Resumed from {saved} (step {step})" in done.stderr, done.stderr[-3000:]
    steps = [int(x.split(" step ")[1].split("/")[0]) for x in done.stderr.splitlines()
             if " step " in x and "/96 |" in x]
    assert steps and steps[0] > step and steps[-1] == 96, steps
    assert tf.train.latest_checkpoint(trial_dir).endswith("ckpt-96")
    with open(model_dir / "results.json") as f:
        results = json.load(f)
    assert results["num_train_steps"] == 96 and len(results["scores"]) == 1
    assert 0.0 <= results["scores"][0] <= 1.0


def test_float16_finetuning_scales_the_loss(tmp_path, precision):
    """float16 starts at a loss scale of 2^15 and trains; an overflowing step is skipped
    (weights untouched, step not counted) and halves the scale; the scale is checkpointed."""
    task, batch = toy_batch(str(tmp_path))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    precision("float16")
    ft = tf_finetuner(task, NO_DROPOUT, STEP_CFG, strategy, 10, None, 1)
    assert ft.model.electra.blocks[0].query.compute_dtype == "float16"
    assert float(ft.loss_scale.numpy()) == 2.0 ** 15
    first, skipped = run_steps(ft, batch, 3)
    assert skipped == 0 and int(ft.global_step.numpy()) == 3
    assert np.isfinite(first) and first == pytest.approx(np.log(2), abs=0.2)
    ft.loss_scale.assign(3e38)  # the scaled loss overflows: non-finite gradients
    before = [v.numpy().copy() for v in ft.variables]
    _, skipped = run_steps(ft, batch, 1)
    assert skipped == 1 and int(ft.global_step.numpy()) == 3
    assert float(ft.loss_scale.numpy()) == pytest.approx(1.5e38)
    assert all(np.array_equal(b, v.numpy()) for b, v in zip(before, ft.variables))
    names = dict(tf.train.list_variables(ft.checkpoint().write(str(tmp_path / "ck"))))
    assert any(n.startswith("loss_scale/") for n in names)


@pytest.mark.e2e
def test_resumed_trial_continues_at_its_data_position_after_skipped_steps(
        tmp_path, precision, monkeypatch):
    """float16 steps skipped for overflow consume batches without counting steps; the
    trial's checkpoint records the batches consumed, so a trial stopped at its first
    checkpoint and resumed ends with the weights of one trained straight through."""
    from electra_tf.finetune import trainer
    from electra_tf.training import loop
    data_dir = str(tmp_path / "data")
    write(f"{data_dir}/toy/train.tsv", synthetic_polarity(np.random.default_rng(3), 64))
    task = get_task("toy", data_dir, ["sentence"], "label")
    data = task.train_split(data_dir, TextEncoder(os.path.join(REPO, VOCAB)), 16)
    cfg = apply_overrides(STEP_CFG, dict(train_batch_size=8, steps_per_loop=2,
                                         save_checkpoints_steps=4))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    precision("float16")

    def trial(trial_dir):
        ft = tf_finetuner(task, NO_DROPOUT, cfg, strategy, 8, None, 1, jit_compile=False)
        ft.loss_scale.assign(2.0 ** 40)  # the first steps overflow (restored on resume)
        trainer.train_trial(ft, data, str(trial_dir), seed=5)
        return ft

    straight = trial(tmp_path / "straight")
    skipped = int(straight.data_batches.numpy()) - 8
    assert int(straight.global_step.numpy()) == 8 and skipped >= 1

    real_save = loop.save_checkpoint

    def save_then_crash(manager, step):
        path = real_save(manager, step)
        raise KeyboardInterrupt(f"simulated crash after {path}")

    monkeypatch.setattr(loop, "save_checkpoint", save_then_crash)
    with pytest.raises(KeyboardInterrupt, match="ckpt-4"):
        trial(tmp_path / "resumed")
    monkeypatch.setattr(loop, "save_checkpoint", real_save)
    first = tf.train.load_checkpoint(str(tmp_path / "resumed"))
    assert first.get_tensor("data_batches/.ATTRIBUTES/VARIABLE_VALUE") == 4 + skipped
    resumed = trial(tmp_path / "resumed")
    assert int(resumed.data_batches.numpy()) == 8 + skipped
    for a, b in zip(straight.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- predictions

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


PREDICT_CFG = apply_overrides(FinetuneConfig(), dict(
    learning_rate=1e-3, num_train_epochs=1, train_batch_size=8, eval_batch_size=8,
    max_seq_length=16, steps_per_loop=4))


@pytest.mark.e2e
def test_mnli_run_writes_median_trial_predictions(glue_dir, encoder, tmp_path):
    task = get_task("mnli", glue_dir)
    cfg = apply_overrides(PREDICT_CFG, {"num_trials": 2})
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
    ft = tf_finetuner(task, TINY, cfg.resolved(TINY, task), tf.distribute.get_strategy(),
                   results["num_train_steps"], None, 1, jit_compile=False)
    ft.restore(tf.train.latest_checkpoint(os.path.join(model_dir, f"trial_{best}")))
    for data, (_, _, _, rows) in zip(task.test_splits(glue_dir, encoder, 16), TESTS["mnli"]):
        got = _read(os.path.join(out, f"{data.name}.tsv"))
        assert [r[0] for r in got] == [r[0] for r in rows]
        assert all(r[1] in ("entailment", "neutral", "contradiction") for r in got)
        want = np.argmax(predict(ft, data)["logits"], -1)
        assert [r[1] for r in got] == [task.labels[i] for i in want]


@pytest.mark.e2e
def test_stsb_run_writes_scores(glue_dir, tmp_path):
    task = get_task("stsb", glue_dir)
    model_dir = str(tmp_path / "stsb")
    options = FinetuneOptions(data_dir=glue_dir, model_dir=model_dir, vocab_file=VOCAB,
                              strategy="cpu", jit_compile=False, do_predict=True)
    results = run(task, TINY, PREDICT_CFG, options)
    rows = _read(results["predictions"]["STS-B"])
    assert results["predictions"]["STS-B"] == os.path.join(model_dir, "predictions",
                                                           "STS-B.tsv")
    assert [r[0] for r in rows] == ["0", "1", "2"]
    scores = [float(r[1]) for r in rows]
    assert all(0.0 <= s <= 5.0 for s in scores) and all("." in r[1] for r in rows)


def test_write_predictions_replaces_atomically(glue_dir, encoder, tmp_path):
    from electra_tf.finetune.trainer import write_predictions

    class Fixed:  # a runtime that predicts class 1 for every row
        job = types.SimpleNamespace(cfg=FinetuneConfig())

        def predict(self, arrays, batch_size):
            return {"logits": np.tile([[0.0, 1.0]], [len(arrays["weight"]), 1])}

    task = get_task("sst2", glue_dir)
    (data,) = task.test_splits(glue_dir, encoder, 16)
    out = str(tmp_path / "p")
    write(os.path.join(out, "SST-2.tsv"), "stale\n")
    paths = write_predictions(task, Fixed(), [data], out)
    assert _read(paths["SST-2"]) == [["0", "1"], ["1", "1"], ["2", "1"]]
    assert os.listdir(out) == ["SST-2.tsv"]
