"""conversion.source: every kind of path resolved to its kind, ModelConfig and TF1-named
arrays; a damaged newest checkpoint falls back to the newest complete one; one error."""

import dataclasses
import logging as py_logging
import os

import numpy as np
import pytest
import tensorflow as tf

from electra_tf import fileio
from electra_tf.configs import ModelConfig
from electra_tf.conversion import formats, source
from electra_tf.conversion.formats import ConvertError
from electra_tf.model.modeling import (ElectraPretrainingModel, discriminator_variables,
                                       released_arrays)
from electra_tf.training import checkpoints

CFG = ModelConfig(vocab_size=60, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=2, intermediate_size=64, max_position_embeddings=24,
                  generator_hidden_size=0.5)


def _model(config=CFG, seed=3):
    model = ElectraPretrainingModel(config, heads=("mlm",))
    for i, w in enumerate(model.weights):
        w.assign(tf.random.stateless_normal(w.shape, [i, seed], stddev=0.05))
    return model


def _run(directory, config=CFG, steps=(1,)):
    """One of our pre-training runs: config.json and a training checkpoint per step (the
    weights change between steps)."""
    fileio.makedirs(str(directory))
    fileio.write_json_atomic(str(directory / "config.json"),
                             formats.pretraining_config(config).to_json())
    step = tf.Variable(0, dtype=tf.int64)
    model = _model(config)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, global_step=step),
                                         str(directory), max_to_keep=None)
    for n in steps:
        step.assign(n)
        model.electra.blocks[0].query.bias.assign_add(tf.fill([32], float(n)))
        manager.save(checkpoint_number=n)
    return model


def _value(model, path):
    return {v.path: v for v in model.weights}[path].numpy()


def test_our_run_and_a_ckpt_in_it(tmp_path):
    model = _run(tmp_path / "run")
    for path in (str(tmp_path / "run"), str(tmp_path / "run" / "ckpt-1")):
        src = source.resolve(path)
        assert src.kind == "model_dir" and src.path == str(tmp_path / "run" / "ckpt-1")
        assert src.config == CFG  # the run's config.json, not inferred
        assert src.config_file == str(tmp_path / "run" / "config.json")
        assert src.has_generator and not src.ignored
        assert src.shapes["generator/encoder/layer_0/attention/self/query/kernel"] == (16, 16)
        assert src.shapes["mlm_predictions/output_bias"] == (60,)
        assert int(src.read("global_step")) == 1
        arrays = src.arrays(["electra/embeddings/word_embeddings",
                             "generator_predictions/LayerNorm/gamma", "not/a/name"])
        assert sorted(arrays) == ["electra/embeddings/word_embeddings",
                                  "generator_predictions/LayerNorm/gamma"]
        for name, value in arrays.items():
            np.testing.assert_array_equal(value, _value(model, name))
        # every weight, nothing else but global_step
        assert set(src.shapes) == {v.path for v in model.trainable_variables} | {"global_step"}


def test_a_gdes_run_is_read_in_the_released_layout(tmp_path):
    config = dataclasses.replace(CFG, disentangled_embeddings=True)
    model = _run(tmp_path / "gdes", config)
    src = source.resolve(str(tmp_path / "gdes"))
    assert src.kind == "gdes" and src.config == config.released()
    assert not src.config.tie_embeddings and not src.config.disentangled_embeddings
    assert not [n for n in src.shapes if n.endswith("_delta")]
    folded = src.read("electra/embeddings/word_embeddings")
    np.testing.assert_array_equal(folded, released_arrays(model)[
        "electra/embeddings/word_embeddings"])
    np.testing.assert_allclose(folded, model.generator.embeddings.word_embeddings.numpy() +
                               model.embeddings.deltas[0].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(src.read("generator/embeddings/word_embeddings"),
                                  model.generator.embeddings.word_embeddings.numpy())


def test_tf1_checkpoints_exported_beside_a_run_or_alone(tmp_path):
    model = _run(tmp_path / "run")
    checkpoints.save_tf1_checkpoint(model, str(tmp_path / "run" / "discriminator" / "model.ckpt"),
                                    discriminator_variables(model))
    src = source.resolve(str(tmp_path / "run" / "discriminator"))
    assert src.kind == "tf1" and src.path.endswith("discriminator/model.ckpt")
    assert src.config == CFG and src.config_file == str(tmp_path / "run" / "config.json")
    assert not src.has_generator
    np.testing.assert_array_equal(src.read("electra/encoder/layer_1/output/dense/kernel"),
                                  _value(model, "electra/encoder/layer_1/output/dense/kernel"))
    # A released checkpoint with no run around it: the config is inferred from the shapes.
    prefix = checkpoints.save_tf1_checkpoint(model, str(tmp_path / "released" / "model.ckpt"))
    src = source.resolve(prefix, num_heads=2)
    assert src.kind == "tf1" and src.config_file is None
    assert (src.config.hidden_size, src.config.num_hidden_layers, src.config.generator_hidden,
            src.config.num_attention_heads) == (32, 2, 16, 2)
    assert src.has_generator
    assert source.resolve(prefix).config.num_attention_heads == 1  # hidden // 64
    # A config the caller knows wins.
    assert source.resolve(prefix, CFG).config == CFG


def test_a_hugging_face_directory(tmp_path):
    model = _model()
    d = formats.export_hf(released_arrays(model), CFG, str(tmp_path / "hf"))
    src = source.resolve(d)
    assert src.kind == "hf" and src.path == d and src.config_file == os.path.join(d, "config.json")
    assert (src.config.hidden_size, src.config.embedding_size, src.config.vocab_size) == (32, 16, 60)
    assert "discriminator_predictions.dense.weight" in src.ignored
    np.testing.assert_array_equal(src.read("electra/encoder/layer_0/attention/self/key/kernel"),
                                  _value(model, "electra/encoder/layer_0/attention/self/key/kernel"))


def test_a_damaged_newest_checkpoint_falls_back_and_nothing_moves(tmp_path, caplog):
    model = _run(tmp_path / "run", steps=(1, 2))
    data = tmp_path / "run" / "ckpt-2.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:100])
    before = sorted(os.listdir(tmp_path / "run"))
    with caplog.at_level(py_logging.WARNING):
        src = source.resolve(str(tmp_path / "run"), what="--init_checkpoint")
    assert src.path == str(tmp_path / "run" / "ckpt-1") and int(src.read("global_step")) == 1
    bias = "electra/encoder/layer_0/attention/self/query/bias"
    np.testing.assert_allclose(src.read(bias), _value(model, bias) - 2.0, rtol=1e-6)
    warnings = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(warnings) == 1 and str(tmp_path / "run" / "ckpt-2") in warnings[0]
    assert "ckpt-1" in warnings[0]
    assert sorted(os.listdir(tmp_path / "run")) == before  # read-only
    # Asked for by name, the damaged one is refused.
    with pytest.raises(ConvertError, match=r"ckpt-2: the checkpoint is damaged \(ckpt-2\.data"):
        source.resolve(str(tmp_path / "run" / "ckpt-2"))


def test_nothing_complete_and_nothing_at_all_are_one_error(tmp_path):
    _run(tmp_path / "run")
    (tmp_path / "run" / "ckpt-1.data-00000-of-00001").unlink()
    with pytest.raises(ConvertError, match=f"--init_checkpoint: no complete checkpoint in "
                                           f"{tmp_path / 'run'}: ckpt-1 \\(no ckpt-1.data"):
        source.resolve(str(tmp_path / "run"), what="--init_checkpoint")
    fileio.makedirs(str(tmp_path / "empty"))
    with pytest.raises(ConvertError, match=f"no checkpoint in directory {tmp_path / 'empty'}"):
        source.resolve(str(tmp_path / "empty"))
    nothing = str(tmp_path / "nothing")
    with pytest.raises(ConvertError) as e:
        source.resolve(nothing, what="--generator_checkpoint")
    assert str(e.value) == (f"--generator_checkpoint={nothing} does not exist (neither a "
                            f"directory nor a checkpoint prefix with {nothing}.index)")
