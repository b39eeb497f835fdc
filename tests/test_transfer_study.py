"""experiments/transfer_study.py without training: its settings, the few-label sample, the
log parsing and the table."""

import os

import pytest

from conftest import write
from electra_tf import fileio
import experiment_scripts

ts = experiment_scripts.load("transfer_study")

PRETRAIN_LOG = """\
I1126 loop.py:316] step 1950/2000 | loss 24.4101 | mlm_loss 6.0363 mlm_acc 0.1739 | disc_loss 0.3675 disc_acc 0.8761 disc_auc 0.5609 replaced 0.126 | lr 2.5e-05 | 112.2 seq/s | ETA 0:00:14
I1126 loop.py:316] step 10/10 | loss 6.4846 | main_lm_loss 6.4844 main_lm_acc 0.1102 | lr 0 | 70.9 seq/s
I1126 loop.py:316] step 2000/2000 | loss 24.3969 | mlm_loss 6.0102 mlm_acc 0.1771 | disc_loss 0.3671 disc_acc 0.8766 disc_auc 0.5593 replaced 0.125 | lr 0 | 110.0 seq/s | ETA 0:00:00
"""

FINETUNE_LOG = """\
] step 100/157 | loss 0.6012 | lr 0.0001 | 250.0 seq/s | ETA 0:00:05
] step 157/157 | loss 0.4443 | lr 0 | 122.5 seq/s | ETA 0:00:00
] step 157/157 | loss 0.3192 | lr 0 | 251.8 seq/s | ETA 0:00:00
] step 50/157 | loss 0.7001 | lr 0.0002 | 251.8 seq/s | ETA 0:00:09
] step 157/157 | loss 0.0033 | lr 0 | 265.9 seq/s | ETA 0:00:00
"""


def test_every_setting_is_valid_and_none_comes_first():
    assert list(ts.SETTINGS)[0] == "none"
    for name, s in ts.SETTINGS.items():
        ts.check_setting(name, s)  # raises on a bad point or override


@pytest.mark.parametrize("setting, message", [
    (ts.Setting("movies", {}, 1000, [300, 500], "x"), "multiples of 300"),
    (ts.Setting("movies", {}, 1000, [500, 1500], "x"), "at most 1000"),
    (ts.Setting("movies", {"optimizer.no_such_knob": "1"}, 1000, [1000], "x"), "no_such_knob"),
    (ts.Setting(None, {}, 0, [100], "x"), r"points \[0\]"),
    (ts.Setting(None, {"optimizer.learning_rate": "1e-4"}, 0, [0], "x"), r"only model\.\*"),
    (ts.Setting("news", {}, 1000, [1000], "x", vocab=4096),
     "corpus 'news': expected one of movies, wiki, both, all"),
])
def test_a_bad_setting_is_refused_by_name(setting, message):
    with pytest.raises(ts.ExperimentError, match="bad: .*" + message):
        ts.check_setting("bad", setting)


def test_the_last_logged_step_gives_the_pretraining_metrics(tmp_path):
    write(str(tmp_path / "p.log"), PRETRAIN_LOG)
    assert ts.last_metrics(str(tmp_path / "p.log")) == {
        "step": 2000, "loss": 24.3969, "mlm_loss": 6.0102, "mlm_acc": 0.1771,
        "disc_loss": 0.3671, "disc_acc": 0.8766, "disc_auc": 0.5593}
    assert ts.last_metrics(str(tmp_path / "missing.log")) == {}
    assert ts.last_metrics(str(tmp_path / "p.log"), step=1950)["disc_auc"] == 0.5609
    assert ts.last_metrics(str(tmp_path / "p.log"), step=10) == {
        "step": 10, "loss": 6.4846, "main_lm_loss": 6.4844, "main_lm_acc": 0.1102}
    assert ts.last_metrics(str(tmp_path / "p.log"), step=7) == {}


def test_each_trials_final_training_loss_is_read(tmp_path):
    write(str(tmp_path / "f.log"), FINETUNE_LOG)
    assert ts.trial_losses(str(tmp_path / "f.log")) == [0.4443, 0.3192, 0.0033]


def _task(tmp_path, rows=20):
    data = tmp_path / "data"
    write(str(data / "polarity" / "train.tsv"),
          "sentence\tlabel\n" + "".join(f"line {i}\t{i % 2}\n" for i in range(rows)))
    write(str(data / "polarity" / "dev.tsv"), "sentence\tlabel\ndev one\t1\n")
    return data


def _args(tmp_path, data, **kw):
    return ts.parse_args([f"--data_dir={data}", f"--out_dir={tmp_path / 'out'}"] +
                         [f"--{k}={v}" for k, v in kw.items()])


def test_the_few_label_task_is_a_seeded_sample_with_the_whole_dev_set(tmp_path):
    data = _task(tmp_path)
    task = ts.few_label_task(_args(tmp_path, data, num_labels=5, label_seed=3))
    lines = fileio.read_bytes(os.path.join(task, "polarity", "train.tsv")).decode().splitlines()
    assert lines[0] == "sentence\tlabel" and len(lines) == 6
    assert len(set(lines[1:])) == 5
    assert fileio.read_bytes(os.path.join(task, "polarity", "dev.tsv")) == \
        b"sentence\tlabel\ndev one\t1\n"
    again = ts.few_label_task(_args(tmp_path / "b", data, num_labels=5, label_seed=3))
    assert fileio.read_bytes(os.path.join(again, "polarity", "train.tsv")).decode() \
        .splitlines() == lines
    other = ts.few_label_task(_args(tmp_path / "c", data, num_labels=5, label_seed=4))
    assert fileio.read_bytes(os.path.join(other, "polarity", "train.tsv")).decode() \
        .splitlines() != lines


def test_more_labels_than_rows_is_one_line(tmp_path):
    data = _task(tmp_path, rows=4)
    with pytest.raises(ts.ExperimentError, match="--num_labels=5: the training split has 4"):
        ts.few_label_task(_args(tmp_path, data, num_labels=5))


def test_an_unknown_setting_is_refused(tmp_path):
    with pytest.raises(ts.ExperimentError, match="unknown.*nope"):
        _args(tmp_path, tmp_path, settings="none,nope")


def test_a_corpus_of_npm_text_not_written_yet_is_one_line(tmp_path, monkeypatch):
    """The `all` corpus reads npm_corpus.py's text from --npm_dir: missing, the error says
    which file and the command that writes it, and nothing is built."""
    args = _args(tmp_path, tmp_path, npm_dir=str(tmp_path / "npm"))
    vocab = tmp_path / "out" / "work" / "vocab" / "wordpiece4096" / "vocab.txt"
    write(str(vocab), "\n".join(f"piece{i}" for i in range(4093)) + "\n")
    ran = []
    monkeypatch.setattr(ts, "run_logged", lambda cmd, log: ran.append(cmd) or 0)
    with pytest.raises(ts.ExperimentError, match=r"^--npm_dir=.*/npm: no sotu\.txt \(write it "
                       r"with python experiments/npm_corpus.py --corpus=sotu "):
        ts._build(args, "sotu", 4096)
    assert ran == []
    write(str(tmp_path / "npm" / "sotu.txt"), "One sentence.\n")
    out = ts._build(args, "sotu", 4096)
    assert out.endswith("sotu-seq64-wp4096") and len(ran) == 1
    assert f"--input={tmp_path}/npm/sotu.txt" in ran[0] and f"--vocab_file={vocab}" in ran[0]
    assert ts.CORPORA["all"] == ["movies", "wiki", "sotu", "moby_dick"]


def test_the_table_marks_rows_against_the_no_pretraining_seeds():
    row = dict(what="w", corpus="movies", step=2000, pretrain_steps=2000,
               pretrain_seconds=300.0, flops=8e13, final_metrics={"disc_auc": 0.55,
                                                                   "mlm_acc": 0.17},
               train_losses=[0.5])
    results = {"num_labels": 500, "seeds": 3, "epochs": 10, "rows": [
        dict(row, setting="none", corpus=None, step=0, pretrain_seconds=None, flops=0.0,
             final_metrics={}, scores=[0.60, 0.62, 0.64]),
        dict(row, setting="low", scores=[0.50, 0.51, 0.52]),
        dict(row, setting="high", scores=[0.65, 0.66, 0.70]),
        dict(row, setting="mixed", scores=[0.55, 0.63, 0.70])]}
    table = ts.render(results, "cmd")
    lines = {line.split(":")[0].strip("| "): line for line in table.splitlines()
             if line.startswith("| ") and ":" in line}
    assert lines["low"].endswith("| 0.5100 (0.5000-0.5200) | below (none) |")
    assert lines["high"].endswith("| 0.6700 (0.6500-0.7000) | above (none) |")
    assert lines["mixed"].endswith("| within spread (none) |")
    assert "| 0.550 / 0.170 | 0.500 |" in lines["low"]
    assert "| BERT 30,522 | 2000 | 8.00e+13 / — | 0.550 / 0.170 |" in lines["low"]
    bert = dict(row, setting="bert", final_metrics={"main_lm_acc": 0.11}, scores=[0.5] * 3)
    table = ts.render(dict(results, rows=results["rows"] + [bert]), "cmd")
    assert "| — / 0.110 |" in [l for l in table.splitlines() if l.startswith("| bert")][0]
    assert lines["none"].endswith("| 0.6200 (0.6000-0.6400) | — |")
    learned = dict(row, setting="wp", vocab=4096, hardware_flops=5.5e13, scores=[0.6] * 3)
    table = ts.render(dict(results, rows=[learned]), "cmd")
    assert "| movies | learned 4,096 | 2000 | 8.00e+13 / 5.50e+13 |" in table


def test_a_row_is_judged_against_no_pretraining_of_its_own_shape():
    assert ts.baseline_of("electra_preset") == "none"
    assert ts.baseline_of("electra_wide_lr3e-4") == "none_wide"
    assert ts.baseline_of("electra_narrow_lr3e-4") == "none_narrow"
    assert ts.baseline_of("electra_wp4k_lr3e-4") == "none_wp4k"  # the same vocabulary
    row = dict(what="w", corpus="movies", step=1500, pretrain_steps=1500, flops=8e13,
               pretrain_seconds=1.0, final_metrics={}, train_losses=[])
    rows = [dict(row, setting="none", baseline="none", step=0, scores=[0.60, 0.62]),
            dict(row, setting="none_wide", baseline="none_wide", step=0, scores=[0.40, 0.42]),
            dict(row, setting="wide", baseline="none_wide", scores=[0.50, 0.51]),
            dict(row, setting="orphan", baseline="none_narrow", scores=[0.50, 0.51])]
    table = ts.render({"num_labels": 500, "seeds": 2, "epochs": 10, "rows": rows}, "cmd")
    lines = {l.split(":")[0].strip("| "): l for l in table.splitlines() if l.startswith("| ")}
    assert lines["wide"].endswith("| 0.5050 (0.5000-0.5100) | above (none_wide) |")
    assert lines["orphan"].endswith("| 0.5050 (0.5000-0.5100) | — |")
    assert lines["none_wide"].endswith("| — |")


def test_a_random_start_of_another_shape_gets_a_config_of_that_shape(tmp_path):
    from electra_tf import configs
    args = _args(tmp_path, tmp_path)
    assert ts.random_init_config(args, "none") == "tiny"
    path = ts.random_init_config(args, "none_wide")
    cfg = configs.load_config(path)
    tiny = configs.load_config("tiny")
    assert (cfg.model.hidden_size, cfg.model.num_attention_heads,
            cfg.model.intermediate_size, cfg.model.num_hidden_layers) == (256, 4, 1024, 2)
    assert cfg.model.embedding_size == tiny.model.embedding_size == 64
    assert cfg.train == tiny.train


def test_a_learned_vocabulary_sizes_the_model_and_tokenises_the_task(tmp_path):
    """A setting with a learned vocabulary: the random start's config has that many rows
    (counted from the vocab.txt the builder wrote), as the pre-training's overrides do."""
    from electra_tf import configs
    args = _args(tmp_path, tmp_path)
    vocab = tmp_path / "out" / "work" / "vocab" / "wordpiece4096" / "vocab.txt"
    write(str(vocab), "\n".join(f"piece{i}" for i in range(4093)) + "\n")
    assert ts.learned_vocab(args, 4096) == (str(vocab), 4093)
    assert ts.vocab_overrides(args, ts.SETTINGS["electra_wp4k_lr3e-4"]) == {
        "model.vocab_size": "4093"}
    assert ts.vocab_overrides(args, ts.SETTINGS["electra_preset"]) == {}
    cfg = configs.load_config(ts.random_init_config(args, "none_wp4k"))
    assert cfg.model.vocab_size == 4093
    assert cfg.model.hidden_size == configs.load_config("tiny").model.hidden_size


def test_the_regime_map_plots_each_setting_at_its_matmul_flops(tmp_path):
    from electra_tf import configs
    from electra_tf.pretraining import flops
    cfg = configs.load_config("tiny", {"optimizer.learning_rate": "3e-4",
                                       "train.max_seq_length": "64"})
    per_step = flops.count_config(cfg, flops.HARDWARE).train_per_step()["total"]
    old = {"setting": "electra_lr3e-4", "step": 1000, "scores": [0.55, 0.56, 0.57]}
    assert ts.matmul_flops(old) == pytest.approx(1000 * per_step)  # recomputed for old rows
    assert ts.matmul_flops(dict(old, hardware_flops=5e12)) == 5e12  # recorded ones kept
    assert ts.matmul_flops(dict(old, step=0)) == 0.0
    rows = [dict(old), dict(old, step=2000), {"setting": "none", "step": 0,
                                              "scores": [0.61, 0.62, 0.63]},
            {"setting": "none_wp4k", "step": 0, "scores": [0.61, 0.62, 0.63]}]
    path = tmp_path / "map.png"
    assert ts.plot(rows, ["none", "electra_lr3e-4", "none_wp4k", "not_run"], str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
