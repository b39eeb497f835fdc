"""Fine-tuning model: heads, encoder initialisation, layer-wise learning rates."""

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.configs import ConfigError, ModelConfig, apply_overrides
from electra_tf.conversion.formats import ConvertError
from electra_tf.finetune import model as ft_model
from electra_tf.finetune.model import (FinetuningModel, InitError, init_encoder, layer_depth,
                                       layerwise_lr_multipliers, make_head)
from electra_tf.finetune.tasks import TsvTask, TaskData
from electra_tf.finetune.trainer import FinetuneConfig, Finetuner
from electra_tf.training.checkpoints import save_tf1_checkpoint
from electra_tf.model.modeling import ElectraPretrainingModel, discriminator_variables

CFG = ModelConfig(vocab_size=120, embedding_size=16, hidden_size=32, num_hidden_layers=3,
                  num_attention_heads=2, intermediate_size=64, max_position_embeddings=32)


def test_layer_depths_and_multipliers_follow_the_formula():
    model = FinetuningModel(CFG, make_head("classification", CFG, 2))
    d = 0.8
    for official_bug, top in ((False, 4), (True, 5)):
        mults = layerwise_lr_multipliers(model, d, official_bug)
        assert len(mults) == len(model.trainable_variables)
        for path, m in mults.items():
            if path.startswith("electra/embeddings"):  # embeddings and their projection
                depth = 0
            elif path.startswith("electra/encoder/layer_"):
                depth = int(path.split("/")[2].split("_")[1]) + 1
            else:
                assert path.startswith("task_specific/"), path
                depth = top
            assert m == pytest.approx(d ** (top - depth)), path
        top_layer = mults["electra/encoder/layer_2/output/dense/kernel"]
        # Correct: the top encoder layer gets decay^1; the official code's gap gives decay^2.
        assert top_layer == pytest.approx(d ** 2 if official_bug else d)
        assert mults["electra/embeddings/word_embeddings"] == pytest.approx(d ** top)
    assert layer_depth("electra/encoder/layer_11/output/dense/kernel", 12) == 12
    with pytest.raises(ValueError, match="no layer depth"):
        layer_depth("somewhere/else", 12)


def test_the_optimizer_is_make_optimizers_over_the_trial():
    """Fine-tuning builds the optimizer section as pre-training does: the official AdamW
    (no bias correction, fine-tuning's weight decay 0), warmup the configured share."""
    from electra_tf.training.optimization import AdamW
    task = TsvTask("t", ("sentence",), "label", labels=("0", "1"))
    cfg = apply_overrides(FinetuneConfig(), dict(learning_rate=1e-3, layerwise_lr_decay=0.5,
                                                 warmup_proportion=0.25))
    ft = Finetuner(task, CFG, cfg, tf.distribute.OneDeviceStrategy("/cpu:0"), 200, None, 3)
    opt = ft.optimizer
    assert type(opt) is AdamW and ft.clip_norm == 1.0
    assert opt.learning_rate_fn.get_config() == dict(
        learning_rate=1e-3, total_steps=200, warmup_steps=50, end_learning_rate=0.0, power=1.0)
    assert (opt.weight_decay, opt.beta_1, opt.beta_2, opt.epsilon,
            opt.bias_correction) == (0.0, 0.9, 0.999, 1e-6, False)


def test_optimizer_applies_the_layerwise_rates():
    # One AdamW step without bias correction moves each weight by about
    # lr * mult * 0.1 / sqrt(0.001) = 3.162 * lr * mult (|grad| >> epsilon, here 1e-12).
    task = TsvTask("t", ("sentence",), "label", labels=("0", "1"))
    cfg = apply_overrides(FinetuneConfig(), dict(learning_rate=1e-3, layerwise_lr_decay=0.5,
                                                 num_train_epochs=1, train_batch_size=4,
                                                 warmup_proportion=0.0, clip_norm=1e9,
                                                 epsilon=1e-12))
    ft = Finetuner(task, CFG, cfg, tf.distribute.OneDeviceStrategy("/cpu:0"), 1000, None, 3)
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(5, 120, (4, 8)).astype(np.int32),
             "input_mask": np.ones((4, 8), np.int32), "segment_ids": np.zeros((4, 8), np.int32),
             "label": np.array([0, 1, 1, 0], np.int32), "weight": np.ones(4, np.float32)}
    before = {v.path: v.numpy().copy() for v in ft.variables}
    iterator = iter(ft.train_dataset(TaskData(batch, 4), seed=1))
    ft.make_train_loop()(iterator, tf.constant(1))
    mults = dict((v.path, m) for v, m in ft.lr_multipliers)
    checked = 0
    for v in ft.variables:
        if v.path.endswith("key/bias"):
            continue  # softmax ignores it: its gradient is rounding noise
        step = np.abs(v.numpy() - before[v.path]).ravel()
        moved = step[step > 0]
        if moved.size < 4:
            continue
        assert np.median(moved) == pytest.approx(3.1623e-3 * mults[v.path], rel=0.01), v.path
        checked += 1
    assert checked >= 20
    assert int(ft.global_step.numpy()) == 1


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A pre-training model saved as an object checkpoint and as a TF1-named export."""
    tf.keras.utils.set_random_seed(5)
    model = ElectraPretrainingModel(CFG)
    d = tmp_path_factory.mktemp("pre")
    obj = tf.train.Checkpoint(model=model).write(str(d / "ckpt-7"))
    tf1 = save_tf1_checkpoint(model, str(d / "discriminator" / "model.ckpt"),
                              discriminator_variables(model))
    return model, obj, tf1


@pytest.mark.parametrize("which", ["obj", "tf1"])
def test_encoder_initialised_from_pretraining_checkpoints(pretrained, which):
    model, obj, tf1 = pretrained
    ft = FinetuningModel(CFG, make_head("classification", CFG, 3))
    init_encoder(ft.electra, obj if which == "obj" else tf1)
    source = {v.path: v.numpy() for v in model.electra.trainable_variables}
    assert len(ft.electra.trainable_variables) == len(source) == 7 + 3 * 16
    for v in ft.electra.trainable_variables:
        np.testing.assert_array_equal(v.numpy(), source[v.path])


def test_encoder_initialised_from_a_gdes_training_checkpoint(tmp_path):
    """A GDES run's ckpt-N holds the generator's tables and the discriminator's deltas:
    the encoder gets the folded tables (what its exports write) and computes what the
    pre-training discriminator does."""
    import dataclasses
    cfg = dataclasses.replace(CFG, disentangled_embeddings=True)
    tf.keras.utils.set_random_seed(6)
    model = ElectraPretrainingModel(cfg)
    for i, delta in enumerate(model.embeddings.deltas):
        delta.assign(tf.random.stateless_normal(delta.shape, [i, 3], stddev=0.05))
    prefix = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt-3"))
    ft = FinetuningModel(cfg, make_head("classification", cfg, 2))
    assert init_encoder(ft.electra, prefix) == prefix
    ids = np.random.default_rng(1).integers(5, 120, (2, 12)).astype(np.int32)
    mask, seg = np.ones_like(ids), np.zeros_like(ids)
    np.testing.assert_allclose(ft.electra(ids, mask, seg).numpy(),
                               model.discriminator_hidden(ids, mask, seg).numpy(), atol=1e-5)
    word = {v.path: v for v in ft.electra.trainable_variables}[
        "electra/embeddings/word_embeddings"].numpy()
    np.testing.assert_allclose(word, model.generator.embeddings.word_embeddings.numpy() +
                               model.embeddings.deltas[0].numpy(), rtol=1e-6)


def test_init_errors_name_the_checkpoint(tmp_path, pretrained):
    ft = FinetuningModel(CFG, make_head("classification", CFG, 2))
    with pytest.raises(ConvertError, match="no checkpoint in directory"):
        init_encoder(ft.electra, str(tmp_path))
    with pytest.raises(ConvertError, match="nope does not exist"):
        init_encoder(ft.electra, str(tmp_path / "nope"))
    wider = ModelConfig(**{**CFG.__dict__, "hidden_size": 64, "intermediate_size": 128})
    other = FinetuningModel(wider, make_head("classification", wider, 2))
    with pytest.raises(InitError, match=r"electra/embeddings_project/kernel.*\[16, 32\]"):
        init_encoder(other.electra, pretrained[2])


def test_init_and_config_from_ram_checkpoints(pretrained, tmp_path, monkeypatch):
    """The pre-training checkpoints on TensorFlow's in-memory filesystem: a TF1 prefix, an
    object-based prefix, a model_dir (its `checkpoint` state file) and the config.json
    found beside them; errors name the path; nothing local named after it appears."""
    import os
    import uuid

    from electra_tf import fileio
    from electra_tf.conversion import formats
    from electra_tf.finetune.cli import find_config
    model, obj, tf1 = pretrained
    monkeypatch.chdir(tmp_path)
    root = f"ram://init_{uuid.uuid4().hex}"
    fileio.makedirs(f"{root}/pre/discriminator")
    fileio.makedirs(f"{root}/run")
    fileio.makedirs(f"{root}/empty")
    fileio.copy_tree(os.path.dirname(obj), f"{root}/pre")
    saved = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), f"{root}/run",
                                       max_to_keep=1).save(checkpoint_number=3)
    assert saved == f"{root}/run/ckpt-3"
    fileio.write_json_atomic(f"{root}/run/config.json",
                             formats.pretraining_config(CFG).to_json())
    source = {v.path: v.numpy() for v in model.electra.trainable_variables}
    for path, used in [(f"{root}/pre/discriminator/model.ckpt",) * 2,
                       (f"{root}/pre/ckpt-7",) * 2, (f"{root}/run", saved)]:
        ft = FinetuningModel(CFG, make_head("classification", CFG, 2))
        assert init_encoder(ft.electra, path) == used
        assert len(ft.electra.trainable_variables) == len(source) == 7 + 3 * 16
        for v in ft.electra.trainable_variables:
            np.testing.assert_array_equal(v.numpy(), source[v.path])
    assert find_config(f"{root}/run", None) == CFG
    assert find_config(saved, None) == CFG
    with pytest.raises(ConfigError, match=f"no config.json found near --init_checkpoint="
                                        f"{root}/pre/ckpt-7"):
        find_config(f"{root}/pre/ckpt-7", None)
    with pytest.raises(ConvertError, match=f"{root}/nope does not exist"):
        init_encoder(ft.electra, f"{root}/nope")
    with pytest.raises(ConvertError, match=f"no checkpoint in directory {root}/empty"):
        init_encoder(ft.electra, f"{root}/empty")
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith("ram:")]


def test_qa_answer_mask_and_head_shapes():
    batch = {"input_ids": tf.ones([2, 8], tf.int32),
             "input_mask": tf.constant([[1] * 8, [1] * 6 + [0] * 2]),
             "segment_ids": tf.constant([[0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 0, 0]])}
    mask = ft_model.answer_mask(batch).numpy()
    # [CLS] allowed, question and final [SEP] and padding not.
    assert mask.tolist() == [[1, 0, 0, 1, 1, 1, 1, 0], [1, 0, 1, 1, 1, 0, 0, 0]]
    model = FinetuningModel(CFG, make_head("qa", CFG, beam=3, answerable=True))
    out = model(batch, training=False)
    assert out["start_top_index"].shape == (2, 3)
    assert out["end_top_log_probs"].shape == (2, 3, 3)
    assert out["null_logit"].shape == (2,)
    allowed = {0, 3, 4, 5, 6}
    assert set(out["start_top_index"].numpy()[0]) <= allowed
    assert set(out["end_top_index"].numpy()[0].ravel()) <= allowed
    # log-probabilities over the allowed positions only
    assert np.all(out["start_top_log_probs"].numpy() <= 0)
