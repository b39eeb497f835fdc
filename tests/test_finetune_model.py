"""Fine-tuning model: heads, encoder initialisation (from our checkpoints and from Hugging
Face `transformers` directories, BERT and ELECTRA), layer-wise learning rates."""

import json
import logging as py_logging
import os

import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import save_file

from electra_tf.configs import ConfigError, ModelConfig, apply_overrides
from electra_tf.conversion import formats, source
from electra_tf.conversion.formats import ConvertError
from electra_tf.finetune import model as ft_model
from electra_tf.finetune.cli import find_config
from electra_tf.finetune.model import (FinetuningModel, ModelMismatchError, init_encoder,
                                       layer_depth, layerwise_lr_multipliers, make_head)
from electra_tf.finetune.tasks import TsvTask, TaskData
from electra_tf.finetune.trainer import FinetuneConfig, train_dataset
from runtimes import tf_finetuner
from electra_tf.training.checkpoints import save_tf1_checkpoint
from electra_tf.model.modeling import (ElectraPretrainingModel, discriminator_variables,
                                       released_arrays, tf1_variables)

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
    from electra_tf.training.tf_runtime.optimizer import AdamW
    task = TsvTask("t", ("sentence",), "label", labels=("0", "1"))
    cfg = apply_overrides(FinetuneConfig(), dict(learning_rate=1e-3, layerwise_lr_decay=0.5,
                                                 warmup_proportion=0.25))
    ft = tf_finetuner(task, CFG, cfg, tf.distribute.OneDeviceStrategy("/cpu:0"), 200, None, 3)
    opt = ft.optimizer
    assert type(opt) is AdamW and ft.clip_norm == 1.0
    assert opt.learning_rate_fn.get_config() == dict(
        learning_rate=1e-3, total_steps=200, warmup_steps=50, end_learning_rate=0.0, power=1.0)
    h = opt.hyper
    assert (h.kind, h.weight_decay, h.beta_1, h.beta_2, h.epsilon,
            h.bias_correction) == ("adamw", 0.0, 0.9, 0.999, 1e-6, False)


def test_optimizer_applies_the_layerwise_rates():
    # One AdamW step without bias correction moves each weight by about
    # lr * mult * 0.1 / sqrt(0.001) = 3.162 * lr * mult (|grad| >> epsilon, here 1e-12).
    task = TsvTask("t", ("sentence",), "label", labels=("0", "1"))
    cfg = apply_overrides(FinetuneConfig(), dict(learning_rate=1e-3, layerwise_lr_decay=0.5,
                                                 num_train_epochs=1, train_batch_size=4,
                                                 warmup_proportion=0.0, clip_norm=1e9,
                                                 epsilon=1e-12))
    ft = tf_finetuner(task, CFG, cfg, tf.distribute.OneDeviceStrategy("/cpu:0"), 1000, None, 3)
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(5, 120, (4, 8)).astype(np.int32),
             "input_mask": np.ones((4, 8), np.int32), "segment_ids": np.zeros((4, 8), np.int32),
             "label": np.array([0, 1, 1, 0], np.int32), "weight": np.ones(4, np.float32)}
    before = {v.path: v.numpy().copy() for v in ft.variables}
    iterator = iter(train_dataset(ft, TaskData(batch, 4), seed=1))
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
    want = {v.path: v.numpy() for v in model.electra.trainable_variables}
    assert len(ft.electra.trainable_variables) == len(want) == 7 + 3 * 16
    for v in ft.electra.trainable_variables:
        np.testing.assert_array_equal(v.numpy(), want[v.path])


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
    with pytest.raises(ModelMismatchError,
                       match=r"electra/embeddings_project/kernel is \[16, 32\] in the check"):
        init_encoder(other.electra, pretrained[2])


def test_init_and_config_from_ram_checkpoints(pretrained, tmp_path, monkeypatch):
    """The pre-training checkpoints on TensorFlow's in-memory filesystem: a TF1 prefix, an
    object-based prefix, a model_dir (its `checkpoint` state file) and the config.json
    found beside them; errors name the path; nothing local named after it appears."""
    import uuid

    from electra_tf import fileio
    from electra_tf.conversion import formats
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
    want = {v.path: v.numpy() for v in model.electra.trainable_variables}
    for path, used in [(f"{root}/pre/discriminator/model.ckpt",) * 2,
                       (f"{root}/pre/ckpt-7",) * 2, (f"{root}/run", saved)]:
        ft = FinetuningModel(CFG, make_head("classification", CFG, 2))
        assert init_encoder(ft.electra, path) == used
        assert len(ft.electra.trainable_variables) == len(want) == 7 + 3 * 16
        for v in ft.electra.trainable_variables:
            np.testing.assert_array_equal(v.numpy(), want[v.path])
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


# -------------------------------------------------------------- Hugging Face directories

H, L, I, V, P, T = 32, 2, 48, 40, 20, 2
BERT_CONFIG = {"architectures": ["BertForPreTraining"], "model_type": "bert",
               "vocab_size": V, "hidden_size": H, "num_hidden_layers": L,
               "num_attention_heads": 2, "intermediate_size": I, "hidden_act": "gelu",
               "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
               "max_position_embeddings": P, "type_vocab_size": T,
               "initializer_range": 0.02, "layer_norm_eps": 1e-12}
HEADS = ["bert.pooler.dense.weight", "bert.pooler.dense.bias",
         "cls.predictions.bias", "cls.predictions.transform.dense.weight",
         "cls.predictions.transform.dense.bias", "cls.predictions.transform.LayerNorm.weight",
         "cls.predictions.transform.LayerNorm.bias", "cls.predictions.decoder.weight",
         "cls.seq_relationship.weight", "cls.seq_relationship.bias"]


def bert_tensors(prefix="bert.", old_ln=False, seed=0):
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    w, b = ("gamma", "beta") if old_ln else ("weight", "bias")
    t = {f"{prefix}embeddings.word_embeddings.weight": r(V, H),
         f"{prefix}embeddings.position_embeddings.weight": r(P, H),
         f"{prefix}embeddings.token_type_embeddings.weight": r(T, H),
         f"{prefix}embeddings.LayerNorm.{w}": r(H), f"{prefix}embeddings.LayerNorm.{b}": r(H)}
    for i in range(L):
        p = f"{prefix}encoder.layer.{i}."
        for d in ("attention.self.query", "attention.self.key", "attention.self.value",
                  "attention.output.dense"):
            t[p + d + ".weight"], t[p + d + ".bias"] = r(H, H), r(H)
        t[p + "intermediate.dense.weight"], t[p + "intermediate.dense.bias"] = r(I, H), r(I)
        t[p + "output.dense.weight"], t[p + "output.dense.bias"] = r(H, I), r(H)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[f"{p}{ln}.{w}"], t[f"{p}{ln}.{b}"] = r(H), r(H)
    if prefix:
        t["bert.pooler.dense.weight"], t["bert.pooler.dense.bias"] = r(H, H), r(H)
        t["cls.predictions.bias"] = r(V)
        t["cls.predictions.transform.dense.weight"] = r(H, H)
        t["cls.predictions.transform.dense.bias"] = r(H)
        t["cls.predictions.transform.LayerNorm.weight"] = r(H)
        t["cls.predictions.transform.LayerNorm.bias"] = r(H)
        t["cls.predictions.decoder.weight"] = t[f"{prefix}embeddings.word_embeddings.weight"]
        t["cls.seq_relationship.weight"], t["cls.seq_relationship.bias"] = r(2, H), r(2)
    return t


def write_hf(d, tensors, config=BERT_CONFIG):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              os.path.join(d, "model.safetensors"))
    return str(d)


def tf1_to_bert(name: str, prefix="bert.") -> str:
    """Independent of formats.py: the expected BERT name of one of our TF1 names."""
    rest = name.split("/", 1)[1]
    rest = rest.replace("/gamma", "/weight").replace("/beta", "/bias").replace(
        "/kernel", "/weight")
    if rest.endswith("_embeddings"):
        rest += "/weight"
    rest = rest.replace("encoder/layer_", "encoder/layer/")
    return prefix + rest.replace("/", ".")


def encoder_arrays(ft):
    return {name: v.numpy() for name, v in tf1_variables(ft.electra).items()}


@pytest.mark.parametrize("prefix,old_ln", [("bert.", False), ("bert.", True), ("", False)])
def test_bert_dir_initialises_every_encoder_weight(tmp_path, prefix, old_ln, caplog):
    tensors = bert_tensors(prefix, old_ln)
    d = write_hf(tmp_path / "bert", tensors)
    config = find_config(d, None)  # no --config needed
    assert (config.hidden_size, config.embedding_size, config.num_hidden_layers,
            config.num_attention_heads, config.intermediate_size, config.vocab_size,
            config.max_position_embeddings, config.type_vocab_size) == (H, H, L, 2, I, V, P, T)
    ft = FinetuningModel(config, make_head("classification", config, 3))
    assert ft.electra.embeddings_project is None
    with caplog.at_level(py_logging.INFO, logger="absl"):
        assert init_encoder(ft.electra, d) == d
    ignored = source.resolve(d).ignored
    got = encoder_arrays(ft)
    assert len(got) == 5 + 16 * L
    for name, value in got.items():
        key = tf1_to_bert(name, prefix)
        if old_ln:
            key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
                "LayerNorm.bias", "LayerNorm.beta")
        src = tensors[key]
        np.testing.assert_array_equal(value, src.T if name.endswith("/kernel") else src)
    assert ignored == sorted(HEADS if prefix else [])
    if prefix:
        assert "bert.pooler.dense.weight" in caplog.text and "cls.seq_relationship" in caplog.text


def test_bert_dir_errors_are_one_line(tmp_path):
    tensors = bert_tensors()
    config = formats.hf_model_config(BERT_CONFIG)
    ft = FinetuningModel(config, make_head("classification", config, 2))
    bad_act = write_hf(tmp_path / "relu", tensors, {**BERT_CONFIG, "hidden_act": "relu"})
    for call in (lambda: find_config(bad_act, None), lambda: init_encoder(ft.electra, bad_act)):
        with pytest.raises(ConvertError, match="hidden_act 'relu' is not supported") as e:
            call()
        assert "\n" not in str(e.value)
    bad_shape = dict(tensors)
    bad_shape["bert.encoder.layer.1.intermediate.dense.weight"] = np.zeros((I + 1, H), np.float32)
    d = write_hf(tmp_path / "shape", bad_shape)
    with pytest.raises(ConvertError, match=r"layer\.1\.intermediate\.dense\.weight has shape "
                                        r"\[49, 32\], config.json implies \[48, 32\]") as e:
        init_encoder(ft.electra, d)
    assert "\n" not in str(e.value)
    # The config and the model disagree (e.g. a wrong --config): a shape error too.
    wider = ModelConfig(**{**config.__dict__, "intermediate_size": 64})
    other = FinetuningModel(wider, make_head("classification", wider, 2))
    with pytest.raises(ModelMismatchError, match=r"intermediate/dense/kernel is \[32, 48\] "
                                                 r"in the checkpoint but \[32, 64\] in"):
        init_encoder(other.electra, write_hf(tmp_path / "ok", tensors))
    missing = {k: v for k, v in tensors.items() if "layer.1.output.dense.bias" not in k}
    with pytest.raises(ConvertError, match=r"encoder\.layer\.1\.output\.dense\.bias .*not in"):
        init_encoder(ft.electra, write_hf(tmp_path / "missing", missing))
    torch_only = tmp_path / "torch"
    torch_only.mkdir()
    (torch_only / "config.json").write_text(json.dumps(BERT_CONFIG))
    (torch_only / "pytorch_model.bin").write_bytes(b"\0")
    with pytest.raises(ConvertError, match="pytorch_model.bin.*convert it to model.safetensors"):
        init_encoder(ft.electra, str(torch_only))
    roberta = write_hf(tmp_path / "roberta", tensors, {**BERT_CONFIG, "model_type": "roberta"})
    with pytest.raises(ConvertError, match="model_type 'roberta' is not electra or bert"):
        find_config(roberta, None)


def test_exported_electra_dir_initialises_the_finetuning_encoder(tmp_path):
    config = ModelConfig(vocab_size=50, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=24, type_vocab_size=2,
                         generator_hidden_size=0.5)
    model = ElectraPretrainingModel(config)
    arrays = released_arrays(model)
    d = formats.export_hf(arrays, config, str(tmp_path / "electra"))
    found = find_config(d, None)
    assert found == config.__class__(**{**config.__dict__, "generator_hidden_size": 0.25})
    ft = FinetuningModel(found, make_head("classification", found, 2))
    assert init_encoder(ft.electra, d) == d
    ignored = source.resolve(d).ignored
    assert ignored == sorted(k for k in formats.hf_name_map(config, "discriminator").values()
                             for k in [k[0]] if k.startswith("discriminator_predictions."))
    got = encoder_arrays(ft)
    assert "electra/embeddings_project/kernel" in got and len(got) == 7 + 16 * 2
    for name, value in got.items():
        np.testing.assert_array_equal(value, arrays[name])
