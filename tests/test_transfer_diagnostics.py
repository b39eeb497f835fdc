"""experiments/transfer_diagnostics.py: the loading report, the attention and input-dependence
statistics, on a tiny fine-tuning model."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import finetune_tiny_model
from electra_tf.finetune.model import FinetuningModel, make_head
import experiment_scripts

td = experiment_scripts.load("transfer_diagnostics")


@pytest.fixture
def model():
    tf.keras.utils.set_random_seed(1)
    config = finetune_tiny_model()
    return FinetuningModel(config, make_head("classification", config, 2))


def _batch(rows=8, length=12, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 5000, size=(rows, length)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[:, length // 2 + rng.integers(0, length // 2):] = 0
    ids[:, 0] = 101
    return {"input_ids": tf.constant(ids * mask), "input_mask": tf.constant(mask),
            "segment_ids": tf.zeros_like(tf.constant(ids))}


def test_input_dependence_of_orthogonal_and_constant_features():
    two = td.input_dependence(np.array([[1.0, 0.0], [0.0, 1.0]]))
    assert two["input_dependent_share"] == pytest.approx(0.5)
    assert two["mean_cosine"] == pytest.approx(0.0)
    same = td.input_dependence(np.array([[3.0, 4.0]] * 4))
    assert same["input_dependent_share"] == pytest.approx(0.0)
    assert same["mean_cosine"] == pytest.approx(1.0)


def test_the_loading_report_counts_equal_differing_and_missing_variables(model):
    arrays = {v.path: v.numpy() for v in model.electra.trainable_variables}
    arrays["generator/encoder/layer_0/output/dense/bias"] = np.zeros(3)
    arrays["electra/encoder/layer_0/output/dense/bias/adam_m"] = np.zeros(3)  # a slot
    arrays["global_step"] = np.int64(5)
    changed = "electra/encoder/layer_0/attention/self/query/kernel"
    arrays[changed] = arrays[changed] + 1.0
    dropped = "electra/embeddings/LayerNorm/gamma"
    del arrays[dropped]
    report = td.loading_report(model, arrays)
    n = len(model.electra.trainable_variables)
    assert report["encoder_variables"] == n and report["equal"] == n - 2
    assert report["differ"] == [changed] and report["missing"] == [dropped]
    assert report["checkpoint_roots_not_loaded"] == ["generator"]
    assert report["checkpoint_weights"] == n - 1 + 1


def test_a_fresh_model_attends_uniformly_and_sharpened_queries_collapse_it(model):
    batch = _batch()
    fresh = td.forward_stats(model.electra, batch)["layers"]
    block = [layer for layer in fresh if layer["layer"] == "layer_0"][0]
    assert block["attention_entropy"] > 0.99
    assert block["rms"] == pytest.approx(1.0, abs=1e-3)  # a LayerNorm output, gamma 1
    assert block["ln_gamma_output"] == pytest.approx(1.0)
    query = model.electra.blocks[0].query.kernel
    query.assign(query * 2000.0)
    sharp = td.forward_stats(model.electra, batch)["layers"]
    block = [layer for layer in sharp if layer["layer"] == "layer_0"][0]
    assert block["attention_entropy"] < 0.5
    assert block["max_abs_qk_logit"] > 100 * fresh[-1]["max_abs_qk_logit"]


def test_gradients_are_grouped_by_layer(model):
    batch = _batch(rows=4)
    grads = td.head_gradients(model, batch, np.array([0, 1, 0, 1], np.int32))
    assert set(grads) == {"embeddings", "embeddings_project", "layer_0", "head", "loss"}
    assert grads["loss"] == pytest.approx(np.log(2.0), abs=0.05)  # a fresh 2-way head
    assert all(v > 0 for v in grads.values())


def test_word_table_features_average_the_rows_of_real_tokens(model):
    batch = _batch(rows=3)
    table = model.electra.embeddings.word_embeddings.numpy()
    got = td.word_table_features(model.electra, batch)
    ids, mask = batch["input_ids"].numpy(), batch["input_mask"].numpy()
    for row in range(3):
        real = ids[row][mask[row] == 1]
        np.testing.assert_allclose(got[row], table[real].mean(0), rtol=1e-5, atol=1e-7)
