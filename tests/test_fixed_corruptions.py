"""experiments/fixed_corruptions.py on tiny random models: the draw, the scores, the CLI."""

import io
import json

import numpy as np
import pytest
import tensorflow as tf

from conftest import VOCAB, WIKI
from electra_tf import configs, fileio
from electra_tf.model.modeling import ElectraPretrainingModel
from electra_tf.pretraining import objectives
from ram_paths import forget
import experiment_scripts

LENGTH = 32
SMALL = {"train.max_seq_length": LENGTH}


fc = experiment_scripts.load("fixed_corruptions")


def _run_dir(path, overrides=None):
    """A run directory (config.json + ckpt-1) of a tiny model with random weights."""
    cfg = configs.load_config("tiny", {**SMALL, **(overrides or {})})
    model = ElectraPretrainingModel(
        cfg.model, heads=objectives.OBJECTIVES[cfg.objective.objective].heads)
    for i, w in enumerate(model.weights):
        w.assign(tf.random.stateless_normal(w.shape, [i, 7], stddev=0.05))
    fileio.makedirs(str(path))
    fileio.write_json_atomic(str(path / "config.json"), cfg.to_json())
    tf.train.Checkpoint(model=model).save(str(path / "ckpt"))
    return str(path)


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """(eval shard, judge run, corruptions path, metadata): a small build of the sample
    (length 32, 2 shards; the second is the held-out one) corrupted by a random judge."""
    from tfrecord_builder.build import BuildConfig, build
    root = tmp_path_factory.mktemp("fixed_corruptions")
    corpus = root / "corpus.txt"
    with open(WIKI, encoding="utf-8") as f:
        corpus.write_text(f.read(40_000), encoding="utf-8")
    data = root / "data"
    manifest = build(BuildConfig(output_dir=str(data), inputs=(str(corpus),),
                                 vocab_file=VOCAB, max_seq_length=LENGTH, num_shards=2,
                                 num_workers=1))
    shard = str(data / manifest["shards"][-1]["name"])
    judge_dir = _run_dir(root / "judge")
    out = str(root / "corruptions.npz")
    meta = fc.draw(judge_dir, shard, out, num_batches=6, batch_size=16, seed=3)
    return shard, judge_dir, out, meta


def _arrays(path):
    with np.load(io.BytesIO(fileio.read_bytes(path))) as f:
        return {k: f[k] for k in f.files}


def test_auc_helper_is_exact():
    assert fc.auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert fc.auc([0.5, 0.5, 0.5], [0, 1, 0]) == pytest.approx(0.5)  # ties count half
    assert fc.auc([0.1, 0.2, 0.9, 0.9], [0, 1, 1, 0]) == pytest.approx(0.625)
    assert fc.auc([3.0, 1.0], [1, 0]) == 1.0 and fc.auc([1.0, 3.0], [1, 0]) == 0.0
    assert fc.auc([0.1, 0.2], [1, 1]) is None
    rng = np.random.default_rng(0)
    s, y = rng.normal(size=500).round(1), rng.integers(0, 2, 500)
    from sklearn.metrics import roc_auc_score
    assert fc.auc(s, y) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_fit_threshold_maximises_accuracy():
    s, y = np.array([0.1, 0.2, 0.3, 0.7, 0.8, 0.9]), np.array([0, 0, 1, 0, 1, 1])
    t = fc.fit_threshold(s, y)
    assert 0.7 <= t < 0.8  # 5 of 6 right; 0.25 is as good, the higher t is kept
    assert fc.fit_threshold([0.1, 0.2], [0, 0]) >= 0.2  # all kept: nothing above
    assert fc.fit_threshold([0.1, 0.2], [1, 1]) < 0.1


@pytest.mark.slow
def test_draw_is_deterministic_and_labels_match(drawn, capsys):
    shard, judge_dir, out, meta = drawn
    a = _arrays(out)
    assert meta["num_batches"] == 6 and a["input_ids"].shape == (96, LENGTH)
    real = a["input_mask"] > 0
    differs = a["input_ids"] != a["original_ids"]
    np.testing.assert_array_equal(a["labels"] > 0, differs & real)
    assert not (differs & (a["masked"] == 0)).any()  # replacements only at masked slots
    assert not (a["masked"] > 0)[~real].any()
    originals = a["original_ids"][a["masked"] > 0]
    assert not np.isin(originals, [0, 101, 102, 103]).any()  # no special token masked
    # a random generator almost never samples the original token
    assert meta["replaced_share"] > 0.5 and meta["masked"] > 0
    assert meta["replaced"] == int(a["labels"].sum())
    assert json.loads(str(a["metadata"]))["seed"] == 3
    # the same draw again, through the CLI, to an in-memory filesystem
    ram = "ram://fixed_corruptions_test/again.npz"
    try:
        assert fc.main(["draw", f"--judge={judge_dir}", f"--eval_data={shard}",
                        f"--out={ram}", "--num_batches=6", "--batch_size=16",
                        "--seed=3"]) == 0
        assert json.loads(capsys.readouterr().out)["tokens"] == meta["tokens"]
        b = _arrays(ram)
        for key in fc.ARRAYS:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        assert fc.judge(ram, config="tiny", overrides=SMALL)["tokens"] == meta["tokens"]
    finally:
        forget("ram://fixed_corruptions_test")
    other = fc.draw(judge_dir, shard, out + ".seed4.npz", num_batches=6, batch_size=16,
                    seed=4)
    c = _arrays(out + ".seed4.npz")
    np.testing.assert_array_equal(a["original_ids"], c["original_ids"])  # same data
    assert (a["input_ids"] != c["input_ids"]).any() and other["seed"] == 4


def test_random_model_is_at_chance(drawn):
    _, _, out, meta = drawn
    r = fc.judge(out, config="tiny", overrides=SMALL)
    assert r["score_kind"] == "discriminator" and r["objective"] == "electra"
    assert r["tokens"] == meta["tokens"] and r["replaced"] == meta["replaced"]
    assert r["fit_tokens"] + r["eval_tokens"] == r["tokens"]
    assert abs(r["auc"] - 0.5) < 0.1
    assert 0.0 <= r["accuracy"] <= 1.0
    assert r["fitted_accuracy"] >= r["majority_accuracy"] - 0.005
    # a fixed initialisation: the same baseline twice
    assert fc.judge(out, config="tiny", overrides=SMALL)["auc"] == r["auc"]


def test_kept_slots_are_scored_at_masked(drawn, tmp_path):
    """Masked slots whose sample equals the original (label 0) make the AUC at the masked
    positions defined; a random generator draws none, so they are put in by hand."""
    _, judge_dir, out, meta = drawn
    a = _arrays(out)
    slots = np.argwhere(a["masked"] > 0)[::3]  # every third slot keeps its token
    a["input_ids"][tuple(slots.T)] = a["original_ids"][tuple(slots.T)]
    a["labels"][tuple(slots.T)] = 0
    buffer = io.BytesIO()
    np.savez(buffer, **a)
    kept = str(tmp_path / "kept.npz")
    fileio.write_atomic(kept, buffer.getvalue())
    r = fc.judge(kept, model_dir=judge_dir)
    assert r["masked"] == meta["masked"] and r["replaced"] == meta["replaced"] - len(slots)
    assert 0.0 <= r["replaced_auc_at_masked"] <= 1.0
    assert fc.judge(out, model_dir=judge_dir)["replaced_auc_at_masked"] is None
    assert r["checkpoint"] == meta["checkpoint"]


def test_electric_and_mlm_runs_get_their_scores(drawn, tmp_path):
    _, _, out, _ = drawn
    for objective, kind in (("electric", "energy"), ("mlm", "mlm"),
                            ("all_tokens_mlm", "copy_mlm")):
        run = _run_dir(tmp_path / objective, {"objective.objective": objective})
        r = fc.judge(out, model_dir=run)
        assert r["score_kind"] == kind and r["objective"] == objective, r
        assert r["accuracy"] is None and 0.0 <= r["auc"] <= 1.0
        assert r["checkpoint"].endswith("ckpt-1") and r["fitted_accuracy"] is not None


def test_cli_errors_are_one_line(drawn, tmp_path, capsys):
    _, judge_dir, out, _ = drawn
    cases = [(["score", f"--corruptions={tmp_path / 'none.npz'}", "--config=tiny"],
              "none.npz"),
             (["score", f"--corruptions={out}", f"--model_dir={tmp_path}"], "config.json"),
             (["score", f"--corruptions={out}"], "--model_dir"),
             (["score", f"--corruptions={out}", f"--model_dir={judge_dir}",
               f"--checkpoint={judge_dir}/ckpt-9"], "ckpt-9"),
             (["draw", f"--judge={judge_dir}", f"--eval_data={tmp_path / 'x*.tfrecord'}",
               f"--out={tmp_path / 'o.npz'}"], "x*.tfrecord")]
    for argv, needle in cases:
        assert fc.main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("fixed_corruptions: error:") and "\n" not in err, err
        assert needle in err, err
