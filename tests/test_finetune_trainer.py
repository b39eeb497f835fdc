"""Fine-tuning runs end to end: GLUE layouts, training, trials, export and serving, CLI."""

import json
import os
import subprocess
import sys
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
from electra_tf.finetune.trainer import FinetuneConfig, median_trial, pad_rows, run
from ram_paths import forget

from conftest import REPO, finetune_tiny_model, write

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
    with pytest.raises(DataError, match=r"train.tsv:3: not valid UTF-8"):
        read_tsv(f"{d}/SST-2/train.tsv")
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
    again = run(task, TINY, cfg, dataclasses_replace(options, export_dir=None))
    assert again["scores"] == results["scores"]


def test_a_later_trial_reuses_the_compiled_step_and_equals_a_fresh_run(trained, tmp_path):
    """The run's trial 1 (seed 2) trained on trial 0's trainer, reinitialized; alone, on a
    fresh trainer, the same seed gives the same metrics and the same weights, bit for bit."""
    d, task, cfg, options, results = trained
    alone = run(task, TINY, apply_overrides(cfg, dict(seed=2, num_trials=1)),
                dataclasses_replace(options, model_dir=str(tmp_path / "model"),
                                    export_dir=None))
    assert alone["trials"][0] == results["trials"][1]
    ours = tf.train.load_checkpoint(f"{d}/model/trial_1")
    fresh = tf.train.load_checkpoint(str(tmp_path / "model" / "trial_0"))
    names = [n for n in ours.get_variable_to_shape_map() if "OPTIMIZER" not in n
             and n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    assert len(names) > 10
    for name in names:
        np.testing.assert_array_equal(ours.get_tensor(name), fresh.get_tensor(name), name)


def test_reinitialize_draws_a_fresh_trainers_state_and_keeps_one_trace(trained, tmp_path):
    from electra_tf.finetune.trainer import Finetuner, train_trial
    d, task, cfg, options, results = trained
    strategy = tf.distribute.get_strategy()
    train = task.train_split(f"{d}/data", TextEncoder(VOCAB), cfg.train.max_seq_length)
    small = apply_overrides(cfg, dict(steps_per_loop=4, save_checkpoints_steps=8))
    ft = Finetuner(task, TINY, small, strategy, 8, None, 1)
    train_trial(ft, train, str(tmp_path / "a"), 1)
    assert int(ft.global_step.numpy()) == 8 and ft.trace_count == 1
    ft.reinitialize(5)
    other = Finetuner(task, TINY, small, strategy, 8, None, 5)
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


def dataclasses_replace(obj, **kw):
    import dataclasses
    return dataclasses.replace(obj, **kw)


REQUESTS = ["the film was good", "", "awful " * 200, "very \udcff poor plot".encode(
    "utf-8", "surrogateescape"), "it was nice and quite superb"]


def _in_memory_answers(trained):
    d, task, cfg, options, results = trained
    from electra_tf.finetune.trainer import Finetuner
    ft = Finetuner(task, TINY, cfg, tf.distribute.get_strategy(), 96, None, 1)
    best = results["median_trial"]
    ft.restore(tf.train.latest_checkpoint(f"{d}/model/trial_{best}"))
    server = export_lib.TaskServer(task, ft.model, TextEncoder(VOCAB),
                                   cfg.train.max_seq_length)
    return server.serve_text(sentence=tf.constant(REQUESTS, tf.string))


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
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
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
    proc = subprocess.run([sys.executable, "-m", "electra_tf.conversion.saved_model_cli", "run",
                           "--dir", results["export"]["task"], "--tag_set", "serve",
                           "--signature_def", "serving_default", "--input_exprs",
                           "sentence=['a great story', 'the plot was dull']"],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
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


def test_export_to_ram_serves_like_the_local_export(trained, tmp_path, monkeypatch):
    """The median trial exported to ram:// (staged locally, copied with saved_model.pb
    last) with its vocabulary read from ram://: complete, and it answers as the local
    export of the same trial does."""
    from electra_tf import fileio
    from electra_tf.finetune.trainer import Finetuner
    d, task, cfg, options, results = trained
    monkeypatch.chdir(tmp_path)
    root = f"ram://export_{uuid.uuid4().hex}"
    try:
        fileio.copy(os.path.join(REPO, VOCAB), f"{root}/vocab.txt")
        ft = Finetuner(task, TINY, cfg, tf.distribute.get_strategy(), 96, None, 1)
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


def test_cli_bad_flags_one_line(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    # (A bad --init_checkpoint is tested in test_finetune_model; each process costs ~7 s.)
    cases = [(["--task", "nosuch", "--init_checkpoint", str(tmp_path)], "is not a known task")]
    for args, message in cases:
        proc = subprocess.run([sys.executable, os.path.join(REPO, "run_finetuning.py"),
                               "--model_dir", str(tmp_path / "m"), "--config", "tiny"] + args,
                              capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
        assert proc.returncode == 1, proc.stderr[-2000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("run_finetuning: error:") and message in last, last
