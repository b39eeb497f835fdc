"""electra_tf.pretraining.score: an ELECTRIC run's pseudo-log-likelihoods, from a real
(short) `objective=electric` pre-training run on the bundled sample."""

import os

import numpy as np
import pytest
import tensorflow as tf

import forked_cli
from electra_tf import fileio
from electra_tf.configs import load_config
from electra_tf.text import TextEncoder
from electra_tf.pretraining import pretrain, scoring
from electra_tf.training.options import PretrainingOptions
from electra_tf import DEFAULT_VOCAB

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = ["The cat sat on the mat.", "", "Mat the on sat cat the.",
         "a " * 40 + "long line", "   ", "Paris is the capital of France."]


@pytest.fixture(scope="module")
def electric_run(tmp_path_factory, sample_build):
    out = str(tmp_path_factory.mktemp("electric") / "run")
    cfg = load_config("tiny", {"objective.objective": "electric", "train_batch_size": "4",
                               "num_train_steps": "3", "save_checkpoints_steps": "3",
                               "steps_per_loop": "3", "log_every_steps": "3",
                               "warmup_steps": "0"})
    metrics = pretrain.run(cfg, PretrainingOptions(model_dir=out, train_data=sample_build[0],
                                           strategy="cpu"))
    return out, metrics


@pytest.mark.e2e
def test_an_electric_run_trains_in_the_compiled_step(electric_run):
    _, metrics = electric_run
    # A fresh cloze head is near uniform over the 30,522 pieces: -log q ~ ln V = 10.33.
    assert 9.5 < metrics["masked_lm_loss"] < 10.6
    # Every slot is labelled noise (~15% of the tokens, a sample equal to the original
    # included); noise logits ~ log(k / V) = -12.1 call every token data, so the BCE is
    # ~0.15 x 12 and the accuracy the share of data tokens.
    assert metrics["replaced_fraction"] == pytest.approx(0.15, abs=0.01)
    assert metrics["disc_accuracy"] == pytest.approx(1 - metrics["replaced_fraction"])
    assert 1.0 < metrics["disc_loss"] < 2.0


@pytest.mark.e2e
def test_scores_are_minus_the_summed_energies_of_the_text_pieces(electric_run, tmp_path):
    model_dir, _ = electric_run
    cfg, model, path = scoring.load_run(model_dir, objective="electric")
    assert path.endswith("ckpt-3")
    text = TextEncoder(DEFAULT_VOCAB)
    scorer = scoring.Scorer(model, text, max_seq_length=16, batch_size=2)
    kept = [t for t in TEXTS if t.strip()]
    scores, counts, truncated = scorer.score(kept)
    assert truncated.tolist() == [False, False, True, False]
    for i, t in enumerate(kept):
        pieces = text.tokenize(tf.constant([t])).flat_values.numpy()[:14]
        assert counts[i] == len(pieces)
        ids = np.zeros([1, 16], np.int32)
        ids[0, :len(pieces) + 2] = [101, *pieces, 102]
        mask = (np.arange(16) < len(pieces) + 2).astype(np.int32)[None]
        energies = model.discriminator(ids, mask, np.zeros_like(ids)).numpy()[0]
        assert scores[i] == pytest.approx(-energies[1:len(pieces) + 1].sum(), rel=1e-5)
    # The same sentence in any batch position scores alike.
    again, _, _ = scorer.score([kept[2], kept[0]])
    assert again[1] == pytest.approx(scores[0], rel=1e-6)


@pytest.mark.subprocess
@pytest.mark.e2e
def test_the_cli_writes_one_row_per_text_line(electric_run, tmp_path):
    model_dir, _ = electric_run
    src, out = tmp_path / "in.txt", tmp_path / "scores.tsv"
    src.write_text("\n".join(TEXTS) + "\n")
    proc = forked_cli.run(
        ["-m", "electra_tf.pretraining.score", f"--model_dir={model_dir}",
         f"--input={src}", f"--output={out}", "--max_seq_length=16"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert [r[0] for r in rows] == ["1", "3", "4", "6"]  # blank lines 2 and 5 skipped
    assert [r[3] for r in rows] == [t for t in TEXTS if t.strip()]
    assert [int(r[2]) for r in rows] == [7, 7, 14, 7]
    assert all(np.isfinite(float(r[1])) for r in rows)
    assert "1 of 4 texts are longer than 14 pieces" in proc.stderr


def test_errors_name_the_run(tmp_path):
    with pytest.raises(scoring.ScoreError, match="no config.json"):
        scoring.load_run(str(tmp_path), objective="electric")
    other = tmp_path / "electra_run"
    fileio.makedirs(str(other))
    fileio.write_json_atomic(str(other / "config.json"), load_config("tiny").to_json())
    with pytest.raises(scoring.ScoreError, match="objective electra, not electric"):
        scoring.load_run(str(other), objective="electric")
    with pytest.raises(scoring.ScoreError, match="no such file"):
        scoring.read_lines(str(tmp_path / "missing.txt"))
